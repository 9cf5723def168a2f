/*
 * Jobs: what a transfer call becomes (engine.h says how), planned by
 * plan.c, queued, claimed and counted by job.c.
 */
#ifndef SL_JOB_H
#define SL_JOB_H

#include "core/core.h"
#include "store/store.h"

struct sluice_engine;
struct sluice_file;

enum { SL_JOB_CRC32C = 1, SL_JOB_OBJECT_SUM = 2 };

/* Path codes for reports: store id, mode and destination kind; a set of them is words of bits. */
#define SL_PATH_CODES (SL_STORES * 10)
#define SL_PATH_WORDS ((SL_PATH_CODES + 63) / 64)
struct sl__paths {
	_Atomic uint64_t w[SL_PATH_WORDS];
};
static inline void sl__paths_add(struct sl__paths *p, unsigned code)
{
	atomic_fetch_or(&p->w[code / 64], 1ull << (code % 64));
}
static inline void sl__paths_merge(struct sl__paths *dst, const struct sl__paths *src)
{
	for (unsigned i = 0; i < SL_PATH_WORDS; i++)
		atomic_fetch_or(&dst->w[i], atomic_load(&src->w[i]));
}
static inline int sl__paths_has(const struct sl__paths *p, unsigned code)
{
	return (int)(atomic_load(&p->w[code / 64]) >> (code % 64) & 1);
}
enum { SL_K_HOST = 0, SL_K_BOUNCE_HOST = 1, SL_K_PINNED_GPU = 2, SL_K_PAGEABLE_GPU = 3, SL_K_GDS = 4 };
#define SL_PATH_CODE(b, direct, k) ((b) * 10 + (direct) * 5 + (k))
_Static_assert(SL_K_GDS < 5 && SL_PATH_WORDS * 64 >= SL_PATH_CODES, "a path code's kind and the set's words");

struct sl__piece {
	size_t seg_off; /* offset inside the segment's payload */
	size_t len;
	char *mem;      /* destination (read) or source (write) */
	int gpu;        /* mem is device memory */
	char *alloc;    /* GPU memory: where its allocation starts (one copy never spans two) */
	uint32_t range; /* index of the caller's range it belongs to */
	uint64_t crc;   /* CRC of its bytes, when the job asks (job->crc): CRC32C, or its file's sum_kind */
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
	int map_dma;               /* reads: a call of the size whose cached GPU segments go by page-cache DMA */
	struct sl__seg *segs;
	struct sl__piece *pieces;
	size_t nsegs, npieces;
	size_t next;               /* next unclaimed segment (engine lock) */
	_Atomic size_t done;       /* segments finished */
	_Atomic int err;           /* first error, 0 if none */
	char detail[384];          /* its detail, raised again in the caller's thread */
	_Atomic uint64_t bytes, bytes_direct, bytes_buffered, ios;
	_Atomic uint64_t bytes_storage; /* the segments' spans: payload and the gaps coalesced reads read through */
	struct sl__paths paths;    /* the SL_PATH_CODE values its segments took */
	int finished;              /* engine lock */
	struct sl__job *qnext;     /* engine's claim list */
	uint64_t t0;
	int lane;                  /* the lane whose workers take it (its memory's GPU), -1: any */
	/* Called once when the job finishes, under the engine lock. */
	void (*on_finish)(struct sl__job *job);
	void *user;
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

SL_HIDDEN int sl__fix_size(const struct sluice_range *r, size_t n);

/*
 * One transfer of ranges, synchronously: its job planned, submitted and
 * waited for, whole objects matched to their checksums, the report filled.
 */
SL_HIDDEN ssize_t sl__transfer(struct sluice_engine *eng, int op, const struct sluice_range *r,
			      size_t n, struct sluice_xfer_report *rep);

#endif
