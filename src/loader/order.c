/*
 * The loader's sample order: a pure function of (dataset shape, seed,
 * epoch, window, node count), never of the ranks within a node or the
 * worker count.
 *
 *   1. The shards are permuted (seeded by seed and epoch) and their records
 *      concatenated in that order: the sequence S.  With several nodes, S is
 *      cut by records into one contiguous range a node (node k of K:
 *      [k N / K, (k + 1) N / K)), so a node's range holds whole shards but
 *      for the two at its ends.
 *   2. A node's range is cut into chunks of `chunk` consecutive records, and
 *      the whole chunks are permuted by a keyed bijection (a partial last
 *      chunk stays last): the node's sequence M.
 *   3. M is cut into windows of `window` consecutive records (a multiple of
 *      the chunk); inside each window the records are permuted by a keyed
 *      bijection.
 *
 * With one node, its range is S and its keys are the order's: the order
 * sluice always gave.  A window is a few runs of neighbouring records (its
 * chunks), so a loader that reads a window whole reads sequentially, while
 * the chunks come from all over the node's range: a batch mixes window /
 * chunk places of it, not one or two shards, which matters when shards were
 * written in some order (by class, by source).  The order inside a window
 * is a full permutation of it.  Position p of a node's sequence maps to a
 * record in O(log shards) time with O(shards) memory.
 *
 * A resume on another node count (the view, sl__order_view_init): what the
 * last phase's nodes left, each node's tail of its sequence concatenated in
 * node order, is cut by the new nodes into equal contiguous ranges, with
 * nothing permuted again; a later change cuts what that phase left, and so
 * on.  A position of the current phase lifts through each phase to one of
 * the first phase's node sequences in O(phases * log nodes).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loader/state.h"

static uint64_t sl_mix(uint64_t x)
{
	/* splitmix64's finaliser. */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

int sl__order_init(struct sl__order *o, const uint64_t *shard_records, unsigned nshards, uint64_t seed,
		   uint64_t epoch, uint64_t window, uint64_t chunk)
{
	uint64_t rng = sl_mix(seed ^ sl_mix(epoch + 1)), first = 0;
	uint64_t *orig_first = malloc((nshards ? nshards : 1) * sizeof(uint64_t));

	memset(o, 0, sizeof(*o));
	o->epoch = epoch;
	o->perm = malloc((nshards ? nshards : 1) * sizeof(*o->perm));
	o->start = malloc((nshards + 1) * sizeof(*o->start));
	o->first = orig_first;
	if (!o->perm || !o->start || !orig_first) {
		sl__order_free(o);
		return -ENOMEM;
	}
	for (unsigned s = 0; s < nshards; s++) {
		orig_first[s] = first;
		first += shard_records[s];
		o->perm[s] = s;
	}
	/* Fisher-Yates over the shards. */
	for (unsigned s = nshards; s > 1; s--) {
		unsigned j = (unsigned)((rng = sl_mix(rng)) % s), t = o->perm[s - 1];

		o->perm[s - 1] = o->perm[j];
		o->perm[j] = t;
	}
	o->start[0] = 0;
	for (unsigned s = 0; s < nshards; s++)
		o->start[s + 1] = o->start[s] + shard_records[o->perm[s]];
	o->nshards = nshards;
	o->n = first;
	o->chunk = chunk ? chunk : 1;
	o->window = window ? window : 1;
	if (o->chunk > o->window)
		o->chunk = o->window;
	o->window -= o->window % o->chunk;
	o->nchunks = o->n / o->chunk;
	o->key = sl_mix(rng);
	return sl__order_view_init(&o->view, o->n, 1, 1, 0, NULL, 0, NULL);
}

void sl__order_free(struct sl__order *o)
{
	free(o->perm);
	free(o->start);
	free(o->first);
	o->perm = NULL;
	o->start = o->first = NULL;
}

/*
 * A keyed permutation of [0, m): a 4-round Feistel network on the
 * smallest even number of bits that holds m, walking cycles until the
 * value lands inside [0, m).
 */
static uint64_t sl_permute(uint64_t q, uint64_t m, uint64_t key)
{
	unsigned bits = 2, half;
	uint64_t mask;

	while (bits < 64 && (1ull << bits) < m)
		bits += 2;
	half = bits / 2;
	mask = (1ull << half) - 1;
	do {
		uint64_t l = q >> half, r = q & mask;

		for (unsigned round = 0; round < 4; round++) {
			uint64_t t = l ^ (sl_mix(r ^ key ^ ((uint64_t)round << 56)) & mask);

			l = r;
			r = t;
		}
		q = (l << half) | r;
	} while (q >= m);
	return q;
}

