/*
 * Window reading: which records of each shuffle window this rank takes
 * (sl__rank_positions), the epoch's window sequence, and the reader threads
 * that read each window in one batched engine call into its buffer (the
 * engine coalesces neighbours and the workers check CRCs; zstd blocks are
 * decompressed there too).  Producers find records in the windows with
 * sl__window_lookup (docs/LOADER.md).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "loader/state.h"
#include "dsread/dsread.h"
#include "engine/engine.h"

uint64_t sl__ld_at(const struct sluice_loader *ld, uint64_t q)
{
	return sl__order_at(&ld->order, q);
}

int sl__cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct sl_pos {
	uint64_t id, p;
};

static int sl_cmp_pos(const void *a, const void *b)
{
	const struct sl_pos *x = a, *y = b;

	return x->id != y->id ? (x->id < y->id ? -1 : 1) : (x->p > y->p) - (x->p < y->p);
}

/*
 * This rank's B positions of its node's global batch g, in sequence order.
 * The global batch's records, sorted by id, are cut into the node's ranks'
 * runs of B and local rank r takes the r-th: each rank then reads a
 * compact part of every window, in long sequential runs, whatever the world
 * size.  Which records form each global batch, and their order, do not
 * depend on the world size, only on the node count.
 */
int sl__rank_positions(const struct sluice_loader *ld, const struct sl__order *o, uint64_t g, uint64_t *out)
{
	const uint64_t B = sl__bsize(ld, g), BW = sl__gsize(ld, g), p0 = sl__gstart(ld, g);
	struct sl_pos *v;

	if (BW == B) {
		for (uint64_t j = 0; j < B; j++)
			out[j] = p0 + j;
		return 0;
	}
	v = malloc(BW * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (uint64_t k = 0; k < BW; k++)
		v[k] = (struct sl_pos){ sl__order_at(o, (p0 + k) % ld->len), p0 + k };
	qsort(v, BW, sizeof(*v), sl_cmp_pos);
	for (uint64_t j = 0; j < B; j++)
		out[j] = v[ld->local_rank * B + j].p;
	qsort(out, B, sizeof(uint64_t), sl__cmp_u64);
	free(v);
	return 0;
}

/*
 * The window's buffer, at least n bytes: mapped memory (huge pages where
 * the kernel gives them), as the ring's staging, registered with pin's
 * driver where it is not NULL (and the driver takes it); its old bytes are
 * not kept.
 */
int sl__window_reserve(struct sl__window *win, size_t n, const struct sl__gpu *pin)
{
	if (n <= win->cap)
		return 0;
	sl__window_free(win, pin);
	n = sl__align_up(n, 2u << 20);
	if (sl__host_alloc(pin, n, (void **)&win->buf, &win->pinned))
		return -ENOMEM;
	win->cap = n;
	return 0;
}

void sl__window_free(struct sl__window *win, const struct sl__gpu *pin)
{
	sl__host_free(pin, win->buf, win->cap, win->pinned);
	win->buf = NULL;
	win->cap = 0;
	win->pinned = 0;
}

/* Reads window w: every record of it that this rank takes in the epoch whose order is o. */
/*
 * The records of window [lo, hi) this rank takes, sorted, each once, into
 * win->ids; their count.  Position q of the order is taken at p = q, and
 * again at p = q + n, q + 2n, ... where the last batch wraps (more than once
 * when there are fewer records than a global batch): this rank's positions
 * of the global batches that overlap [lo, hi) + k n, each record marked once.
 */
static ssize_t sl_window_ids(struct sluice_loader *ld, const struct sl__order *o, struct sl__window *win, uint64_t lo,
			     uint64_t hi)
{
	uint64_t total = sl__gend(ld), *pos = malloc(ld->bmax * sizeof(uint64_t));
	unsigned char *take = calloc(hi - lo + 1, 1);
	size_t k = 0, u = 0;
	int rc = pos && take ? 0 : -ENOMEM;

	for (uint64_t pass = 0; !rc && pass * ld->len < total; pass++) {
		uint64_t a = lo + pass * ld->len, b = hi + pass * ld->len;

		if (b <= ld->origin)
			continue;
		for (uint64_t g = a > ld->origin ? (a - ld->origin) / ld->per_global : 0;
		     !rc && sl__gstart(ld, g) < b && sl__gstart(ld, g) < total; g++) {
			rc = sl__rank_positions(ld, o, g, pos);
			for (uint32_t j = 0; !rc && j < sl__bsize(ld, g); j++)
				if (pos[j] >= a && pos[j] < b)
					take[pos[j] - a] = 1;
		}
	}
	for (uint64_t q = lo; !rc && q < hi; q++)
		if (take[q - lo])
			win->ids[k++] = sl__order_at(o, q);
	free(pos);
	free(take);
	if (rc)
		return rc;
	qsort(win->ids, k, sizeof(uint64_t), sl__cmp_u64);
	/* A position and its wrapped twin may both be this rank's: one copy. */
	for (size_t i = 0; i < k; i++)
		if (!u || win->ids[i] != win->ids[u - 1])
			win->ids[u++] = win->ids[i];
	return (ssize_t)u;
}

/*
 * Where each of the k records lands in the window's buffer (8-byte
 * aligned), its bytes in total into *need; the bytes that follow the
 * record read before them in the file (*seq) and all (*all), for the stats.
 */
static int sl_window_layout(struct sluice_loader *ld, struct sl__window *win, size_t k, uint64_t *need, uint64_t *seq,
			    uint64_t *all)
{
	struct sluice_record_loc prev = { UINT_MAX, 0, 0, 0 };

	*need = *seq = *all = 0;
	for (size_t i = 0; i < k; i++) {
		struct sluice_record_loc loc;
		int r = sluice_dataset_locate(ld->ds, win->ids[i], &loc);

		if (r)
			return r;
		/* Sequential: it starts where the record read before it ends (up to the format's padding). */
		if (loc.shard == prev.shard && loc.offset >= prev.offset + prev.length &&
		    loc.offset <= prev.offset + prev.length + 8)
			*seq += loc.length;
		*all += loc.length;
		prev = loc;
		win->len[i] = loc.length;
		win->off[i] = *need;
		*need = sl__align_up(*need + loc.length, 8);
	}
	return 0;
}

/* The window's records read in one batch; with skip_corrupt, a batch that fails a check is read one by one and its bad records marked. */
static ssize_t sl_window_read(struct sluice_loader *ld, struct sl__window *win, size_t k, struct sluice_xfer_report *rep,
			      struct sl__zgpu *z)
{
	struct sl__zreport zr = { 0 };
	ssize_t rc = k ? sl__dataset_read_batch(ld->eng, ld->ds, win->ids, k, win->buf, win->cap, win->off, rep, z,
						&zr) : 0;

	atomic_fetch_add(&ld->zblocks_gpu, zr.blocks_gpu);
	atomic_fetch_add(&ld->zblocks_cpu, zr.blocks_cpu);
	if (zr.blocks_gpu)
		sl__hist_add(&ld->h_zread, zr.read_ns);
	if (zr.blocks_gpu || zr.blocks_cpu)
		sl__hist_add(&ld->h_zdecode, zr.decode_ns);

	if ((rc != SLUICE_ECRC && rc != SLUICE_EFORMAT) || !ld->opt.skip_corrupt)
		return rc;
	rc = 0;
	/* The first bad record named, the rest of the window's counted: a bad block is one line, not one a record. */
	size_t bad = 0;

	for (size_t i = 0; i < k && rc >= 0; i++) {
		rc = sluice_dataset_read(ld->ds, win->ids[i], win->buf + win->off[i], win->len[i], NULL);
		if (rc == SLUICE_ECRC || rc == SLUICE_EFORMAT) {
			if (!bad++)
				sl__warn("loader", "skipping: %s", sluice_last_error_detail());
			win->len[i] = UINT32_MAX;
			rc = 0;
		}
	}
	if (bad > 1)
		sl__warn("loader", "skipping %zu more records of window %llu, each failing its check", bad - 1,
			 (unsigned long long)win->w);
	return rc;
}

static int sl_window_load(struct sluice_loader *ld, const struct sl__order *o, struct sl__window *win, uint64_t w,
			  struct sl__zgpu *z)
{
	uint64_t lo = w * ld->window, hi = lo + ld->window < ld->len ? lo + ld->window : ld->len;
	uint64_t need = 0, seq = 0, all = 0, t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld);
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	ssize_t k, rc;

	free(win->ids);
	free(win->off);
	free(win->len);
	win->ids = malloc((hi - lo + 1) * sizeof(uint64_t));
	win->off = malloc((hi - lo + 2) * sizeof(uint64_t));
	win->len = malloc((hi - lo + 1) * sizeof(uint32_t));
	if (!win->ids || !win->off || !win->len)
		return -ENOMEM;
	if ((k = sl_window_ids(ld, o, win, lo, hi)) < 0)
		return (int)k;
	if ((rc = sl_window_layout(ld, win, (size_t)k, &need, &seq, &all)) ||
	    (rc = sl__window_reserve(win, need, ld->win_pin)))
		return (int)rc;
	if ((rc = sl_window_read(ld, win, (size_t)k, &rep, z)) < 0)
		return (int)rc;
	atomic_fetch_add(&ld->seq_bytes, seq);
	atomic_fetch_add(&ld->record_bytes, all);
	atomic_fetch_add(&ld->read_bytes, rep.bytes);
	atomic_fetch_add(&ld->read_cached, rep.bytes_buffered);
	atomic_fetch_add(&ld->read_ios, rep.ios);
	win->n = (size_t)k;
	sl__hist_add(&ld->h_read, sl__now_ns() - t0);
	sl__ld_span(ld, "read window", t0, cpu0, w);
	return 0;
}

