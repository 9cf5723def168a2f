/*
 * loader: batches of dataset records for a training loop.  order.c: which
 * records; window.c: reading them; collate.c: batches into the ring;
 * ring.c: the consumer; stats.c: where the time goes; stage.c: the
 * stages stored bytes pass through (zstd blocks, images); loader.c: open,
 * start, stop and close.
 * This header is the loader's state, which the stages share; the stages
 * call one way (loader.c -> collate.c -> window.c), never back into
 * loader.c.  Depends on engine/, format/, gpu/ (batches land in GPU
 * memory), image/ (images decoded and augmented), diag/ (the figures
 * it publishes) and dsread/ (windows read, their zstd blocks decoded by
 * nvCOMP on the GPU or the CPU).
 */
#ifndef SL_LOADER_STATE_H
#define SL_LOADER_STATE_H

#include <stdio.h>

#include "core/core.h"

/*
 * One phase of an epoch in the order's view (order.c): the nodes it ran
 * on, the positions of each node's sequence consumed in it (0 for the
 * current phase), and the records of the epoch left after it.
 */
struct sl__order_level {
	unsigned nodes;
	uint64_t done;
	uint64_t left;
};

/*
 * Where a rank's sequence lies in the epoch's order (order.c).  Level 0's
 * node k reads its own range of S, permuted (sl__order_init); a later
 * level's nodes cut what the phase before left (its nodes' unconsumed tails,
 * concatenated in node order) into equal contiguous ranges.  The last level
 * is the current phase; the rank's sequence is [lo, lo + len) of what its
 * nodes cut, its node's range (the whole of it when that range is empty, so
 * that such a node can still fill a batch).
 */
struct sl__order_view {
	int shuffle;                /* 0: S is the dataset's order and nothing is permuted */
	unsigned nlev;              /* levels, the current one included: 1 + the resumed phases */
	struct sl__order_level lev[SLUICE_LOADER_SEGMENTS_MAX];
	unsigned node;
	uint64_t lo, len;
	uint64_t shortest, longest; /* the current phase's shortest and longest node sequences */
};

/*
 * A deterministic epoch order (order.c).  Only (seed, epoch, window, chunk),
 * the shard sizes and the view's node counts decide it.
 */
struct sl__order {
	uint64_t n;          /* records */
	uint64_t epoch;
	uint64_t window;     /* records per shuffle window */
	uint64_t chunk;      /* records per chunk: windows are made of chunks from all over the node's range */
	uint64_t nchunks;    /* whole chunks of S, which one node permutes; the records after them stay last */
	uint64_t key;        /* one node's; a node's chunks are permuted by sl_mix of its key */
	unsigned nshards;
	unsigned *perm;      /* shard order */
	uint64_t *start;     /* position in the permuted sequence where perm[s] starts; [nshards] = n */
	uint64_t *first;     /* global id of each shard's first record */
	struct sl__order_view view; /* whose sequence sl__order_at walks: one node's, from the epoch's start */
};
/* The order of an epoch, shuffled, on one node from its start (sl__order_set_view changes that). */
SL_HIDDEN int sl__order_init(struct sl__order *o, const uint64_t *shard_records, unsigned nshards,
			     uint64_t seed, uint64_t epoch, uint64_t window, uint64_t chunk);
SL_HIDDEN void sl__order_free(struct sl__order *o);
/* The record at position p (< o->view.len) of the view's sequence. */
SL_HIDDEN uint64_t sl__order_at(const struct sl__order *o, uint64_t p);
/*
 * The view of node `node` of `nodes` over an epoch of n records, resumed
 * from the segments seg[0, nseg) (sluice_loader_state_ex's, oldest first;
 * none: from the start), made canonical: phases that consumed nothing
 * dropped (but a first one that later ones cut), neighbours on the same
 * node count merged, and a last one on `nodes` nodes continued rather than
 * cut again: the position it reached into *position (0 otherwise; position
 * may be NULL).  0, or SLUICE_EINVAL_CONFIG naming what is wrong (a segment
 * of 0 nodes; more segments than a state can carry).
 */
SL_HIDDEN int sl__order_view_init(struct sl__order_view *v, uint64_t n, int shuffle, unsigned nodes, unsigned node,
				  const struct sluice_loader_segment *seg, unsigned nseg, uint64_t *position);