/* The permuted shard holding position s of S: the last one starting at or before it (empty ones are passed over). */
static unsigned sl_shard_at(const struct sl__order *o, uint64_t s)
{
	unsigned lo = 0, hi = o->nshards - 1;

	while (lo < hi) {
		unsigned mid = (lo + hi + 1) / 2;

		if (o->start[mid] <= s)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* floor(k n / nodes), without overflow: where node k's range starts when n records are cut among `nodes`. */
static uint64_t sl_cut(uint64_t n, unsigned nodes, uint64_t k)
{
	return k * (n / nodes) + k * (n % nodes) / nodes;
}

/* What a phase on `nodes` nodes that cut `in` records leaves once each node consumed `done` of its sequence. */
static uint64_t sl_left(unsigned nodes, uint64_t done, uint64_t in)
{
	/* A node's sequence holds in / nodes records or one more: past the shorter, its tail is one record or none. */
	return done <= in / nodes ? in - nodes * done : 0;
}

/*
 * Place t among the tails of a phase's node sequences (node k's positions
 * [done, len_k), concatenated in node order; they start at cut(k) - k done):
 * the node holding it into *node, and its position in that node's sequence.
 */
static uint64_t sl_lift(unsigned nodes, uint64_t done, uint64_t in, uint64_t t, unsigned *node)
{
	unsigned lo = 0, hi = nodes - 1;

	while (lo < hi) {
		unsigned mid = lo + (hi - lo + 1) / 2;

		if (sl_cut(in, nodes, mid) - mid * done <= t)
			lo = mid;
		else
			hi = mid - 1;
	}
	*node = lo;
	return t - (sl_cut(in, nodes, lo) - lo * done) + done;
}

/* Node k's key: the order's own with one node, so that one node's order is the order sluice always gave. */
static uint64_t sl_node_key(const struct sl__order *o, unsigned nodes, unsigned k)
{
	return nodes == 1 ? o->key : sl_mix(o->key ^ ((uint64_t)nodes << 32 | k));
}

/* The record at position p of node k's sequence (steps 2 and 3), its range being node k's of `nodes` in S. */
static uint64_t sl_node_at(const struct sl__order *o, unsigned nodes, unsigned k, uint64_t p)
{
	const uint64_t lo = sl_cut(o->n, nodes, k), len = sl_cut(o->n, nodes, k + 1) - lo, nchunks = len / o->chunk;
	const uint64_t key = sl_node_key(o, nodes, k), w = p / o->window, base = w * o->window;
	const uint64_t m = len - base < o->window ? len - base : o->window;
	uint64_t m_pos, c, s_pos;
	unsigned s;

	if (!o->view.shuffle)
		return lo + p;
	m_pos = base + sl_permute(p - base, m, key ^ sl_mix(w));
	c = m_pos / o->chunk;
	s_pos = lo + (c < nchunks ? sl_permute(c, nchunks, sl_mix(key)) * o->chunk + m_pos % o->chunk : m_pos);
	s = sl_shard_at(o, s_pos);
	return o->first[o->perm[s]] + (s_pos - o->start[s]);
}

uint64_t sl__order_at(const struct sl__order *o, uint64_t p)
{
	const struct sl__order_view *v = &o->view;
	uint64_t t = v->lo + p, q;
	unsigned k;

	/* Place t of what phase i cut is place t of what phase i - 1 left: its nodes' tails, in node order. */
	for (unsigned i = v->nlev - 1; i > 0; i--) {
		const struct sl__order_level *l = &v->lev[i - 1];
		uint64_t in = i > 1 ? v->lev[i - 2].left : o->n;

		q = sl_lift(l->nodes, l->done, in, t, &k);
		t = sl_cut(in, l->nodes, k) + q;
	}
	/* The first phase cut S itself: place t is position q of node k's own sequence. */
	q = sl_lift(v->lev[0].nodes, 0, o->n, t, &k);
	return sl_node_at(o, v->lev[0].nodes, k, q);
}

/* The phases of seg[0, nseg) made canonical into v->lev; their count. */
static unsigned sl_phases(struct sl__order_view *v, const struct sluice_loader_segment *seg, unsigned nseg)
{
	struct sl__order_level *l = v->lev;
	unsigned m = 0;

	for (unsigned i = 0; i < nseg; i++) {
		/* A later phase that consumed nothing left what it cut: the phase before it left that too. */
		if (m && !seg[i].position)
			continue;
		/* The same nodes again cut what their tails were: the same sequences, further on. */
		if (m && l[m - 1].nodes == seg[i].nodes) {
			l[m - 1].done = seg[i].position > UINT64_MAX - l[m - 1].done ? UINT64_MAX
										 : l[m - 1].done + seg[i].position;
			continue;
		}
		l[m++] = (struct sl__order_level){ seg[i].nodes, seg[i].position, 0 };
	}
	/* A first phase alone that consumed nothing: the epoch starts afresh. */
	return m == 1 && !l[0].done ? 0 : m;
}

int sl__order_view_init(struct sl__order_view *v, uint64_t n, int shuffle, unsigned nodes, unsigned node,
			const struct sluice_loader_segment *seg, unsigned nseg, uint64_t *position)
{
	uint64_t in = n, pos = 0;
	unsigned m;

	memset(v, 0, sizeof(*v));
	v->shuffle = shuffle;
	if (nseg > SLUICE_LOADER_SEGMENTS_MAX)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: nresume %u: a resume state holds at most %d segments",
			       nseg, SLUICE_LOADER_SEGMENTS_MAX);
	for (unsigned i = 0; i < nseg; i++)
		if (!seg[i].nodes)
			return sl__err(SLUICE_EINVAL_CONFIG, "loader: resume segment %u ran on 0 nodes", i);
	m = sl_phases(v, seg, nseg);
	/* A last phase on this loader's node count goes on: the same node sequences, from where it stopped. */
	if (m && v->lev[m - 1].nodes == nodes)
		pos = v->lev[--m].done;
	if (m >= SLUICE_LOADER_SEGMENTS_MAX)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: the resume state ran on %u node counts before this one, "
			       "and a state holds at most %d: resume on %u nodes (its last), or start the next epoch", m,
			       SLUICE_LOADER_SEGMENTS_MAX, v->lev[m - 1].nodes);
	for (unsigned i = 0; i < m; i++)
		in = v->lev[i].left = sl_left(v->lev[i].nodes, v->lev[i].done, in);
	v->lev[m] = (struct sl__order_level){ nodes, 0, in };
	v->nlev = m + 1;
	v->node = node;
	v->shortest = in / nodes;
	v->longest = in / nodes + (in % nodes != 0);
	v->lo = sl_cut(in, nodes, node);
	v->len = sl_cut(in, nodes, node + 1) - v->lo;
	if (!v->len) { /* fewer records than nodes: this node's batches are all fill, from the whole phase */
		v->lo = 0;
		v->len = in;
	}
	if (position)
		*position = pos;
	return 0;
}

