/*
 * The loader turns the epoch order (order.c) into batches.  Reader threads
 * read each shuffle window, in one batched engine call, every record of it
 * this rank needs (the engine coalesces neighbours and the workers check
 * CRCs; zstd blocks are decompressed there too); producer threads collate
 * batches from the window buffers into pinned staging and, for GPU
 * loaders, queue each batch's copy into a ring slot in device memory on
 * the loader's copy stream (docs/LOADER.md).  The consumer takes
 * ready slots in order; giving a slot back records an event on the
 * consumer's stream that the copy stream waits on before reusing it.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "loader/loader.h"
#include "xfer/xfer.h"

enum { SL_B_FREE = 0, SL_B_BUILDING, SL_B_READY, SL_B_OUT };

struct sl_bslot {
	int state;
	uint64_t g;                 /* batch number */
	char *host;                 /* pinned staging: the collated batch */
	size_t host_cap;
	int host_pinned;
	char *dev;                  /* GPU copy of host */
	size_t dev_cap;
	sl_CUevent ready, release;  /* copied; consumer's stream done with it */
	int release_set;
	uint64_t *ids;
	struct sluice_batch b;
};

enum { SL_W_EMPTY = 0, SL_W_LOADING, SL_W_READY };

#define SL_READERS 2   /* reader threads, each with one window's I/O in flight */
#define SL_PRODUCERS 2 /* threads collating batches, each its own, into their slots */
#define SL_CHUNKS 16           /* chunks a shuffle window is made of (order.c) */
#define SL_CHUNK_MIN (1 << 20) /* bytes of a chunk at least */

struct sl_window {
	int state;
	uint64_t idx;               /* place in the epoch's window sequence (ld->seq) */
	uint64_t epoch;             /* the epoch it was read for: this one, or the next (read ahead) */
	uint64_t w;                 /* window number */
	uint64_t *ids;              /* sorted record ids */
	uint64_t *off;              /* where each starts in buf */
	uint32_t *len;              /* and its length */
	size_t n;
	char *buf;
	size_t cap;
};

struct sluice_loader {
	struct sluice_engine *eng;
	struct sluice_dataset *ds;
	struct sluice_loader_options opt;
	unsigned fidx[SLUICE_MAX_FIELDS], nf;
	size_t fixed[SLUICE_MAX_FIELDS];
	uint64_t *shard_records;
	unsigned nshards;           /* runs the order permutes (1 if the format does not count per file) */
	struct sl__order order;
	/*
	 * The next epoch's order: once this epoch's windows are all read, the
	 * readers read the next epoch's first windows into the buffers this one
	 * gives back, so that sluice_loader_set_epoch(epoch + 1) starts with
	 * them in hand.
	 */
	struct sl__order next_order;
	uint64_t pre_next;          /* next of those places a reader takes */
	uint64_t preloaded;         /* windows an epoch found read ahead, since open */
	uint64_t n, window, chunk, per_global, nbatches; /* nbatches: this rank's, per epoch */
	uint64_t next_g;            /* next batch the consumer takes */
	uint64_t delivered;         /* batches handed to the consumer since open, over epochs */
	struct sl_bslot *slots;
	unsigned nslots;
	struct sl_window *win;
	unsigned nwin;
	/*
	 * The windows this rank reads in the epoch, in order (a window comes
	 * back once more when the last batch wraps to the start), and for each
	 * batch the first and last place in that sequence it draws from.
	 */
	uint64_t *seq, nseq, *bfirst, *blast;
	uint64_t low;               /* the batches being built need seq places >= low */
	pthread_t reader[SL_READERS]; /* read windows ahead of the producer */
	unsigned readers_running;
	uint64_t read_next;         /* next place in seq a reader takes */
	sl_CUstream copy;
	pthread_t producer[SL_PRODUCERS];
	unsigned producers_running;
	int running;
	pthread_mutex_t lock;
	/*
	 * cv: windows read and windows done with (readers, and producers
	 * waiting for windows); slot_cv: a slot given back (producers);
	 * batch_cv: a batch ready (the consumer).  Apart, so that the consumer's
	 * call wakes one producer, not every thread.
	 */
	pthread_cond_t cv, slot_cv, batch_cv;
	struct sl_bslot *held;      /* the consumer's batch (the consumer's thread alone uses it) */
	uint64_t produce_g;         /* next batch a producer takes */
	int stop, err;
	char detail[384];
	struct sl__hist h_read, h_swait, h_collate, h_h2d, h_wait; /* h_swait: producers waiting for windows */
	_Atomic uint64_t bytes, records, read_bytes, read_ios, skipped;
	_Atomic uint64_t record_bytes, seq_bytes; /* records read, and those read right after their neighbour */
	uint64_t t_first, t_last;   /* consumer: first and latest sluice_loader_next() */
	/*
	 * The consumer's wait for the first batch after each (re)start: the
	 * pipeline filling, which a longer run pays only once.  The wait share
	 * and the verdict leave it out; the JSON reports it beside them.
	 */
	uint64_t fill_ns;
	int filling;
	uint64_t stats_every, t_logged; /* SLUICE_STATS seconds between log lines, in ns; 0: off */
	struct sl__trace *trace;    /* SLUICE_TRACE: spans of each stage, written at close */
};

/* For SLUICE_TRACE: the thread's CPU time now (0 when not tracing). */
static uint64_t sl_cpu(const struct sluice_loader *ld)
{
	return ld->trace ? sl__thread_cpu_ns() : 0;
}

/* A span of this thread's work from t0 (cpu0 its sl_cpu() then) to now, for SLUICE_TRACE. */
static void sl_span(const struct sluice_loader *ld, const char *name, uint64_t t0, uint64_t cpu0, uint64_t n)
{
	if (ld->trace)
		sl__trace_span(ld->trace, name, t0, sl__now_ns(), sl__thread_cpu_ns() - cpu0, n);
}

/* The record at position q of the epoch whose order is o. */
static uint64_t sl_at_in(const struct sluice_loader *ld, const struct sl__order *o, uint64_t q)
{
	return ld->opt.shuffle ? sl__order_at(o, q) : q;
}

static uint64_t sl_at(const struct sluice_loader *ld, uint64_t q)
{
	return sl_at_in(ld, &ld->order, q);
}