static inline void sl__order_set_view(struct sl__order *o, const struct sl__order_view *v)
{
	o->view = *v;
}
/* Records of S that node `node` of `nodes` reads in an epoch from its start: [*lo, *hi). */
SL_HIDDEN void sl__order_node_range(const struct sl__order *o, unsigned nodes, unsigned node, uint64_t *lo,
				    uint64_t *hi);
/*
 * The dataset's shards (indexes into shard_records) that node `node` of
 * `nodes` reads in an epoch from its start, each once, in the order its
 * windows first reach them (S order when not shuffled): out needs room for
 * o->nshards, *n is set to the count.  For a cache told what to fetch, and
 * in what order.  0 or -ENOMEM.
 */
SL_HIDDEN int sl__order_node_shards(const struct sl__order *o, unsigned nodes, unsigned node, unsigned *out,
				    unsigned *n);
/* Records of the epoch consumed once every node of the view's current phase consumed c of its sequence. */
SL_HIDDEN uint64_t sl__order_consumed(const struct sl__order_view *v, uint64_t n, uint64_t c);

/* ---- the loader's state, shared by its stages (loader.c, window.c, collate.c, ring.c, stats.c) ---- */

#include <pthread.h>

#include "gpu/gpu.h"
#include "image/image.h"

enum { SL_B_FREE = 0, SL_B_BUILDING, SL_B_READY, SL_B_OUT };

struct sl__batch_buf {
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
	int err;                    /* building batch g failed: its own error, which the consumer reports for it */
	char detail[384];
	/* hold: the batch handed out in it (SL_B_OUT), the references the caller holds and the stream it took it on */
	uint64_t token;
	unsigned refs;
	void *stream;
};

/*
 * hold: the memory of a batch the caller still holds when the ring needs
 * its buffer again (the producer moves it here and gives the buffer a
 * spare's memory), or a spare (token 0) that a later batch takes.  Its
 * fields are a batch buffer's own, swapped whole (sl__hold_swap).
 */
struct sl__held {
	uint64_t token;
	unsigned refs;
	void *stream;
	char *host;
	size_t host_cap;
	int host_pinned;
	char *dev;
	size_t dev_cap;
	uint64_t *ids;
	sl_CUevent ready, release; /* its last copy to the GPU (its staging is free once it is done), the caller's */
	int release_set;
};

enum { SL_W_EMPTY = 0, SL_W_LOADING, SL_W_READY, SL_W_FAILED }; /* FAILED: its read's error kept in it */

#define SL_READERS 2   /* reader threads, each with one window's I/O in flight */
#define SL_WINDOWS_MAX 4096 /* windows one batch may draw on (its global batch over window_bytes) */
#define SL_READERS_GPU_ZSTD 4 /* with nvCOMP decoding: a window's read, decode and copies are serial in its reader */
#define SL_PRODUCERS 2 /* threads collating batches, each its own, into their buffers */
/*
 * With images decoded on the GPU: nvJPEG's hardware path waits on each
 * image's small steps, so more batches are kept in flight
 * (SLUICE_IMAGE_PRODUCERS, at most this).
 */
#define SL_PRODUCERS_MAX 8
#define SL_CHUNKS 16           /* chunks a shuffle window is made of (order.c) */
#define SL_CHUNK_MIN (1 << 20) /* bytes of a chunk at least */

struct sl__window {
	int state;
	int err;                    /* SL_W_FAILED: the read's error, and its detail */
	char detail[256];
	uint64_t idx;               /* place in the epoch's window sequence (ld->seq) */
	uint64_t epoch;             /* the epoch it was read for: this one, or the next (read ahead) */
	uint64_t w;                 /* window number */
	uint64_t *ids;              /* sorted record ids */
	uint64_t *off;              /* where each starts in buf */
	uint32_t *len;              /* and its length */
	size_t n;
	char *buf;
	size_t cap;
	int pinned;                 /* buf registered with the loader's GPU (ld->win_pin) */
};

/* A producer thread's own: its stream (GPU loaders); a stage's state per producer is the stage's (ld->prod[i] is i). */
struct sl__producer {
	struct sluice_loader *ld;
	sl_CUstream stream;
};