/*
 * Waits until the readers have every window batch g draws from (seq places
 * bfirst[g]..blast[g]) and puts them in wins; they stay while g is built.
 */
int sl__batch_windows(struct sluice_loader *ld, uint64_t g, struct sl__window **wins)
{
	const uint64_t first = ld->bfirst[g], need = ld->blast[g] - first + 1;
	uint64_t got = 0;
	int rc = 0;

	pthread_mutex_lock(&ld->lock);
	for (;;) {
		got = 0;
		for (uint64_t p = 0; p < need; p++) {
			wins[p] = NULL;
			for (unsigned i = 0; i < ld->nwin && !wins[p]; i++) {
				struct sl__window *win = &ld->win[i];

				if (win->idx != first + p || win->epoch != ld->opt.epoch)
					continue;
				if (win->state == SL_W_READY)
					wins[p] = win;
				else if (win->state == SL_W_FAILED && !rc) /* the batch fails with the window's error */
					rc = sl__err(win->err, "%s", win->detail);
			}
			got += wins[p] != NULL;
		}
		if (got == need || rc || ld->err || ld->stop)
			break;
		pthread_cond_wait(&ld->cv, &ld->lock);
	}
	if (got < need && !rc)
		rc = ld->err ? sl__err(ld->err, "%s", ld->detail) : -ECANCELED;
	pthread_mutex_unlock(&ld->lock);
	return rc;
}