static int sl_cmp_u64(const void *a, const void *b)
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
 * This rank's B epoch positions of global batch g, in epoch order.  The
 * global batch's records, sorted by id, are cut into world_size runs of B
 * and rank r takes the r-th: each rank then reads a compact part of every
 * window, in long sequential runs, whatever the world size.  Which records
 * form each global batch, and their order, do not depend on the world size.
 */
static int sl_rank_positions(const struct sluice_loader *ld, const struct sl__order *o, uint64_t g, uint64_t *out)
{
	const uint64_t B = ld->opt.batch_size, BW = ld->per_global, p0 = g * BW;
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
		v[k] = (struct sl_pos){ sl_at_in(ld, o, (p0 + k) % ld->n), p0 + k };
	qsort(v, BW, sizeof(*v), sl_cmp_pos);
	for (uint64_t j = 0; j < B; j++)
		out[j] = v[ld->opt.rank * B + j].p;
	qsort(out, B, sizeof(uint64_t), sl_cmp_u64);
	free(v);
	return 0;
}

/*
 * The window's buffer, at least n bytes: mapped memory (huge pages where
 * the kernel gives them), as the ring's staging; its old bytes are not kept.
 */
static int sl_window_reserve(struct sl_window *win, size_t n)
{
	int pinned;

	if (n <= win->cap)
		return 0;
	sl__host_free(NULL, win->buf, win->cap, 0);
	win->buf = NULL;
	win->cap = 0;
	n = sl__align_up(n, 2u << 20);
	if (sl__host_alloc(NULL, n, (void **)&win->buf, &pinned))
		return -ENOMEM;
	win->cap = n;
	return 0;
}

/* Reads window w: every record of it that this rank takes in the epoch whose order is o. */
static int sl_window_load(struct sluice_loader *ld, const struct sl__order *o, struct sl_window *win, uint64_t w)
{
	uint64_t lo = w * ld->window, hi = lo + ld->window < ld->n ? lo + ld->window : ld->n;
	uint64_t total = ld->nbatches * ld->per_global, need = 0, t0 = sl__now_ns(), cpu0 = sl_cpu(ld);
	struct sluice_xfer_report rep;
	size_t k = 0;
	ssize_t rc;

	free(win->ids);
	free(win->off);
	free(win->len);
	win->ids = malloc((hi - lo + 1) * sizeof(uint64_t));
	win->off = malloc((hi - lo + 2) * sizeof(uint64_t));
	win->len = malloc((hi - lo + 1) * sizeof(uint32_t));
	if (!win->ids || !win->off || !win->len)
		return -ENOMEM;
	/*
	 * Position q of the order is taken at p = q, and again at p = q + n when
	 * the last batch wraps: this rank's positions of the global batches that
	 * overlap [lo, hi) or [lo + n, hi + n).
	 */
	uint64_t *pos = malloc(ld->opt.batch_size * sizeof(uint64_t));

	if (!pos)
		return -ENOMEM;
	for (int pass = 0; pass < 2; pass++) {
		uint64_t a = lo + (pass ? ld->n : 0), b = hi + (pass ? ld->n : 0);

		for (uint64_t g = a / ld->per_global; g * ld->per_global < b && g * ld->per_global < total; g++) {
			rc = sl_rank_positions(ld, o, g, pos);
			for (uint32_t j = 0; !rc && j < ld->opt.batch_size; j++)
				if (pos[j] >= a && pos[j] < b && k < hi - lo)
					win->ids[k++] = sl_at_in(ld, o, pos[j] % ld->n);
			if (rc) {
				free(pos);
				return (int)rc;
			}
		}
	}
	free(pos);
	qsort(win->ids, k, sizeof(uint64_t), sl_cmp_u64);
	size_t u = 0; /* a position and its wrapped twin may both be this rank's: one copy */

	for (size_t i = 0; i < k; i++)
		if (!u || win->ids[i] != win->ids[u - 1])
			win->ids[u++] = win->ids[i];
	k = u;
	struct sluice_record_loc prev = { UINT_MAX, 0, 0, 0 };
	uint64_t seq = 0, all = 0;

	for (size_t i = 0; i < k; i++) {
		struct sluice_record_loc loc;
		int r = sluice_dataset_locate(ld->ds, win->ids[i], &loc);

		if (r)
			return r;
		/* Sequential: it starts where the record read before it ends (up to the format's padding). */
		if (loc.shard == prev.shard && loc.offset >= prev.offset + prev.length &&
		    loc.offset <= prev.offset + prev.length + 8)
			seq += loc.length;
		all += loc.length;
		prev = loc;
		win->len[i] = loc.length;
		win->off[i] = need;
		need = sl__align_up(need + loc.length, 8);
	}
	if ((rc = sl_window_reserve(win, need)))
		return (int)rc;
	memset(&rep, 0, sizeof(rep));
	rc = k ? sluice_dataset_read_batch(ld->eng, ld->ds, win->ids, k, win->buf, win->cap, win->off, &rep) : 0;
	if ((rc == SLUICE_ECRC || rc == SLUICE_EFORMAT) && ld->opt.skip_corrupt) {
		/* One by one, to find the bad records; they are marked and left out of their batches. */
		rc = 0;
		for (size_t i = 0; i < k && rc >= 0; i++) {
			rc = sluice_dataset_read(ld->ds, win->ids[i], win->buf + win->off[i], win->len[i], NULL);
			if (rc == SLUICE_ECRC || rc == SLUICE_EFORMAT) {
				sl__warn("loader", "skipping: %s", sluice_last_error_detail());
				win->len[i] = UINT32_MAX;
				rc = 0;
			}
		}
	}
	if (rc < 0)
		return (int)rc;
	atomic_fetch_add(&ld->seq_bytes, seq);
	atomic_fetch_add(&ld->record_bytes, all);
	atomic_fetch_add(&ld->read_bytes, rep.bytes);
	atomic_fetch_add(&ld->read_ios, rep.ios);
	win->n = k;
	sl__hist_add(&ld->h_read, sl__now_ns() - t0);
	sl_span(ld, "read window", t0, cpu0, w);
	return 0;
}

/*
 * Waits until the readers have every window batch g draws from (seq places
 * bfirst[g]..blast[g]) and puts them in wins; they stay while g is built.
 */