uint64_t sl__order_consumed(const struct sl__order_view *v, uint64_t n, uint64_t c)
{
	const struct sl__order_level *l = &v->lev[v->nlev - 1];

	return n - sl_left(l->nodes, c, l->left);
}

void sl__order_node_range(const struct sl__order *o, unsigned nodes, unsigned node, uint64_t *lo, uint64_t *hi)
{
	*lo = sl_cut(o->n, nodes, node);
	*hi = sl_cut(o->n, nodes, node + 1);
}

/* Marks the shards of S's records [a, b) that hold any, appending each first seen to out. */
static void sl_note_shards(const struct sl__order *o, uint64_t a, uint64_t b, unsigned char *seen, unsigned *out,
			   unsigned *n)
{
	for (unsigned s = a < b ? sl_shard_at(o, a) : o->nshards; s < o->nshards && o->start[s] < b; s++)
		if (o->start[s + 1] > o->start[s] && !seen[s]) {
			seen[s] = 1;
			out[(*n)++] = o->perm[s];
		}
}

int sl__order_node_shards(const struct sl__order *o, unsigned nodes, unsigned node, unsigned *out, unsigned *n)
{
	uint64_t lo, hi, nchunks;
	const uint64_t key = sl_mix(sl_node_key(o, nodes, node));
	unsigned char *seen = calloc(o->nshards ? o->nshards : 1, 1);

	if (!seen)
		return -ENOMEM;
	*n = 0;
	sl__order_node_range(o, nodes, node, &lo, &hi);
	nchunks = (hi - lo) / o->chunk;
	/* Not shuffled, S is the dataset's order: the shards holding ids [lo, hi), in order. */
	for (unsigned s = 0; !o->view.shuffle && s < o->nshards; s++) {
		uint64_t end = s + 1 < o->nshards ? o->first[s + 1] : o->n;

		if (end > o->first[s] && o->first[s] < hi && end > lo)
			out[(*n)++] = s;
	}
	/* The node's chunks in M order are its windows in order; the records past its whole chunks come last. */
	for (uint64_t c = 0; o->view.shuffle && c < nchunks; c++) {
		uint64_t a = lo + sl_permute(c, nchunks, key) * o->chunk;

		sl_note_shards(o, a, a + o->chunk, seen, out, n);
	}
	if (o->view.shuffle && lo < hi)
		sl_note_shards(o, lo + nchunks * o->chunk, hi, seen, out, n);
	free(seen);
	return 0;
}