/* The bytes of record id of window w, one of the nw windows of a batch. */
const char *sl__window_lookup(struct sl__window *const *wins, uint64_t nw, uint64_t w, uint64_t id, size_t *len,
			     int *rc)
{
	const struct sl__window *win = NULL;
	const uint64_t *hit = NULL;

	for (uint64_t k = 0; k < nw && !win; k++)
		if (wins[k]->w == w)
			win = wins[k];
	if (win)
		hit = bsearch(&id, win->ids, win->n, sizeof(uint64_t), sl__cmp_u64);
	if (!hit) {
		*rc = sl__err(-EIO, "loader: record %llu missing from window %llu", (unsigned long long)id,
			      (unsigned long long)w);
		return NULL;
	}
	*len = win->len[hit - win->ids];
	return win->buf + win->off[hit - win->ids];
}

/* Under ld->lock: a window cache entry no batch needs any more (or none). */
static struct sl__window *sl_free_window(struct sluice_loader *ld)
{
	for (unsigned k = 0; k < ld->nwin; k++) {
		struct sl__window *win = &ld->win[k];

		if (win->state == SL_W_EMPTY ||
		    ((win->state == SL_W_READY || win->state == SL_W_FAILED) && win->epoch == ld->opt.epoch &&
		     win->idx < ld->low))
			return win;
	}
	return NULL;
}

/*
 * Reads the windows of ld->seq in order, each once a cache entry is free and
 * it is near enough, then the next epoch's first windows, as many as
 * there are buffers (an epoch's start needs its windows faster than the
 * middle: its batches come from the ring, full, while the windows behind
 * them are read).
 * ld->nreaders of these run (SL_READERS, or SL_READERS_GPU_ZSTD where
 * nvCOMP decodes), each with its own window in flight, so that storage
 * sees more than one window's I/O at a time.
 */