static int sl_batch_windows(struct sluice_loader *ld, uint64_t g, struct sl_window **wins)
{
	const uint64_t first = ld->bfirst[g], need = ld->blast[g] - first + 1;
	uint64_t got = 0;
	int rc = 0;

	pthread_mutex_lock(&ld->lock);
	for (;;) {
		got = 0;
		for (uint64_t p = 0; p < need; p++) {
			wins[p] = NULL;
			for (unsigned i = 0; i < ld->nwin && !wins[p]; i++)
				if (ld->win[i].state == SL_W_READY && ld->win[i].idx == first + p &&
				    ld->win[i].epoch == ld->opt.epoch)
					wins[p] = &ld->win[i];
			got += wins[p] != NULL;
		}
		if (got == need || ld->err || ld->stop)
			break;
		pthread_cond_wait(&ld->cv, &ld->lock);
	}
	if (got < need)
		rc = ld->err ? sl__err(ld->err, "%s", ld->detail) : -ECANCELED;
	pthread_mutex_unlock(&ld->lock);
	return rc;
}

/* The bytes of record id of window w, one of the nw windows of a batch. */
static const char *sl_lookup(struct sl_window *const *wins, uint64_t nw, uint64_t w, uint64_t id, size_t *len,
			     int *rc)
{
	const struct sl_window *win = NULL;
	const uint64_t *hit = NULL;

	for (uint64_t k = 0; k < nw && !win; k++)
		if (wins[k]->w == w)
			win = wins[k];
	if (win)
		hit = bsearch(&id, win->ids, win->n, sizeof(uint64_t), sl_cmp_u64);
	if (!hit) {
		*rc = sl__err(-EIO, "loader: record %llu missing from window %llu", (unsigned long long)id,
			      (unsigned long long)w);
		return NULL;
	}
	*len = win->len[hit - win->ids];
	return win->buf + win->off[hit - win->ids];
}

/* Under ld->lock: every waiting thread looks again (an error, a stop). */
static void sl_wake_all(struct sluice_loader *ld)
{
	pthread_cond_broadcast(&ld->cv);
	pthread_cond_broadcast(&ld->slot_cv);
	pthread_cond_broadcast(&ld->batch_cv);
}

/* Under ld->lock: the loader's first error stops it; every thread hears of it. */
static void sl_fail(struct sluice_loader *ld, int rc)
{
	if (!ld->err) {
		ld->err = rc;
		snprintf(ld->detail, sizeof(ld->detail), "%s", sluice_last_error_detail());
	}
	sl_wake_all(ld);
}