/* What the stages counted (stats). */
struct sl__stage_counts {
	uint64_t images_gpu, images_cpu, nvjpeg_calls;
	uint64_t image_batches_gpu, image_ns[SL_IMG_PHASES]; /* batches through a GPU pipeline, their host time by phase */
};

/*
 * A stage (stage.c): one step that turns stored bytes into what a batch
 * holds, with a state of its own (struct sl__stage's), its setup, run,
 * close, stats and error policy; the loader keeps a table of those its
 * dataset and options call for, in the order they run.  A window stage
 * runs where a reader reads a window (zstd: its blocks decoded, by nvCOMP
 * or the CPU), with a state of each reader's own; a field stage makes one
 * field of a batch in each producer, a dense array at the head of the
 * batch buffer (images: nvJPEG and a kernel, or the CPU), and says what
 * the field holds.  The fields no stage makes are collated as stored
 * (collate.c), the caller's transform runs last.  One stage a field, and
 * one window stage a loader.
 */
struct sl__stage;
struct sl__stage_ops {
	const char *name;
	int window;                 /* 1: a window stage; 0: a field stage */
	/*
	 * 1 where the loader needs it (st->state set up; a field stage's
	 * st->field named), 0 where not, or an error (nothing left to close).
	 */
	int (*setup)(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st);
	void (*close)(struct sl__stage *st);
	/* A window stage: the readers it wants (0: the loader's default); a reader's state, passed to its reads. */
	unsigned (*readers)(const struct sl__stage *st);
	int (*reader_open)(const struct sl__stage *st, void **state);
	void (*reader_close)(void *state);
	/* A field stage: bytes its field of m records takes (a bound, known before it runs). */
	uint64_t (*bound)(const struct sl__stage *st, uint64_t m);
	/* 1 if producer p writes the field in GPU memory itself (nothing to copy up). */
	int (*on_gpu)(const struct sl__stage *st, unsigned p);
	/*
	 * Buffer s's field at byte at (GPU memory where on_gpu, else host
	 * staging) from the m records; records it refuses fail the batch, or
	 * with st->skip_bad are left out (rec and s->ids closed up, *m less).
	 */
	int (*run)(struct sl__stage *st, struct sl__producer *p, struct sl__batch_buf *s, struct sluice_record *rec,
		   uint32_t *m, uint64_t at);
	/* The field's dtype, shape and strides in a batch of m. */
	void (*describe)(const struct sl__stage *st, uint64_t m, struct sluice_batch_field *bf);
	/* Its counts added to c (NULL: none). */
	void (*counts)(const struct sl__stage *st, struct sl__stage_counts *c);
};

struct sl__stage {
	const struct sl__stage_ops *ops;
	struct sluice_loader *ld;
	void *state;                /* the stage's own */
	int field;                  /* a field stage's field: its place among the loaded ones; else -1 */
	int skip_bad;               /* its error policy: a record it refuses is left out (skip_corrupt), or fails the batch */
};
#define SL_STAGES_MAX 4

/* The calls into a stage (STYLE: through these, never ops-> in the middle of logic). */
static inline uint64_t sl__stage_bound(const struct sl__stage *st, uint64_t m)
{
	return st->ops->bound(st, m);
}

static inline int sl__stage_on_gpu(const struct sl__stage *st, unsigned p)
{
	return st->ops->on_gpu(st, p);
}

static inline int sl__stage_run(struct sl__stage *st, struct sl__producer *p, struct sl__batch_buf *s,
				struct sluice_record *rec, uint32_t *m, uint64_t at)
{
	return st->ops->run(st, p, s, rec, m, at);
}

static inline void sl__stage_describe(const struct sl__stage *st, uint64_t m, struct sluice_batch_field *bf)
{
	st->ops->describe(st, m, bf);
}

/* A window stage's readers (0: the loader's default) and a reader's state (*state NULL: none). */
static inline unsigned sl__stage_readers(const struct sl__stage *st)
{
	return st && st->ops->readers ? st->ops->readers(st) : 0;
}

static inline int sl__stage_reader_open(const struct sl__stage *st, void **state)
{
	*state = NULL;
	return st && st->ops->reader_open ? st->ops->reader_open(st, state) : 0;
}