void *sl__read_ahead(void *arg)
{
	struct sluice_loader *ld = arg;
	/*
	 * The next epoch's first windows are read ahead with this epoch's plan:
	 * not after a resume whose batches start elsewhere (origin) or whose
	 * sequence is another (a resume across node counts), as the next epoch's
	 * start at 0 of the node's own.
	 */
	const uint64_t npre = ld->origin || ld->view.nlev > 1 ? 0 : ld->nseq < ld->nwin ? ld->nseq : ld->nwin;
	void *z = NULL; /* this reader's state of the window stage (zstd: its nvCOMP decoder) */
	const struct sl__stage *ws = ld->wstage;
	int zrc = sl__stage_reader_open(ws, &z);

	pthread_mutex_lock(&ld->lock);
	if (zrc)
		sl__loader_fail(ld, zrc);
	for (;;) {
		struct sl__window *win = NULL;
		int pre = 0, rc;
		uint64_t i;

		while (!ld->stop && !ld->err) {
			pre = ld->read_next >= ld->nseq;
			if (pre && ld->pre_next >= npre)
				break;
			win = sl_free_window(ld);
			if (win && (pre || ld->read_next < ld->low + ld->nwin))
				break;
			win = NULL;
			pthread_cond_wait(&ld->cv, &ld->lock);
		}
		if (!win)
			break;
		i = pre ? ld->pre_next++ : ld->read_next++;
		win->state = SL_W_LOADING;
		win->idx = i;
		win->w = ld->seq[i];
		win->epoch = ld->opt.epoch + (uint64_t)pre;
		pthread_mutex_unlock(&ld->lock);
		rc = sl_window_load(ld, pre ? &ld->next_order : &ld->order, win, ld->seq[i], z);
		pthread_mutex_lock(&ld->lock);
		if (rc && pre) {
			win->state = SL_W_EMPTY; /* the next epoch reads it again, and meets the error then */
		} else if (rc) {
			/* The first batch drawing on it fails with this (sl__batch_windows); those before it arrive. */
			win->state = SL_W_FAILED;
			win->err = rc;
			snprintf(win->detail, sizeof(win->detail), "%s", sluice_last_error_detail());
			pthread_cond_broadcast(&ld->cv);
		} else {
			win->state = SL_W_READY;
			pthread_cond_broadcast(&ld->cv);
		}
	}
	pthread_mutex_unlock(&ld->lock);
	sl__stage_reader_close(ws, z);
	return NULL;
}

/* The epoch's window sequence for this rank (see struct sluice_loader). */
int sl__plan_windows(struct sluice_loader *ld)
{
	uint64_t cap = ld->nbatches + 16;

	free(ld->seq);
	free(ld->bfirst);
	free(ld->blast);
	ld->nseq = 0;
	ld->seq = malloc(cap * sizeof(uint64_t));
	ld->bfirst = malloc((ld->nbatches + 1) * sizeof(uint64_t));
	ld->blast = malloc((ld->nbatches + 1) * sizeof(uint64_t));
	if (!ld->seq || !ld->bfirst || !ld->blast)
		return -ENOMEM;
	/* A batch may draw on any window its global batch overlaps (see sl__rank_positions). */
	for (uint64_t g = 0; g < ld->nbatches; g++) {
		const uint64_t p = sl__gstart(ld, g), len = sl__gsize(ld, g);

		ld->bfirst[g] = UINT64_MAX;
		for (uint64_t j = 0; j < len; j++) {
			uint64_t w = (p + j) % ld->len / ld->window;

			if (!ld->nseq || ld->seq[ld->nseq - 1] != w) {
				if (ld->nseq == cap) {
					uint64_t *n = realloc(ld->seq, 2 * cap * sizeof(uint64_t));

					if (!n)
						return -ENOMEM;
					ld->seq = n;
					cap *= 2;
				}
				ld->seq[ld->nseq++] = w;
			}
			if (ld->bfirst[g] == UINT64_MAX)
				ld->bfirst[g] = ld->nseq - 1;
			ld->blast[g] = ld->nseq - 1;
			/* Positions of one window run on; jump to the window's end. */
			uint64_t q = (p + j) % ld->len, end = (w + 1) * ld->window;

			if (end > ld->len)
				end = ld->len;
			if (end - q > 1)
				j += end - q - 1 < len - 1 - j ? end - q - 1 : len - 1 - j;
		}
	}
	return 0;
}
