/*
 * The loader's sample order: a pure function of (dataset shape, seed,
 * epoch, window), never of the world size or the worker count.
 *
 *   1. The shards are permuted (seeded by seed and epoch) and their records
 *      concatenated in that order: the sequence S.
 *   2. S is cut into chunks of `chunk` consecutive records, and the whole
 *      chunks are permuted by a keyed bijection (a partial last chunk stays
 *      last): the sequence M.
 *   3. M is cut into windows of `window` consecutive records (a multiple of
 *      the chunk); inside each window the records are permuted by a keyed
 *      bijection.
 *
 * A window is a few runs of neighbouring records (its chunks), so a loader
 * that reads a window whole reads sequentially, while the chunks come from
 * all over the dataset: a batch mixes window / chunk places of it, not one
 * or two shards, which matters when shards were written in some order (by
 * class, by source).  The order inside a window is a full permutation of
 * it.  Position p of the epoch maps to a record in O(log shards) time with
 * O(shards) memory, so the resume state is just (seed, epoch, position).
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
	o->chunk_key = sl_mix(o->key);
	return 0;
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

uint64_t sl__order_at(const struct sl__order *o, uint64_t p)
{
	uint64_t w = p / o->window, base = w * o->window;
	uint64_t m = o->n - base < o->window ? o->n - base : o->window;
	uint64_t m_pos = base + sl_permute(p - base, m, o->key ^ sl_mix(w)), c = m_pos / o->chunk;
	uint64_t s_pos = c < o->nchunks ? sl_permute(c, o->nchunks, o->chunk_key) * o->chunk + m_pos % o->chunk : m_pos;
	unsigned lo = 0, hi = o->nshards - 1;

	/* The permuted shard holding position s_pos of S. */
	while (lo < hi) {
		unsigned mid = (lo + hi + 1) / 2;

		if (o->start[mid] <= s_pos)
			lo = mid;
		else
			hi = mid - 1;
	}
	return o->first[o->perm[lo]] + (s_pos - o->start[lo]);
}