static inline void sl__stage_reader_close(const struct sl__stage *st, void *state)
{
	if (st && st->ops->reader_close)
		st->ops->reader_close(state);
}

struct sluice_loader {
	struct sluice_engine *eng;
	const struct sl__gpu *gpu;  /* the GPU batches land in: the engine's device ids[opt.device_index] */
	/*
	 * The GPU the windows are registered with, where a stage's GPU work
	 * reads records from them (nvJPEG, the bitstreams), else NULL; set by
	 * the stages' setup, before the windows are made.
	 */
	const struct sl__gpu *win_pin;
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
	uint64_t n, window, chunk, per_global, nbatches; /* n: the dataset's records; nbatches: this rank's, per epoch */
	/*
	 * This rank's sequence in the epoch: its node's (the order's view,
	 * which a resume across node counts sets for the epoch it resumes), len
	 * positions long; the global batches are its node's, per_global =
	 * batch_size * the node's ranks, and local_rank is this rank's place
	 * among them.
	 */
	struct sl__order_view view, fresh; /* fresh: an epoch's from its start (the next epoch's) */
	uint64_t len;
	unsigned local_rank;
	/*
	 * Where the epoch's global batches start: batch g holds positions
	 * [origin + g * per_global, origin + (g + 1) * per_global) of the order
	 * (modulo n past its end).  0, but for an epoch resumed from a position
	 * that is not a multiple of the global batch (the world size changed):
	 * then position % per_global, so the resumed epoch goes on exactly
	 * where the last one stopped.
	 */
	uint64_t origin;
	/*
	 * Positions of the epoch's last global batch: per_global with drop_last
	 * or even_batches; else what is left of the longest node's sequence,
	 * rounded up to a multiple of the node's ranks (DistributedSampler's
	 * rule: each rank the same number of records, at most L - 1 of them a
	 * second time, the last batch short).  See sl__gsize.
	 */
	uint64_t last_global;
	uint32_t bmax; /* the most records a batch of this rank holds: batch_size, or fewer where the epoch has fewer */
	uint64_t next_g;            /* next batch the consumer takes */
	uint64_t delivered;         /* batches handed to the consumer since open, over epochs */
	uint64_t delivered_records, delivered_bytes; /* and their records and field bytes */
	uint64_t epoch_records, epoch_skipped0; /* records handed over since the epoch (re)started; skipped then */
	struct sl__batch_buf *bufs;
	unsigned nbufs;
	/*
	 * Batch g is made in bufs[(g + slot_base) % nbufs] (sl__slot); each
	 * start puts its first batch in the buffer after last_out, the one last
	 * handed out, so a batch the caller still holds from the pass before
	 * (the loop's variable) is the last one the new pass needs back.
	 */
	unsigned slot_base, last_out;
	struct sl__window *win;
	unsigned nwin;
	/*
	 * The windows this rank reads in the epoch, in order (a window comes
	 * back once more when the last batch wraps to the start), and for each
	 * batch the first and last place in that sequence it draws from.
	 */
	uint64_t *seq, nseq, *bfirst, *blast;
	uint64_t low;               /* the batches being built need seq places >= low */
	pthread_t reader[SL_READERS_GPU_ZSTD]; /* read windows ahead of the producer */
	unsigned nreaders, readers_running;
	uint64_t read_next;         /* next place in seq a reader takes */
	struct sl__producer prod[SL_PRODUCERS_MAX];
	unsigned nprod;             /* producers: SL_PRODUCERS, or SL_PRODUCERS_MAX for images on the GPU */
	struct sl__stage stage[SL_STAGES_MAX]; /* the stages set up, in the order they run */
	unsigned nstage;
	struct sl__stage *wstage;   /* the window stage, or NULL (windows as stored) */
	struct sl__stage *fstage[SLUICE_MAX_FIELDS]; /* per loaded field, the stage that makes it (NULL: as stored) */
	pthread_t producer[SL_PRODUCERS_MAX];
	unsigned producers_running;
	int running;
	pthread_mutex_t lock;
	/*
	 * cv: windows read and windows done with (readers, and producers
	 * waiting for windows); buf_cv: a buffer given back (producers);
	 * batch_cv: a batch ready (the consumer).  Apart, so that the consumer's
	 * call wakes one producer, not every thread.
	 */
	pthread_cond_t cv, buf_cv, batch_cv;
	struct sl__batch_buf *held;      /* the consumer's batch (the consumer's thread alone uses it) */
	/*
	 * hold: the batches held past their buffer's turn and the spares,
	 * under lock; held_bytes of their memory is the caller's, at most
	 * hold_limit (the options' hold_bytes); held_moved counts the batches
	 * moved out of the ring (stats: "held_moved", "held_bytes").
	 */
	struct sl__held *sets;
	size_t sets_cap;
	unsigned nsets;
	uint64_t held_bytes, hold_limit, held_moved;
	uint64_t produce_g;         /* next batch a producer takes */
	int stop, err;
	char detail[384];
	/*
	 * The first batch that failed (UINT64_MAX: none), its error and
	 * detail: the batches before it are still built and handed out, the
	 * error comes with it, and none after it is built.
	 */
	uint64_t fail_g;
	int fail_rc;
	char fail_detail[384];
	struct sl__hist h_read, h_swait, h_collate, h_h2d, h_wait; /* h_swait: producers waiting for windows */
	struct sl__hist h_zread, h_zdecode; /* a zstd window's: blocks read and checked (nvCOMP's), decoded */
	_Atomic uint64_t bytes, records, read_bytes, read_ios, skipped;
	_Atomic uint64_t read_cached; /* of read_bytes, through the page cache */
	_Atomic uint64_t record_bytes, seq_bytes; /* records read, and those read right after their neighbour */
	/* CUDA driver calls (gpu.h's sl__cu_ncalls) of the producers' batches and of the consumer's calls */
	_Atomic uint64_t cu_prod, cu_cons;
	_Atomic uint64_t zblocks_gpu, zblocks_cpu; /* zstd blocks of the windows decoded by nvCOMP, by the CPU */
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
	struct sl__pub *pub;        /* figures published for sluice top and /metrics (NULL: not published) */
};