/* Under ld->lock: a window cache entry no batch needs any more (or none). */
static struct sl_window *sl_free_window(struct sluice_loader *ld)
{
	for (unsigned k = 0; k < ld->nwin; k++) {
		struct sl_window *win = &ld->win[k];

		if (win->state == SL_W_EMPTY ||
		    (win->state == SL_W_READY && win->epoch == ld->opt.epoch && win->idx < ld->low))
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
 * SL_READERS of these run, each with its own window in flight, so that
 * storage sees more than one window's I/O at a time.
 */
static void *sl_read_ahead(void *arg)
{
	struct sluice_loader *ld = arg;
	const uint64_t npre = ld->nseq < ld->nwin ? ld->nseq : ld->nwin;

	pthread_mutex_lock(&ld->lock);
	for (;;) {
		struct sl_window *win = NULL;
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
		rc = sl_window_load(ld, pre ? &ld->next_order : &ld->order, win, ld->seq[i]);
		pthread_mutex_lock(&ld->lock);
		if (rc && pre) {
			win->state = SL_W_EMPTY; /* the next epoch reads it again, and meets the error then */
		} else if (rc) {
			win->state = SL_W_EMPTY;
			sl_fail(ld, rc);
		} else {
			win->state = SL_W_READY;
			pthread_cond_broadcast(&ld->cv);
		}
	}
	pthread_mutex_unlock(&ld->lock);
	return NULL;
}

/* The epoch's window sequence for this rank (see struct sluice_loader). */
static int sl_plan_windows(struct sluice_loader *ld)
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
	/* A batch may draw on any window its global batch overlaps (see sl_rank_positions). */
	for (uint64_t g = 0; g < ld->nbatches; g++) {
		const uint64_t p = g * ld->per_global, len = ld->per_global;

		ld->bfirst[g] = UINT64_MAX;
		for (uint64_t j = 0; j < len; j++) {
			uint64_t w = (p + j) % ld->n / ld->window;

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
			uint64_t q = (p + j) % ld->n, end = (w + 1) * ld->window;

			if (end > ld->n)
				end = ld->n;
			if (end - q > 1)
				j += end - q - 1 < len - 1 - j ? end - q - 1 : len - 1 - j;
		}
	}
	return 0;
}

/* Room in slot s for a batch of size bytes: pinned staging and, for GPU loaders, its GPU copy. */
static int sl_slot_reserve(struct sluice_loader *ld, struct sl_bslot *s, uint64_t size)
{
	int rc;

	if (size > s->host_cap) {
		size_t cap = sl__align_up(size + size / 4, 4096);

		sl__host_free(&ld->eng->gpu, s->host, s->host_cap, s->host_pinned);
		s->host = NULL;
		s->host_cap = 0;
		rc = sl__host_alloc(ld->eng->gpu.ctx ? &ld->eng->gpu : NULL, cap, (void **)&s->host, &s->host_pinned);
		if (rc)
			return rc;
		s->host_cap = cap;
	}
	if (ld->opt.gpu && size > s->dev_cap) {
		sluice_gpu_free(ld->eng, s->dev);
		s->dev = NULL;
		s->dev_cap = 0;
		rc = sluice_gpu_alloc(ld->eng, s->host_cap, (void **)&s->dev);
		if (rc)
			return sl__err(rc, "loader: GPU memory for a batch of %llu bytes: %s", (unsigned long long)size,
				       sluice_last_error_detail());
		s->dev_cap = s->host_cap;
	}
	return 0;
}

/* Batch g into slot s: ids, collation into pinned staging, and the copy to the GPU. */
static int sl_build(struct sluice_loader *ld, struct sl_bslot *s, uint64_t g)
{
	const uint32_t B = ld->opt.batch_size;
	const struct sl__cuda_api *cu = ld->eng->gpu.cu;
	struct sluice_record *rec = malloc(B * sizeof(*rec));
	uint64_t var[SLUICE_MAX_FIELDS] = { 0 }, base[SLUICE_MAX_FIELDS], offs[SLUICE_MAX_FIELDS], size = 0, t0, h2d = 0;
	uint64_t cpu0 = sl_cpu(ld);
	int rc = 0;

	uint64_t nw = ld->blast[g] - ld->bfirst[g] + 1;
	struct sl_window **wins = malloc(nw * sizeof(*wins));

	if (!rec || !wins) {
		free(rec);
		free(wins);
		return -ENOMEM;
	}
	t0 = sl__now_ns();
	rc = sl_batch_windows(ld, g, wins);
	sl__hist_add(&ld->h_swait, sl__now_ns() - t0);
	sl_span(ld, "storage wait", t0, cpu0, g);
	uint32_t m = 0; /* records kept: B, less those skipped as corrupt */

	uint64_t *pos = malloc(B * sizeof(uint64_t));

	if (!pos)
		rc = -ENOMEM;
	else if (!rc)
		rc = sl_rank_positions(ld, &ld->order, g, pos);
	for (uint32_t j = 0; j < B && !rc; j++) {
		uint64_t q = pos[j] % ld->n;
		size_t len = 0;
		const char *bytes;

		s->ids[m] = sl_at(ld, q);
		bytes = sl_lookup(wins, nw, q / ld->window, s->ids[m], &len, &rc);
		if (!rc && len == UINT32_MAX) {
			atomic_fetch_add(&ld->skipped, 1);
			continue;
		}
		if (!rc && (rc = sluice_dataset_decode(ld->ds, s->ids[m], bytes, len, &rec[m])))
			rc = sl__err(rc, "%s: record %llu: %s", ld->ds->path, (unsigned long long)s->ids[m],
				     sluice_last_error_detail());
		for (unsigned f = 0; !rc && f < ld->nf; f++)
			var[f] += rec[m].len[ld->fidx[f]];
		m += !rc;
	}
	t0 = sl__now_ns();
	cpu0 = sl_cpu(ld);
	/* Layout: per field, its data then (variable size) B + 1 offsets, each 256-byte aligned. */
	for (unsigned f = 0; !rc && f < ld->nf; f++) {
		base[f] = size;
		size = sl__align_up(size + (ld->fixed[f] ? ld->fixed[f] * m : var[f]), 256);
		offs[f] = size;
		if (!ld->fixed[f])
			size = sl__align_up(size + 8 * ((uint64_t)m + 1), 256);
	}
	/*
	 * The slot's previous copy must be done before its staging is
	 * overwritten.  It was queued a whole ring ago, so this rarely waits;
	 * the copy itself is not waited for (the consumer's stream waits on
	 * the batch's event), so a producer never waits for the consumer's GPU
	 * work while it could be collating.
	 */
	if (!rc && ld->opt.gpu) {
		h2d = sl__now_ns();
		rc = sl__gpu_bind(&ld->eng->gpu);
		if (!rc)
			rc = SL_CU(cu->EventSynchronize(s->ready), "cuEventSynchronize");
		h2d = sl__now_ns() - h2d;
	}
	if (!rc)
		rc = sl_slot_reserve(ld, s, size);
	for (unsigned f = 0; !rc && f < ld->nf; f++) {
		unsigned fi = ld->fidx[f];
		char *d = s->host + base[f];
		uint64_t *o = ld->fixed[f] ? NULL : (uint64_t *)(void *)(s->host + offs[f]), at = 0;

		for (uint32_t j = 0; j < m; j++) {
			if (ld->fixed[f] && rec[j].len[fi] != ld->fixed[f]) {
				rc = sl__err(SLUICE_EFORMAT, "%s: record %llu: field '%s' has %zu bytes, not %zu",
					     ld->ds->path, (unsigned long long)s->ids[j], ld->ds->fields[fi].name,
					     rec[j].len[fi], ld->fixed[f]);
				break;
			}
			if (o)
				o[j] = at;
			memcpy(d + at, rec[j].data[fi], rec[j].len[fi]);
			at += rec[j].len[fi];
		}
		if (o)
			o[m] = at;
	}
	free(rec);
	free(wins);
	free(pos);
	if (rc)
		return rc;
	sl__hist_add(&ld->h_collate, sl__now_ns() - t0);
	sl_span(ld, "collate", t0, cpu0, g);
	if (ld->opt.gpu) {
		t0 = sl__now_ns();
		cpu0 = sl_cpu(ld);
		rc = sl__gpu_bind(&ld->eng->gpu);
		/* The consumer's stream must be done with this slot's previous batch. */
		if (!rc && s->release_set)
			rc = SL_CU(cu->StreamWaitEvent(ld->copy, s->release, 0), "cuStreamWaitEvent");
		if (!rc)
			rc = SL_CU(cu->MemcpyHtoDAsync((sl_CUdeviceptr)(uintptr_t)s->dev, s->host, size, ld->copy),
				   "cuMemcpyHtoDAsync");
		if (!rc)
			rc = SL_CU(cu->EventRecord(s->ready, ld->copy), "cuEventRecord");
		if (rc)
			return rc;
		/* The H2D stage: the wait for the slot's previous copy, and queueing this one. */
		sl__hist_add(&ld->h_h2d, h2d + sl__now_ns() - t0);
		sl_span(ld, "h2d", t0, cpu0, g);
	}
	/* The batch as the consumer sees it. */
	char *mem = ld->opt.gpu ? s->dev : s->host;

	memset(&s->b, 0, sizeof(s->b));
	s->b.index = g;
	s->b.size = m;
	s->b.nfields = ld->nf;
	s->b.ids = s->ids;
	s->b.event = ld->opt.gpu ? (void *)s->ready : NULL;
	for (unsigned f = 0; f < ld->nf; f++) {
		struct sluice_batch_field *bf = &s->b.field[f];

		bf->name = ld->ds->fields[ld->fidx[f]].name;
		bf->dtype = ld->ds->fields[ld->fidx[f]].dtype;
		bf->data = mem + base[f];
		bf->offsets = ld->fixed[f] ? NULL : (uint64_t *)(void *)(mem + offs[f]);
		bf->host_offsets = ld->fixed[f] ? NULL : (const uint64_t *)(void *)(s->host + offs[f]);
		bf->item_bytes = ld->fixed[f];
	}
	atomic_fetch_add(&ld->bytes, size);
	atomic_fetch_add(&ld->records, m);
	return 0;
}

/*
 * Under ld->lock: the windows before those of the oldest batch being built
 * (or, with none, the next to be taken) are done with.
 */
static void sl_set_low(struct sluice_loader *ld)
{
	uint64_t g = ld->produce_g;

	for (unsigned i = 0; i < ld->nslots; i++)
		if (ld->slots[i].state == SL_B_BUILDING && ld->slots[i].g < g)
			g = ld->slots[i].g;
	if (g < ld->nbatches)
		ld->low = ld->bfirst[g];
	pthread_cond_broadcast(&ld->cv);
}

/* SL_PRODUCERS of these take batches in order, each building its own in its slot. */
static void *sl_produce(void *arg)
{
	struct sluice_loader *ld = arg;

	if (ld->opt.gpu)
		sl__gpu_bind(&ld->eng->gpu);
	pthread_mutex_lock(&ld->lock);
	for (;;) {
		struct sl_bslot *s;
		uint64_t g;
		int rc;

		uint64_t t0 = sl__now_ns(), cpu0 = sl_cpu(ld);

		while (!ld->stop && !ld->err && ld->produce_g < ld->nbatches &&
		       ld->slots[ld->produce_g % ld->nslots].state != SL_B_FREE)
			pthread_cond_wait(&ld->slot_cv, &ld->lock);
		sl_span(ld, "slot wait", t0, cpu0, ld->produce_g);
		if (ld->stop || ld->err || ld->produce_g >= ld->nbatches)
			break;
		g = ld->produce_g++;
		s = &ld->slots[g % ld->nslots];
		s->g = g;
		s->state = SL_B_BUILDING;
		/* The next slot may be free already: the other producer takes it. */
		if (ld->produce_g < ld->nbatches && ld->slots[ld->produce_g % ld->nslots].state == SL_B_FREE)
			pthread_cond_signal(&ld->slot_cv);
		sl_set_low(ld);
		pthread_mutex_unlock(&ld->lock);
		rc = sl_build(ld, s, g);
		pthread_mutex_lock(&ld->lock);
		if (rc) {
			s->state = SL_B_FREE;
			sl_fail(ld, rc);
		} else {
			s->state = SL_B_READY;
			if (g == ld->next_g)
				pthread_cond_signal(&ld->batch_cv);
		}
		sl_set_low(ld);
	}
	pthread_mutex_unlock(&ld->lock);
	return NULL;
}

/* Stops the loader's threads and waits for them. */
static void sl_halt(struct sluice_loader *ld)
{
	pthread_mutex_lock(&ld->lock);
	ld->stop = 1;
	sl_wake_all(ld);
	pthread_mutex_unlock(&ld->lock);
	while (ld->producers_running)
		pthread_join(ld->producer[--ld->producers_running], NULL);
	while (ld->readers_running)
		pthread_join(ld->reader[--ld->readers_running], NULL);
	ld->stop = 0;
}

static void sl_stop(struct sluice_loader *ld)
{
	if (!ld->running)
		return;
	sl_halt(ld);
	ld->running = 0;
}

/* (Re)starts production at the consumer's next batch of the current epoch. */
static int sl_start(struct sluice_loader *ld)
{
	int rc;

	uint64_t keep = 0;

	/* This epoch's order: the one made ahead, if it is this epoch's; and the next epoch's. */
	if (ld->next_order.perm && ld->next_order.epoch == ld->opt.epoch) {
		struct sl__order t = ld->order;

		ld->order = ld->next_order;
		ld->next_order = t;
	} else {
		sl__order_free(&ld->order);
		rc = sl__order_init(&ld->order, ld->shard_records, ld->nshards, ld->opt.seed, ld->opt.epoch, ld->window,
				    ld->chunk);
		if (rc)
			return rc;
	}
	sl__order_free(&ld->next_order);
	rc = sl__order_init(&ld->next_order, ld->shard_records, ld->nshards, ld->opt.seed, ld->opt.epoch + 1,
			    ld->window, ld->chunk);
	if (rc)
		return rc;
	rc = sl_plan_windows(ld);
	if (rc)
		return rc;
	/* Windows read ahead for this epoch from its start: places 0, 1, ... in hand. */
	for (int found = ld->next_g == 0; found && keep < ld->nseq;) {
		found = 0;
		for (unsigned i = 0; i < ld->nwin && !found; i++)
			found = ld->win[i].state == SL_W_READY && ld->win[i].epoch == ld->opt.epoch && ld->win[i].idx == keep;
		keep += (uint64_t)found;
	}
	for (unsigned i = 0; i < ld->nwin; i++)
		if (!(ld->win[i].state == SL_W_READY && ld->win[i].epoch == ld->opt.epoch && ld->win[i].idx < keep))
			ld->win[i].state = SL_W_EMPTY;
	ld->pre_next = 0;
	ld->preloaded += keep;
	ld->low = ld->next_g < ld->nbatches ? ld->bfirst[ld->next_g] : 0;
	for (unsigned i = 0; i < ld->nslots; i++)
		if (ld->slots[i].state != SL_B_OUT)
			ld->slots[i].state = SL_B_FREE;
	ld->produce_g = ld->next_g;
	ld->filling = 1;
	ld->err = 0;
	ld->read_next = ld->next_g < ld->nbatches ? ld->bfirst[ld->next_g] + keep : ld->nseq;
	for (rc = 0; !rc && ld->readers_running < SL_READERS; ld->readers_running++)
		rc = pthread_create(&ld->reader[ld->readers_running], NULL, sl_read_ahead, ld);
	if (rc)
		ld->readers_running--;
	for (; !rc && ld->producers_running < SL_PRODUCERS; ld->producers_running++)
		rc = pthread_create(&ld->producer[ld->producers_running], NULL, sl_produce, ld);
	if (rc && ld->producers_running)
		ld->producers_running--;
	if (rc) {
		sl_halt(ld);
		return sl__err(-rc, "loader: starting its threads");
	}
	ld->running = 1;
	return 0;
}

int sluice_loader_open(struct sluice_loader **out, struct sluice_engine *eng, struct sluice_dataset *ds,
		       const struct sluice_loader_options *opt)
{
	struct sluice_loader *ld;
	uint64_t bytes = 0, world, guess = 0;
	int rc = 0;

	*out = NULL;
	sl__err_clear();
	if (!opt || !opt->batch_size)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: batch_size must be at least 1");
	world = opt->world_size ? opt->world_size : 1;
	if (opt->rank >= world)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: rank %u is not below world_size %llu", opt->rank,
			       (unsigned long long)world);
	if (opt->gpu && !eng->gpu.ctx)
		return sl__err(SLUICE_ENOGPU, "loader: gpu set, but the engine has no GPU");
	if (sluice_dataset_count(ds) == 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: %s holds no records", ds->path);
	if ((uint64_t)opt->batch_size * world > sluice_dataset_count(ds))
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: a global batch (%u x %llu ranks) is larger than %s (%llu records)",
			       opt->batch_size, (unsigned long long)world, ds->path,
			       (unsigned long long)sluice_dataset_count(ds));
	ld = calloc(1, sizeof(*ld));
	if (!ld)
		return -ENOMEM;
	ld->eng = eng;
	ld->ds = ds;
	ld->opt = *opt;
	ld->opt.world_size = (unsigned)world;
	ld->opt.fields = NULL;
	pthread_mutex_init(&ld->lock, NULL);
	pthread_cond_init(&ld->cv, NULL);
	pthread_cond_init(&ld->slot_cv, NULL);
	pthread_cond_init(&ld->batch_cv, NULL);
	*out = ld;
	/* Fields to load. */
	for (unsigned f = 0; f < sluice_dataset_nfields(ds) && !opt->fields; f++)
		ld->fidx[ld->nf++] = f;
	for (const char *const *name = opt->fields; name && *name; name++) {
		unsigned f = 0;

		while (f < sluice_dataset_nfields(ds) && strcmp(sluice_dataset_field(ds, f)->name, *name))
			f++;
		if (f == sluice_dataset_nfields(ds) || ld->nf == SLUICE_MAX_FIELDS) {
			rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: %s has no field '%s'", ds->path, *name);
			goto fail;
		}
		ld->fidx[ld->nf++] = f;
	}
	if (!ld->nf) {
		rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: no fields to load");
		goto fail;
	}
	for (unsigned f = 0; f < ld->nf; f++)
		ld->fixed[f] = sl__field_fixed_size(sluice_dataset_field(ds, ld->fidx[f]));
	/* Sizes: records, the shuffle window (from the average record), batches per epoch. */
	ld->n = sluice_dataset_count(ds);
	ld->shard_records = malloc(sluice_dataset_shards(ds) * sizeof(uint64_t));
	if (!ld->shard_records) {
		rc = -ENOMEM;
		goto fail;
	}
	ld->nshards = sluice_dataset_shards(ds);
	for (unsigned s = 0; s < sluice_dataset_shards(ds); s++) {
		uint64_t r = UINT64_MAX, b = 0;

		if (sluice_dataset_shard_info(ds, s, &r, &b))
			r = UINT64_MAX;
		ld->shard_records[s] = r;
		bytes += b;
		/* A format that does not count records per file: one run for the shard permutation. */
		if (r == UINT64_MAX)
			ld->nshards = 1;
	}
	if (ld->nshards == 1)
		ld->shard_records[0] = sluice_dataset_count(ds);
	{
		uint64_t avg = bytes / ld->n ? bytes / ld->n : 1, wb = opt->window_bytes ? opt->window_bytes : 64ull << 20;

		/*
		 * A window is SL_CHUNKS chunks from all over the dataset, each at
		 * least SL_CHUNK_MIN bytes so that its reads stay large (small
		 * windows are one chunk).
		 */
		uint64_t cb = wb / SL_CHUNKS > SL_CHUNK_MIN ? wb / SL_CHUNKS : SL_CHUNK_MIN;

		ld->window = wb / avg ? wb / avg : 1;
		if (ld->window > ld->n)
			ld->window = ld->n;
		ld->chunk = cb / avg ? cb / avg : 1;
		if (ld->chunk > ld->window)
			ld->chunk = ld->window;
		ld->window -= ld->window % ld->chunk;
	}
	{
		const char *e = getenv("SLUICE_STATS");
		char *end = NULL;
		double secs = e && *e ? strtod(e, &end) : 0;

		if (e && *e && (!end || *end || !(secs > 0) || secs > 86400)) {
			rc = sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_STATS='%s': want seconds between loader log lines, e.g. 10", e);
			goto fail;
		}
		ld->stats_every = (uint64_t)(secs * 1e9);
	}
	if ((rc = sl__trace_open(&ld->trace, getenv("SLUICE_TRACE"))))
		goto fail;
	{
		/* A batch's bytes, guessed from the fields; variable-size ones share what the record holds beyond its fixed ones. */
		uint64_t fixed = 0, avg = bytes / ld->n, nvar = 0, nvar_loaded = 0;

		for (unsigned f = 0; f < sluice_dataset_nfields(ds); f++) {
			uint64_t z = sl__field_fixed_size(sluice_dataset_field(ds, f));

			fixed += z;
			nvar += !z;
		}
		for (unsigned f = 0; f < ld->nf; f++) {
			nvar_loaded += !ld->fixed[f];
			guess = sl__align_up(guess + ld->fixed[f] * opt->batch_size + (ld->fixed[f] ? 0 : 8 * (opt->batch_size + 1ull)), 256) + 256;
		}
		if (nvar_loaded && avg > fixed)
			guess += (avg - fixed) * opt->batch_size / nvar * nvar_loaded;
	}
	ld->per_global = (uint64_t)opt->batch_size * world;
	ld->nbatches = opt->drop_last ? ld->n / ld->per_global : (ld->n + ld->per_global - 1) / ld->per_global;
	if (opt->position % ld->per_global || opt->position > ld->nbatches * ld->per_global) {
		rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: position %llu is not a multiple of the global batch (%llu) inside the epoch",
			     (unsigned long long)opt->position, (unsigned long long)ld->per_global);
		goto fail;
	}
	ld->next_g = opt->position / ld->per_global;
	/*
	 * A batch may span several windows; keep them all, one more for each
	 * further producer's batch, and for each reader one loading and one ready.
	 */
	ld->nwin = (unsigned)((ld->opt.batch_size + ld->window - 1) / ld->window + SL_PRODUCERS - 1 + 2 * SL_READERS);
	/* Prefetch: 8 batches ahead, fewer (down to 4) when they are large, or as asked. */
	ld->nslots = 1 + (opt->prefetch ? opt->prefetch : guess > (64ull << 20) ? 4 : guess > (32ull << 20) ? 6 : 8);
	ld->win = calloc(ld->nwin, sizeof(*ld->win));
	ld->slots = calloc(ld->nslots, sizeof(*ld->slots));
	if (!ld->win || !ld->slots) {
		rc = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < ld->nslots && !rc; i++) {
		ld->slots[i].ids = malloc(opt->batch_size * sizeof(uint64_t));
		if (!ld->slots[i].ids)
			rc = -ENOMEM;
	}
	if (!rc && opt->gpu) {
		const struct sl__cuda_api *cu = eng->gpu.cu;

		rc = sl__gpu_bind(&eng->gpu);
		if (!rc)
			rc = SL_CU(cu->StreamCreate(&ld->copy, SL_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
		for (unsigned i = 0; i < ld->nslots && !rc; i++) {
			rc = SL_CU(cu->EventCreate(&ld->slots[i].ready, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
			if (!rc)
				rc = SL_CU(cu->EventCreate(&ld->slots[i].release, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
		}
	}
	/*
	 * The ring is allocated here rather than by the first batches (pinning
	 * and GPU allocations take milliseconds each); a larger batch grows its slot.
	 */
	for (unsigned i = 0; i < ld->nslots && !rc; i++)
		rc = sl_slot_reserve(ld, &ld->slots[i], guess);
	/*
	 * So are the windows' buffers, for a window of average records, and
	 * touched: fresh memory costs a fault per page (in a VM the host's too),
	 * which the first epoch's reads would otherwise pay.
	 */
	for (unsigned i = 0; i < ld->nwin && !rc; i++) {
		struct sl_window *win = &ld->win[i];

		rc = sl_window_reserve(win, ((ld->window + world - 1) / world) * sl__align_up(bytes / ld->n, 8));
		if (!rc)
			memset(win->buf, 0, win->cap);
	}
	if (!rc)
		rc = sl_start(ld);
	if (!rc)
		return 0;
fail:
	sluice_loader_close(ld);
	*out = NULL;
	return rc;
}

/*
 * Gives back the batch the consumer holds, ordered after its stream's work:
 * the event is recorded outside the lock (the slot is the consumer's until
 * its state changes); sl_free_slot, under the lock, hands it to a producer.
 */
static struct sl_bslot *sl_release(struct sluice_loader *ld, void *stream)
{
	struct sl_bslot *s = ld->held;

	ld->held = NULL;
	if (s && ld->opt.gpu && sl__gpu_bind(&ld->eng->gpu) == 0)
		s->release_set = ld->eng->gpu.cu->EventRecord(s->release, (sl_CUstream)stream) == SL_CUDA_SUCCESS;
	return s;
}

/*
 * Under ld->lock: the slot is free again; 1 if a producer is to be woken,
 * which the caller does once it has let go of the lock (the producer then
 * does not wake only to wait for it).  A producer is woken for every slot
 * given back, so the ring stays full: waking them only once half of it is
 * free saves the consumer about a microsecond a call, but leaves half the
 * ring to absorb hiccups when the step is barely longer than the loader's
 * time per batch.
 */
static int sl_free_slot(struct sl_bslot *s)
{
	if (!s || s->state != SL_B_OUT)
		return 0;
	s->state = SL_B_FREE;
	return 1;
}

static void sl_give_back(struct sluice_loader *ld, void *stream)
{
	struct sl_bslot *s = sl_release(ld, stream);
	int wake;

	pthread_mutex_lock(&ld->lock);
	wake = sl_free_slot(s);
	pthread_mutex_unlock(&ld->lock);
	if (wake)
		pthread_cond_signal(&ld->slot_cv);
}

/*
 * Where the time goes, by the method of the book chapter (seeds/002): the
 * loader's own time per batch (storage and collation, then the copy)
 * against the consumer's step time (its time between calls, waits
 * excluded) and the share of the consumer's time spent waiting (the GPU
 * idle, when the consumer is a training loop).
 */
struct sl_verdict {
	double wait_share, wait_share_all, step_us, produce_us, h2d_us; /* wait_share leaves out the fills */
	const char *verdict;
};

static struct sl_verdict sl_verdict(const struct sluice_loader *ld)
{
	struct sl_verdict v = { 0, 0, 0, 0, 0, "no batches yet" };
	uint64_t nb = atomic_load(&ld->h_wait.n), wait = atomic_load(&ld->h_wait.sum);
	double wall = (double)(ld->t_last - ld->t_first);
	uint64_t made = atomic_load(&ld->h_collate.n);

	if (nb < 2 || !made)
		return v;
	v.wait_share_all = wall > 0 ? (double)wait / wall : 0;
	v.wait_share = wall > (double)ld->fill_ns ? (double)(wait - ld->fill_ns) / (wall - (double)ld->fill_ns) : 0;
	v.step_us = (wall - (double)wait) / (double)(nb - 1) / 1e3;
	v.produce_us = (double)(atomic_load(&ld->h_read.sum) + atomic_load(&ld->h_collate.sum)) / (double)made / 1e3;
	v.h2d_us = ld->opt.gpu ? (double)atomic_load(&ld->h_h2d.sum) / (double)made / 1e3 : 0;
	if (v.wait_share < 0.05)
		v.verdict = "compute-bound";
	else if (v.produce_us > v.step_us || !ld->opt.gpu)
		v.verdict = "loader-bound";
	else
		v.verdict = "transfer-bound";
	return v;
}

int sluice_loader_next(struct sluice_loader *ld, struct sluice_batch *b, void *stream)
{
	struct sl_bslot *s;
	uint64_t t0 = sl__now_ns(), cpu0 = sl_cpu(ld);
	int rc = 0, wake;

	sl__err_clear();
	s = sl_release(ld, stream);
	pthread_mutex_lock(&ld->lock);
	wake = sl_free_slot(s);
	if (ld->next_g >= ld->nbatches) {
		pthread_mutex_unlock(&ld->lock);
		if (wake)
			pthread_cond_signal(&ld->slot_cv);
		return 0;
	}
	s = &ld->slots[ld->next_g % ld->nslots];
	if (wake && !(s->state == SL_B_READY && s->g == ld->next_g)) {
		pthread_cond_signal(&ld->slot_cv); /* before waiting: the producer may make the very batch awaited */
		wake = 0;
	}
	while (!(s->state == SL_B_READY && s->g == ld->next_g) && !ld->err)
		pthread_cond_wait(&ld->batch_cv, &ld->lock);
	if (s->state == SL_B_READY && s->g == ld->next_g) {
		s->state = SL_B_OUT;
		ld->held = s;
		*b = s->b;
		ld->next_g++;
		ld->delivered++;
	} else {
		s = NULL;
		rc = sl__err(ld->err, "%s", ld->detail);
	}
	pthread_mutex_unlock(&ld->lock);
	if (wake)
		pthread_cond_signal(&ld->slot_cv);
	/*
	 * The caller's stream waits for the copy, so work queued on it sees the
	 * batch; with no stream, the copy is waited for here.  Outside the lock:
	 * the slot is the consumer's now, and the producers need the lock.
	 */
	if (s && ld->opt.gpu && sl__gpu_bind(&ld->eng->gpu) == 0)
		rc = stream ? SL_CU(ld->eng->gpu.cu->StreamWaitEvent((sl_CUstream)stream, s->ready, 0), "cuStreamWaitEvent")
			    : SL_CU(ld->eng->gpu.cu->EventSynchronize(s->ready), "cuEventSynchronize");
	uint64_t waited = sl__now_ns() - t0;

	sl__hist_add(&ld->h_wait, waited);
	sl_span(ld, "next", t0, cpu0, ld->next_g - 1);
	if (ld->filling) {
		ld->fill_ns += waited;
		ld->filling = 0;
	}
	if (!ld->t_first)
		ld->t_first = t0;
	ld->t_last = sl__now_ns();
	if (ld->stats_every && ld->t_last - ld->t_logged >= ld->stats_every) {
		struct sl_verdict v = sl_verdict(ld);

		ld->t_logged = ld->t_last;
		sl__stat("loader", "batch %llu: GPU wait %.1f%%, step %.0f us, loader %.0f us (h2d %.0f us) a batch: %s",
			(unsigned long long)ld->next_g, 100 * v.wait_share, v.step_us, v.produce_us, v.h2d_us, v.verdict);
	}
	return rc ? rc : 1;
}

uint64_t sluice_loader_batches(const struct sluice_loader *ld)
{
	return ld->nbatches;
}

void sluice_loader_state(const struct sluice_loader *ld, uint64_t *seed, uint64_t *epoch, uint64_t *position)
{
	*seed = ld->opt.seed;
	*epoch = ld->opt.epoch;
	*position = ld->next_g * ld->per_global;
}

int sluice_loader_set_epoch(struct sluice_loader *ld, uint64_t e)
{
	sl_stop(ld);
	sl_give_back(ld, NULL);
	ld->opt.epoch = e;
	ld->next_g = 0;
	return sl_start(ld);
}

size_t sluice_loader_stats_json(struct sluice_loader *ld, char *buf, size_t cap)
{
	const struct sl__hist *h[] = { &ld->h_read, &ld->ds->h_decompress, &ld->h_swait, &ld->h_collate, &ld->h_h2d,
				       &ld->h_wait };
	static const char *const name[] = { "read", "decompress", "storage_wait", "collate", "h2d", "consumer_wait" };
	size_t l = 0;

#define SL_PUT(...) (l += (size_t)snprintf(buf + (l < cap ? l : cap), l < cap ? cap - l : 0, __VA_ARGS__))
	uint64_t all = atomic_load(&ld->record_bytes);

	SL_PUT("{\"batches\":%llu,\"records\":%llu,\"bytes\":%llu,\"window_records\":%llu,"
	       "\"read_bytes\":%llu,\"read_ios\":%llu,\"sequential_fraction\":%.4f,\"skipped\":%llu,"
	       "\"windows_read_ahead\":%llu,\"stages\":{",
	       (unsigned long long)ld->delivered, (unsigned long long)atomic_load(&ld->records),
	       (unsigned long long)atomic_load(&ld->bytes), (unsigned long long)ld->window,
	       (unsigned long long)atomic_load(&ld->read_bytes), (unsigned long long)atomic_load(&ld->read_ios),
	       all ? (double)atomic_load(&ld->seq_bytes) / (double)all : 0.0, (unsigned long long)atomic_load(&ld->skipped),
	       (unsigned long long)ld->preloaded);
	for (unsigned i = 0; i < sizeof(h) / sizeof(h[0]); i++)
		SL_PUT("%s\"%s\":{\"count\":%llu,\"total_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f}", i ? "," : "", name[i],
		       (unsigned long long)atomic_load(&h[i]->n), (double)atomic_load(&h[i]->sum) / 1e3,
		       (double)sl__hist_percentile(h[i], 50) / 1e3, (double)sl__hist_percentile(h[i], 99) / 1e3);
	struct sl_verdict v = sl_verdict(ld);

	SL_PUT("},\"gpu_wait_share\":%.4f,\"fill_us\":%.1f,\"gpu_wait_share_with_fill\":%.4f,\"step_us\":%.1f,"
	       "\"loader_us\":%.1f,\"h2d_us\":%.1f,\"verdict\":\"%s\"}",
	       v.wait_share, (double)ld->fill_ns / 1e3, v.wait_share_all, v.step_us, v.produce_us, v.h2d_us, v.verdict);
#undef SL_PUT
	return l;
}

void sluice_loader_close(struct sluice_loader *ld)
{
	if (!ld)
		return;
	sl_stop(ld);
	if (ld->opt.gpu && ld->eng->gpu.ctx && sl__gpu_bind(&ld->eng->gpu) == 0 && ld->copy)
		ld->eng->gpu.cu->StreamSynchronize(ld->copy);
	for (unsigned i = 0; ld->slots && i < ld->nslots; i++) {
		struct sl_bslot *s = &ld->slots[i];

		sl__host_free(&ld->eng->gpu, s->host, s->host_cap, s->host_pinned);
		sluice_gpu_free(ld->eng, s->dev);
		if (s->ready)
			ld->eng->gpu.cu->EventDestroy(s->ready);
		if (s->release)
			ld->eng->gpu.cu->EventDestroy(s->release);
		free(s->ids);
	}
	for (unsigned i = 0; ld->win && i < ld->nwin; i++) {
		free(ld->win[i].ids);
		free(ld->win[i].off);
		free(ld->win[i].len);
		sl__host_free(NULL, ld->win[i].buf, ld->win[i].cap, 0);
	}
	if (ld->copy)
		ld->eng->gpu.cu->StreamDestroy(ld->copy);
	sl__order_free(&ld->order);
	sl__order_free(&ld->next_order);
	free(ld->seq);
	free(ld->bfirst);
	free(ld->blast);
	free(ld->win);
	free(ld->slots);
	free(ld->shard_records);
	if (sl__trace_close(ld->trace))
		sl__warn("loader", "%s", sluice_last_error_detail());
	pthread_mutex_destroy(&ld->lock);
	pthread_cond_destroy(&ld->cv);
	pthread_cond_destroy(&ld->slot_cv);
	pthread_cond_destroy(&ld->batch_cv);
	free(ld);
}
