/*
 * io: storage backends behind one ops table.
 *
 * A backend moves bytes between a file descriptor and memory.  Each worker
 * thread owns one instance (struct sl__io_ctx) of each backend it uses, so
 * instances are never shared between threads.  Backends never call each
 * other; the transfer layer (xfer/) chooses between them.
 */
#ifndef SL_IO_H
#define SL_IO_H

#include <sys/types.h>

#include "core/core.h"

enum sl__io_opcode { SL_IO_READ = 0, SL_IO_WRITE = 1 };

enum sl__io_caps {
	SL_IO_CAP_GPU_MEM = 1u << 0, /* buf may be GPU memory (cuFile) */
	SL_IO_CAP_ASYNC = 1u << 1,   /* several I/Os in flight per instance */
	SL_IO_CAP_FIXED = 1u << 2,   /* registered buffers and files */
};

/* One storage I/O.  Owned by the caller from submit until reaped. */
struct sl__io {
	int op;               /* enum sl__io_opcode */
	int fd;
	int file_index;       /* slot in the engine's file table, -1 if none */
	unsigned file_gen;    /* generation of that slot, to detect reuse */
	void *handle;         /* backend-specific per-file handle (cuFile) */
	void *buf;
	int buf_index;        /* registered buffer index, -1 if none */
	uint64_t offset;
	size_t len;
	ssize_t res;          /* bytes transferred or -errno, set at reap */
	void *user;
	/*
	 * Optional, reads: a backend that receives the bytes in order (s3) calls
	 * it as they arrive with how many of io->buf are there so far, so the
	 * caller can move them on before the whole I/O is done.  The count may
	 * go back to 0 when the backend starts over (a retry): the bytes it
	 * then receives again are the same.
	 */
	void (*progress)(struct sl__io *io, size_t bytes);
	/*
	 * A failed I/O's detail where the backend knows more than an errno
	 * (s3: the URL, the HTTP status, the server's code, the attempts), set
	 * with res; "" otherwise.  The caller names it in its own error.
	 */
	char detail[256];
	/*
	 * Optional, reads: sum_kind (SL_CRC32C or SL_CRC32, 0 none) asks a
	 * backend that can (s3) for the CRC of the bytes it delivers, taken as
	 * they arrive; it sets sum, over res bytes, with res.  Backends that
	 * cannot leave sum_kind as it is and the caller sums the bytes itself.
	 */
	int sum_kind;
	uint32_t sum;
};

struct sl__io_ctx;

struct sl__io_ops {
	const char *name;
	unsigned caps;
	/*
	 * probe: required.  Called once per engine before any init.  Returns
	 * 0 if the backend is usable with cfg; otherwise a negative code and
	 * a sentence in why saying what makes it unusable (it reaches logs
	 * and `sluice doctor`).
	 */
	int (*probe)(const struct sluice_config *cfg, char *why, size_t why_len);
	/*
	 * init: required.  Called on the worker thread that will use the
	 * instance, while the engine opens; depth is the most I/Os the caller
	 * keeps in flight.  Sets ctx->priv.  MUST be quick: the engine's open
	 * waits for every worker's.
	 */
	int (*init)(struct sl__io_ctx *ctx, const struct sluice_config *cfg, unsigned depth);
	/*
	 * register_bufs: optional (SL_IO_CAP_FIXED).  Called on the owning
	 * thread after init, before its first I/O, once the engine is open:
	 * registers the worker's bounce slots (bufs/nbufs/buf_size), which
	 * pins their pages and may take milliseconds.  Sets ctx->fixed when
	 * they are registered; a refusal is not an error (I/O then uses
	 * plain buffers).
	 */
	void (*register_bufs)(struct sl__io_ctx *ctx, void *const *bufs, unsigned nbufs, size_t buf_size);
	/*
	 * submit: required.  Queues io; it may already complete inside
	 * submit (synchronous backends).  Returns 0 or a negative code if io
	 * could not be queued (io then never comes back from reap).
	 */
	int (*submit)(struct sl__io_ctx *ctx, struct sl__io *io);
	/*
	 * reap: required.  Starts anything queued, then hands back up to max
	 * completed I/Os in done[], waiting for at least one if wait is set
	 * and any is in flight.  Returns the count or a negative code.
	 */
	int (*reap)(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max, int wait);
	/* fini: required.  Called on the owning thread with nothing in flight. */
	void (*fini)(struct sl__io_ctx *ctx);
};

struct sl__io_ctx {
	const struct sl__io_ops *ops;
	void *priv;
	unsigned inflight;
	int fixed; /* set by register_bufs: the buffers it was given are registered */
};

SL_HIDDEN extern const struct sl__io_ops sl__io_uring_ops;
SL_HIDDEN extern const struct sl__io_ops sl__io_psync_ops;
SL_HIDDEN extern const struct sl__io_ops sl__io_gds_ops;

/* Hands the gds backend cuFile's read/write entry points (see gds.c). */
SL_HIDDEN void sl__gds_bind(ssize_t (*rd)(void *, void *, size_t, off_t, off_t),
			    ssize_t (*wr)(void *, const void *, size_t, off_t, off_t),
			    int real_gds, const char *why);

static inline int sl__io_init(struct sl__io_ctx *ctx, const struct sl__io_ops *ops,
			      const struct sluice_config *cfg, unsigned depth)
{
	ctx->ops = ops;
	ctx->priv = NULL;
	ctx->inflight = 0;
	ctx->fixed = 0;
	return ops->init(ctx, cfg, depth);
}

static inline void sl__io_register_bufs(struct sl__io_ctx *ctx, void *const *bufs, unsigned nbufs,
					size_t buf_size)
{
	if (ctx->ops->register_bufs)
		ctx->ops->register_bufs(ctx, bufs, nbufs, buf_size);
}

static inline int sl__io_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	int rc = ctx->ops->submit(ctx, io);

	if (!rc)
		ctx->inflight++;
	return rc;
}

static inline int sl__io_reap(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max,
			      int wait)
{
	int n;

	if (!ctx->inflight)
		return 0;
	n = ctx->ops->reap(ctx, done, max, wait);
	if (n > 0)
		ctx->inflight -= (unsigned)n;
	return n;
}

static inline void sl__io_fini(struct sl__io_ctx *ctx)
{
	if (ctx->ops)
		ctx->ops->fini(ctx);
	ctx->ops = NULL;
}

/*
 * Synchronous pread/pwrite of the whole range, retrying EINTR and partial
 * transfers; stops early only at EOF (reads).  Returns bytes or -errno.
 * Shared by psync and the fallbacks of the transfer layer.
 */
SL_HIDDEN ssize_t sl__pio_full(int op, int fd, void *buf, size_t len, uint64_t off);

/*
 * The completion queue of synchronous backends: submit does the I/O, then
 * sl__sync_complete() queues io for reap.  init/reap/fini serve as ops.
 */
SL_HIDDEN int sl__sync_init(struct sl__io_ctx *ctx, const struct sluice_config *cfg, unsigned depth);
SL_HIDDEN int sl__sync_complete(struct sl__io_ctx *ctx, struct sl__io *io);
SL_HIDDEN int sl__sync_reap(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max, int wait);
SL_HIDDEN void sl__sync_fini(struct sl__io_ctx *ctx);

#endif