/* For SLUICE_TRACE: the thread's CPU time now (0 when not tracing). */
static inline uint64_t sl__ld_cpu(const struct sluice_loader *ld)
{
	return ld->trace ? sl__thread_cpu_ns() : 0;
}

/* A span of this thread's work from t0 (cpu0 its sl__ld_cpu() then) to now, for SLUICE_TRACE. */
static inline void sl__ld_span(const struct sluice_loader *ld, const char *name, uint64_t t0, uint64_t cpu0, uint64_t n)
{
	if (ld->trace)
		sl__trace_span(ld->trace, name, t0, sl__now_ns(), sl__thread_cpu_ns() - cpu0, n);
}

/* The first position of global batch g. */
static inline uint64_t sl__gstart(const struct sluice_loader *ld, uint64_t g)
{
	return ld->origin + g * ld->per_global;
}

/* Positions of the node's global batch g (g < nbatches). */
static inline uint64_t sl__gsize(const struct sluice_loader *ld, uint64_t g)
{
	return g + 1 == ld->nbatches ? ld->last_global : ld->per_global;
}

/* Records of this rank's batch g: the same on every rank of every node. */
static inline uint32_t sl__bsize(const struct sluice_loader *ld, uint64_t g)
{
	return (uint32_t)(sl__gsize(ld, g) / (ld->per_global / ld->opt.batch_size));
}

/* The position after the epoch's last: where its batches end. */
static inline uint64_t sl__gend(const struct sluice_loader *ld)
{
	return ld->nbatches ? sl__gstart(ld, ld->nbatches - 1) + ld->last_global : ld->origin;
}

/* The buffer batch g of the current start is made in. */
static inline struct sl__batch_buf *sl__slot(const struct sluice_loader *ld, uint64_t g)
{
	return &ld->bufs[(g + ld->slot_base) % ld->nbufs];
}

/* Positions of the node's sequence consumed once the batches before next_g are. */
static inline uint64_t sl__consumed(const struct sluice_loader *ld)
{
	return ld->next_g >= ld->nbatches && ld->nbatches ? sl__gend(ld) : sl__gstart(ld, ld->next_g);
}

