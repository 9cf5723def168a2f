/*
 * xfer: the transfer engine.
 *
 * A call (read, write, batch, async) becomes a job: a plan of segments,
 * each one storage I/O of at most max_transfer_size, with the pieces of
 * caller memory it feeds or drains.  Worker threads claim segments from
 * the engine's job list and run each through a bounce slot:
 *
 *   read:  storage --io--> slot --H2D (async, event)--> GPU pieces
 *   write: GPU pieces --D2H (async, event)--> slot --io--> storage
 *
 * Each worker owns queue_depth slots, an I/O backend instance and a CUDA
 * stream, so storage I/O of one slot overlaps DMA of another.
 *
 * Calls run one way: file.c, async.c, dsread.c (the public calls)
 *   -> plan.c, job.c;  engine.c -> worker.c -> job.c.
 */
#ifndef SL_XFER_H
#define SL_XFER_H

#include <pthread.h>

#include "core/core.h"
#include "gpu/gpu.h"
#include "store/store.h"
#include "remote/remote.h"

#define SL_MAX_FILES 1024 /* open sluice_files per engine */
#define SL_FLAGS 4096     /* async transfers in flight per engine (async.c) */

struct sluice_file {
	struct sluice_engine *eng;
	char *path;
	struct sl__sfile s; /* its store and the store's handle (store/store.h) */
	int index;          /* slot in eng->files */
	unsigned gen;
	int writable;
};

enum { SL_JOB_CRC32C = 1, SL_JOB_OBJECT_SUM = 2 };

/* Path codes for reports: store id, mode and destination kind. */
#define SL_PATH_CODES (SL_STORES * 10)
enum { SL_K_HOST = 0, SL_K_BOUNCE_HOST = 1, SL_K_PINNED_GPU = 2, SL_K_PAGEABLE_GPU = 3, SL_K_GDS = 4 };
#define SL_PATH_CODE(b, direct, k) ((b) * 10 + (direct) * 5 + (k))

struct sl__piece {
	size_t seg_off; /* offset inside the segment's payload */
	size_t len;
	char *mem;      /* destination (read) or source (write) */
	int gpu;        /* mem is device memory */
	uint32_t range; /* index of the caller's range it belongs to */
	uint32_t crc;   /* CRC32C of its bytes, when the job asks (job->crc) */
};

struct sl__seg {
	struct sluice_file *file;
	uint64_t off;   /* payload start in the file */
	size_t len;     /* payload length */
	uint32_t piece0, npieces;
	int pad_ok;     /* write: may pad to 4 KiB past the end (truncated later) */
};

struct sl__job {
	int op;                    /* SL_IO_READ or SL_IO_WRITE */
	/*
	 * Reads: workers compute each piece's CRC from its host bytes.
	 * SL_JOB_CRC32C: CRC32C (records' sums); SL_JOB_OBJECT_SUM: of the
	 * kind its file's checksum has (file->s.sum_kind).
	 */
	int crc;
	int copy_gaps;             /* reads may fill gaps under 8 bytes between pieces */
	struct sl__seg *segs;
	struct sl__piece *pieces;
	size_t nsegs, npieces;
	size_t next;               /* next unclaimed segment (engine lock) */
	_Atomic size_t done;       /* segments finished */
	_Atomic int err;           /* first error, 0 if none */
	char detail[384];          /* its detail, raised again in the caller's thread */
	_Atomic uint64_t bytes, bytes_direct, bytes_buffered, ios;
	_Atomic uint64_t paths;    /* bitmask of SL_PATH_CODE values */
	int finished;              /* engine lock */
	struct sl__job *qnext;     /* engine's claim list */
	uint64_t t0;
	int lane;                  /* the lane whose workers take it (its memory's GPU), -1: any */
	/* Called once when the job finishes, under the engine lock. */
	void (*on_finish)(struct sl__job *job);
	void *user;
};

struct sl__worker;

struct sluice_engine {
	struct sluice_config cfg;
	struct sl__gpu gpu;        /* gpu.ctx NULL without CUDA: the first of the device ids */
	/*
	 * Lanes: one per device id, lane 0 being gpu.  Worker i serves lane
	 * i % nlanes on that GPU's context and NUMA node (-1: none, any CPU).
	 */
	unsigned nlanes;
	struct sl__gpu *lane[SLUICE_MAX_DEVICES];
	struct sl__gpu xgpu[SLUICE_MAX_DEVICES - 1]; /* lanes 1.. */
	int numa_node[SLUICE_MAX_DEVICES];
	cpu_set_t numa_cpus[SLUICE_MAX_DEVICES];
	const struct sl__store *local; /* the store of local files: uring or psync */
	const struct sl__store *gds;   /* NULL unless GDS is in use: then local files open through it */
	int gds_real;
	unsigned stores;           /* bitmask by id of the stores workers keep instances of */
	void *store_shared[SL_STORES]; /* each store's state shared by the engine's files (engine lock) */
	char unusable[1024];
	char gpu_unusable[256];    /* why gpu.ctx is NULL */
	char *pool;                /* all slots of all workers */
	size_t pool_len;
	int pool_pinned;           /* with a GPU: no slot's pinning was refused (slots pin on first use) */
	size_t slot_size;
	unsigned slots_per_worker;
	int fixed_bufs;

	pthread_mutex_t lock;
	pthread_cond_t work_cv;    /* workers wait for jobs */
	pthread_cond_t done_cv;    /* callers wait for jobs to finish */
	struct sl__job *queue;     /* jobs with unclaimed segments */
	struct sl__job **queue_tail;
	int stopping;
	int init_err;              /* first worker start-up error */
	unsigned started;          /* workers through sl_worker_init: open waits for these */
	unsigned prepared;         /* and through registering their slots: get_info waits for these */