/* window.c */
SL_HIDDEN int sl__cmp_u64(const void *a, const void *b);
/* The record at position q of the current epoch. */
SL_HIDDEN uint64_t sl__ld_at(const struct sluice_loader *ld, uint64_t q);
SL_HIDDEN int sl__rank_positions(const struct sluice_loader *ld, const struct sl__order *o, uint64_t g, uint64_t *out);
SL_HIDDEN int sl__window_reserve(struct sl__window *win, size_t n, const struct sl__gpu *pin);
SL_HIDDEN void sl__window_free(struct sl__window *win, const struct sl__gpu *pin);
SL_HIDDEN int sl__batch_windows(struct sluice_loader *ld, uint64_t g, struct sl__window **wins);
SL_HIDDEN const char *sl__window_lookup(struct sl__window *const *wins, uint64_t nw, uint64_t w, uint64_t id,
					size_t *len, int *rc);
SL_HIDDEN void *sl__read_ahead(void *arg);
SL_HIDDEN int sl__plan_windows(struct sluice_loader *ld);
/* stage.c: sluice's table of stages (zstd, images), *n of them. */
SL_HIDDEN const struct sl__stage_ops *sl__stage_table(size_t *n);
/* Each of ops set up in turn for ld, those its dataset and options call for kept in ld->stage (wstage, fstage). */
SL_HIDDEN int sl__stages_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt,
			       const struct sl__stage_ops *ops, size_t nops);
/* sluice_loader_open() with a table of stages of one's own (tests: tests/unit/t_stages.c). */
SL_HIDDEN int sl__loader_open_staged(struct sluice_loader **out, struct sluice_engine *eng, struct sluice_dataset *ds,
				     const struct sluice_loader_options *opt, const struct sl__stage_ops *ops, size_t nops);
SL_HIDDEN void sl__stages_close(struct sluice_loader *ld);
/* What the stages counted, summed. */
SL_HIDDEN void sl__stages_count(const struct sluice_loader *ld, struct sl__stage_counts *c);
/* collate.c */
SL_HIDDEN int sl__buf_reserve(struct sluice_loader *ld, struct sl__batch_buf *s, uint64_t size);
/*
 * hold, under ld->lock: buffer s, handed out and still held, gets a spare's
 * memory (or none yet: sl__buf_reserve makes it), its own moving to the
 * held sets; 0, or -ENOBUFS naming hold_bytes when the held batches would
 * take more, or -ENOMEM.
 */
SL_HIDDEN int sl__hold_detach(struct sluice_loader *ld, struct sl__batch_buf *s);
/* The held sets' memory, at close. */
SL_HIDDEN void sl__hold_free(struct sluice_loader *ld);
SL_HIDDEN void *sl__produce(void *arg); /* arg: its struct sl__producer */
/* ring.c */
SL_HIDDEN void sl__give_back(struct sluice_loader *ld, void *stream);
/* stats.c */
/* The verdict from the figures: compute-bound under a 5% wait share (the fills left out), else loader-bound when the
 * loader's own time a batch passes the consumer's step (or there is no copy to the GPU), else transfer-bound. */
SL_HIDDEN const char *sl__verdict_rule(double wait_share, double produce_us, double step_us, int gpu);
SL_HIDDEN void sl__loader_log_stats(struct sluice_loader *ld);
/* Publishes the loader's figures (diag.h); the consumer's thread, after each batch. */
SL_HIDDEN void sl__loader_publish(struct sluice_loader *ld);
/* Under ld->lock: every waiting thread looks again (an error, a stop). */
static inline void sl__loader_wake_all(struct sluice_loader *ld)
{
	pthread_cond_broadcast(&ld->cv);
	pthread_cond_broadcast(&ld->buf_cv);
	pthread_cond_broadcast(&ld->batch_cv);
}

/* Under ld->lock: the loader's first error stops it; every thread hears of it. */
static inline void sl__loader_fail(struct sluice_loader *ld, int rc)
{
	if (!ld->err) {
		ld->err = rc;
		snprintf(ld->detail, sizeof(ld->detail), "%s", sluice_last_error_detail());
	}
	sl__loader_wake_all(ld);
}

#endif