	struct sluice_file *files[SL_MAX_FILES];
	unsigned file_gen;

	/*
	 * Completion flags of async transfers: pinned, mapped into the GPU's
	 * address space so a caller's stream can wait on one (async.c).
	 */
	_Atomic uint32_t *flags;
	sl_CUdeviceptr flags_dev;
	uint16_t *flag_free;       /* stack of free flag indexes (engine lock) */
	unsigned nflag_free;
	char *stage_cache;         /* a spare async staging buffer (engine lock) */
	size_t stage_cache_len;
	int stage_cache_pinned;

	struct sl__worker *workers;
	unsigned nworkers;
	struct sl__hist lat;
	_Atomic uint64_t st_ios, st_bytes;
};

/*
 * plan.c: builds job->segs/pieces from ranges; 0 or an error.  Pieces of
 * one range are consecutive and in file order.  With crc set, workers
 * compute each piece's CRC32C from host bytes (so GPUDirect is not used).
 */
SL_HIDDEN int sl__plan(struct sluice_engine *eng, struct sl__job *job, int op,
		       const struct sluice_range *r, size_t n, int crc);
SL_HIDDEN void sl__plan_free(struct sl__job *job);

/* job.c */
SL_HIDDEN void sl__job_submit(struct sluice_engine *eng, struct sl__job *job);
SL_HIDDEN ssize_t sl__job_wait(struct sluice_engine *eng, struct sl__job *job,
			       struct sluice_xfer_report *rep);
SL_HIDDEN void sl__job_report(const struct sl__job *job, struct sluice_xfer_report *rep);
/* Claims the next segment of any queued job; NULL if none. */
SL_HIDDEN struct sl__job *sl__claim(struct sluice_engine *eng, size_t *seg, unsigned lane);
/* 1 if a queued job has a segment lane's workers may take (the engine lock held). */
SL_HIDDEN int sl__claimable(const struct sluice_engine *eng, unsigned lane);
SL_HIDDEN void sl__seg_done(struct sluice_engine *eng, struct sl__job *job, int err,
			    uint64_t t0);

/* worker.c */
SL_HIDDEN void *sl__worker_main(void *arg);
SL_HIDDEN size_t sl__worker_size(void);
/* Starts worker id; a start failure is recorded in eng->init_err. */
SL_HIDDEN void sl__worker_setup(struct sl__worker *w, struct sluice_engine *eng, unsigned id);
SL_HIDDEN void sl__worker_join(struct sl__worker *w);
/* The i-th worker of the engine's array. */
#define SL_WORKER(eng, i) ((struct sl__worker *)((char *)(eng)->workers + (size_t)(i) * sl__worker_size()))

/*
 * file.c: sluice_file_open with arg, the store's option for this open
 * (an S3 client for s3:// paths; NULL: the engine's own); a destination
 * of a store that writes files whole (objects) written so, through arg,
 * its report filled.
 */
SL_HIDDEN int sl__file_open(struct sluice_file **out, struct sluice_engine *eng, void *arg,
			    const char *path, int flags);
SL_HIDDEN ssize_t sl__write_whole(struct sluice_engine *eng, void *arg, const char *path,
				  const void *src, size_t len, struct sluice_xfer_report *rep);

/*
 * stores.c: the registry, by id; into *out the store that serves path in
 * eng (a URL's, else eng->gds or eng->local): 0, or an error naming path
 * where that store is unusable.
 */
SL_HIDDEN extern const struct sl__store *const sl__stores[SL_STORES];
SL_HIDDEN int sl__store_for(struct sluice_engine *eng, const char *path, const struct sl__store **out);
/* The struct sl__open_env of a store's open or put in eng. */
SL_HIDDEN void sl__open_env(struct sluice_engine *eng, const struct sl__store *st, void *arg, struct sl__open_env *env);

/* plan.c: after a write job, trims direct-write padding and updates sizes. */
/* One zstd block to decode (sl__zdecode): its table entry, shard and index there, and where it lands. */
struct sl__zblock {
	const struct sl__block *b;
	unsigned shard;
	uint64_t index;
	uint64_t out_off;
};
/*
 * Decodes the n blocks on the CPU (eng's thread count, this thread among
 * them): stored bytes from in (a shard's, read from its file offset base)
 * or, with in NULL, pread from the shard files; block k to out +
 * zb[k].out_off.  0, or SLUICE_EFORMAT / -errno naming the file and block.
 */
SL_HIDDEN int sl__zdecode(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sl__zblock *zb,
			  uint64_t n, const void *in, uint64_t base, void *out);
SL_HIDDEN int sl__fix_size(const struct sluice_range *r, size_t n);

/* Runs one job synchronously from ranges: plan, submit, wait, report. */
SL_HIDDEN ssize_t sl__run(struct sluice_engine *eng, int op, const struct sluice_range *r,
			  size_t n, struct sluice_xfer_report *rep);

/*
 * async.c: a future whose work is fn(arg, rep) on a thread of its own
 * (the object client's async calls); cb (or NULL) is called on that thread
 * with the result once fn returns, before waiters wake.  free_arg(arg) at
 * sluice_future_free (or at once if the thread cannot start).
 */
SL_HIDDEN int sl__future_call(struct sluice_future **out, ssize_t (*fn)(void *arg, struct sluice_xfer_report *rep),
			      void *arg, void (*free_arg)(void *arg), void (*cb)(ssize_t result, void *user),
			      void *user);

#endif
