/*
 * Worker threads.  Each owns queue_depth bounce slots carved from the
 * engine's pool, one instance of each store the engine uses, and a
 * non-blocking CUDA stream with one event per slot.  Which store instance
 * runs a segment's I/O, and how, is the route its file's store gives.
 *
 * Slot life:
 *   read:  FREE -> IO (storage into slot) -> DMA (slot to GPU) -> FREE
 *   write: FREE -> DMA (GPU to slot) -> IO (slot to storage) -> FREE
 * Host-only pieces skip DMA (memcpy), and aligned or buffered host
 * transfers of a single piece skip the slot entirely.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/pipeline.h"

enum { SL_FREE = 0, SL_IO, SL_DMA };

/*
 * Page-cache I/Os a worker keeps in flight, whatever queue_depth says: each
 * is a CPU copy, so more only spread the copies over more pinned memory.
 * Measured on the H100 machine, 16 threads, warm 8 GiB file: 43-46 GB/s
 * with 2, 35-39 with 4 (O_DIRECT reads still want 4: 2.3 against 2.0 GB/s).
 */
#define SL_BUFFERED_DEPTH 2

struct sl__slot {
	int state;
	char *buf;
	int index;          /* fixed buffer index */
	struct sl__job *job;
	size_t seg;
	struct sl__io io;
	struct sl__io_ctx *ctx; /* the store instance running io (the route's) */
	int gpu_route;      /* the route moves storage bytes straight to or from GPU memory */
	int gpu_any;        /* some of the segment's pieces are GPU memory */
	size_t head;        /* payload offset inside the I/O buffer */
	size_t need;        /* I/O bytes that must arrive (reads) */
	size_t got;         /* I/O bytes done so far */
	int direct;
	int zero_copy;      /* I/O runs on the caller's memory */
	int path;           /* SL_PATH_CODE */
	uint64_t t0;
	sl_CUevent ev;
	int pinned;         /* registered with CUDA: 0 not yet, 1 yes, -1 refused */
	struct sl__worker *w;
	size_t sent;        /* reads: payload bytes already moved on while the I/O ran (io.progress) */
	size_t arrived;     /* the I/O bytes progress last reported: fewer next time means it started over */
	int early_dma;      /* some of them by DMA: wait for the event */
	int early_err;
	const char *map_src;  /* the route's mapping of the segment's cached bytes (route.map), or NULL */
	void *mapped;       /* the pages of map_src registered with the driver while its DMA runs (sl_map_dma) */
};

/*
 * A read slot's bytes move on once this many more have arrived (objects:
 * the GET still running): a quarter of a slot, up to 4 MiB.
 */
static size_t sl_early_chunk(const struct sluice_engine *eng)
{
	size_t q = eng->cfg.max_transfer_size / 4;

	return q > (4u << 20) ? 4u << 20 : q < (64u << 10) ? 64u << 10 : q;
}

struct sl__worker {
	pthread_t thread;
	struct sluice_engine *eng;
	unsigned id;
	unsigned lane;               /* the GPU it serves: eng->lane[lane] (id % nlanes) */
	const struct sl__gpu *gpu;
	struct sl__io_ctx ctx[SL_STORES]; /* by store id: those eng->usable */
	sl_CUstream stream;
	unsigned nslots;
	struct sl__slot *slots;
};

size_t sl__worker_size(void)
{
	return sizeof(struct sl__worker);
}

/*
 * What can fail, and is quick: the engine's open waits for it in every
 * worker, so a failure is reported there.
 */
static int sl_worker_init(struct sl__worker *w)
{
	struct sluice_engine *eng = w->eng;
	int rc;

	w->nslots = eng->slots_per_worker;
	w->slots = calloc(w->nslots, sizeof(*w->slots));
	if (!w->slots)
		return -ENOMEM;
	for (unsigned i = 0; i < w->nslots; i++) {
		w->slots[i].buf = eng->pool + ((size_t)w->id * w->nslots + i) * eng->slot_size;
		w->slots[i].index = (int)i;
		w->slots[i].w = w;
	}
	for (int i = 0; i < SL_STORES; i++)
		if (eng->usable[i] && (rc = sl__io_init(&w->ctx[i], sl__stores[i], &eng->cfg, w->nslots)))
			return rc;
	if (w->gpu->ctx) {
		const struct sl__cuda_api *cu = w->gpu->cu;

		rc = sl__gpu_bind(w->gpu); /* for the thread's life: its stream, events and copies are this GPU's */
		/*
		 * Non-blocking: the stream MUST NOT synchronise with the legacy
		 * default stream, which an async caller may hold blocked in a
		 * host function waiting for this very worker.
		 */
		if (!rc)
			rc = SL_CU(cu->StreamCreate(&w->stream, SL_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
		for (unsigned i = 0; !rc && i < w->nslots; i++)
			rc = SL_CU(cu->EventCreate(&w->slots[i].ev, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
	}
	return rc;
}

/*
 * What is slow and cannot fail, done once the engine is open, before the
 * worker claims its first segment: registering its slots with io_uring
 * faults their pages in and pins them.  Refused, I/O uses plain buffers.
 */
static void sl_worker_prepare(struct sl__worker *w)
{
	struct sluice_engine *eng = w->eng;
	void *bufs[256];
	uint64_t t0 = sl__now_ns();

	for (unsigned i = 0; i < w->nslots; i++)
		bufs[i] = w->slots[i].buf;
	for (int i = 0; i < SL_STORES; i++)
		sl__io_register_bufs(&w->ctx[i], bufs, w->nslots, eng->slot_size);
	pthread_mutex_lock(&eng->lock);
	if (w->id == 0)
		eng->fixed_bufs = w->ctx[eng->local->id].fixed;
	if (++eng->prepared == eng->nworkers)
		sl__info("xfer", "workers ready %.1f ms after the engine's open (the last registered its buffers in %.1f ms)",
			 (double)(sl__now_ns() - eng->opened_ns) / 1e6, (double)(sl__now_ns() - t0) / 1e6);
	pthread_cond_broadcast(&eng->done_cv);
	pthread_mutex_unlock(&eng->lock);
}

/*
 * A slot is registered with CUDA (pinned for DMA) on its first copy to or
 * from the GPU, not at open: the driver pins one region at a time, and a
 * warm read uses two slots a worker, so it pins half the pool, spread over
 * its first copies.  Pinning every slot while the workers were idle made a
 * fresh process's first checkpoint load slower, not faster, on the H100
 * machine (10.8 GB: 223-236 ms against 222-224): the pins' hold on the
 * process's memory map stalled the caller's own work (its headers, its
 * plan).  Refused, the slot stays pageable: its copies are slower, and the
 * info says so.
 */
static void sl_slot_pin(struct sl__worker *w, struct sl__slot *sl)
{
	struct sluice_engine *eng = w->eng;

	sl->pinned = sl__host_pin(w->gpu, sl->buf, eng->slot_size) ? 1 : -1;
	if (sl->pinned < 0) {
		pthread_mutex_lock(&eng->lock);
		eng->pool_pinned = 0;
		pthread_mutex_unlock(&eng->lock);
	}
}

static void sl_worker_fini(struct sl__worker *w)
{
	const struct sl__cuda_api *cu = w->eng->gpu.cu;

	for (unsigned i = 0; w->slots && i < w->nslots; i++)
		if (w->slots[i].ev)
			cu->EventDestroy(w->slots[i].ev);
	if (w->stream)
		cu->StreamDestroy(w->stream);
	for (int i = 0; i < SL_STORES; i++)
		sl__io_fini(&w->ctx[i]);
	for (unsigned i = 0; w->slots && i < w->nslots; i++)
		if (w->slots[i].pinned > 0)
			sl__host_unpin(w->gpu, w->slots[i].buf);
	free(w->slots);
}

/* The slot's path code for reports: its route's store, mode and memory kind. */
static int sl_path(const struct sl__slot *sl)
{
	const struct sluice_engine *eng = sl->w->eng;
	int k = sl->gpu_route || sl->mapped ? SL_K_GDS /* no CPU copy: GPUDirect, or DMA from the page cache */
		: sl->zero_copy ? SL_K_HOST
		: !sl->gpu_any ? SL_K_BOUNCE_HOST
		: eng->cfg.staging == SLUICE_STAGING_PAGEABLE ? SL_K_PAGEABLE_GPU : SL_K_PINNED_GPU;

	return SL_PATH_CODE(sl->ctx->ops->id, sl->direct, k);
}

static void sl_slot_finish(struct sl__worker *w, struct sl__slot *sl, int err)
{
	struct sl__job *job = sl->job;
	struct sl__seg *s = &job->segs[sl->seg];

	if (sl->mapped) { /* its DMA is done (or failed) */
		w->eng->gpu.cu->MemHostUnregister(sl->mapped);
		sl->mapped = NULL;
	}
	if (!err) {
		/* Payload only: a coalesced segment also reads the gaps between pieces. */
		uint64_t bytes = 0;

		for (uint32_t i = 0; i < s->npieces; i++)
			bytes += job->pieces[s->piece0 + i].len;
		atomic_fetch_add(&job->bytes, bytes);
		atomic_fetch_add(&job->bytes_storage, s->len);
		atomic_fetch_add(sl->direct ? &job->bytes_direct : &job->bytes_buffered, bytes);
		sl__paths_add(&job->paths, (unsigned)sl->path);
		atomic_fetch_add(&w->eng->st_ios, 1);
		atomic_fetch_add(&w->eng->st_bytes, bytes);
	}
	sl->state = SL_FREE;
	sl->job = NULL;
	sl__seg_done(w->eng, job, err, err ? 0 : sl->t0);
}

static int sl_submit_io(struct sl__worker *w, struct sl__slot *sl)
{
	int rc;

	atomic_fetch_add(&sl->job->ios, 1);
	rc = sl__io_submit(sl->ctx, &sl->io);
	if (rc)
		return sl__err(rc, "%s: submitting I/O at offset %llu failed", sl->job->segs[sl->seg].file->path,
			       (unsigned long long)sl->io.offset);
	sl->state = SL_IO;
	return 0;
}

/*
 * The run of pieces from the segment's i-th that one copy can move: each
 * next piece of the same memory kind, lying as far from the previous one in
 * the slot as in caller memory, with no gap (or, for reads of a job with
 * copy_gaps, a gap under 8 bytes: alignment padding the caller gave up), and
 * for GPU memory inside one allocation: two allocations side by side in the
 * address space are still two, and one copy across both fails.
 * Returns the run's bytes and its piece count in *n.  Dataset batches of
 * neighbouring records so move in one DMA instead of one per record.
 */
static size_t sl_run(const struct sl__job *job, const struct sl__seg *s, uint32_t i, uint32_t *n)
{
	const struct sl__piece *p = &job->pieces[s->piece0 + i];
	size_t len = p->len, gap_max = job->copy_gaps && job->op == SL_IO_READ ? 7 : 0;
	uint32_t k = i + 1;

	for (; k < s->npieces; k++) {
		const struct sl__piece *q = &job->pieces[s->piece0 + k];
		size_t gap = q->seg_off - (p->seg_off + len);

		if (q->gpu != p->gpu || q->alloc != p->alloc || q->seg_off < p->seg_off + len || gap > gap_max ||
		    q->mem != p->mem + len + gap)
			break;
		len += gap + q->len;
	}
	*n = k - i;
	return len;
}

/*
 * Moves the segment's payload bytes [from, to) between the slot and caller
 * memory, piece run by piece run: H2D for reads, D2H for writes (async on
 * the worker's stream), memcpy for host pieces.  Returns 1 if DMA was
 * queued, 0 if not, or an error.
 */
static int sl_copy_range(struct sl__worker *w, struct sl__slot *sl, size_t from, size_t to)
{
	struct sluice_engine *eng = w->eng;
	const struct sl__cuda_api *cu = eng->gpu.cu;
	struct sl__job *job = sl->job;
	struct sl__seg *s = &job->segs[sl->seg];
	int dma = 0, err = 0, sync = eng->cfg.staging == SLUICE_STAGING_PAGEABLE;

	for (uint32_t i = 0, n; i < s->npieces && !err; i += n) {
		struct sl__piece *p = &job->pieces[s->piece0 + i];
		size_t len = sl_run(job, s, i, &n), lo = p->seg_off > from ? p->seg_off : from,
		       hi = p->seg_off + len < to ? p->seg_off + len : to;
		char *b = sl->buf + sl->head + lo, *m = (char *)p->mem + (lo - p->seg_off);
		sl_CUdeviceptr d = (sl_CUdeviceptr)(uintptr_t)m;

		if (lo >= hi)
			continue;
		len = hi - lo;
		if (!p->gpu) {
			if (job->op == SL_IO_READ)
				memcpy(m, b, len);
			else
				memcpy(b, m, len);
			continue;
		}
		if (!sl->pinned && !sync)
			sl_slot_pin(w, sl);
		if (job->op == SL_IO_READ)
			err = sync ? SL_CU(cu->MemcpyHtoD(d, b, len), "cuMemcpyHtoD")
				   : SL_CU(cu->MemcpyHtoDAsync(d, b, len, w->stream), "cuMemcpyHtoDAsync");
		else
			err = sync ? SL_CU(cu->MemcpyDtoH(b, d, len), "cuMemcpyDtoH")
				   : SL_CU(cu->MemcpyDtoHAsync(b, d, len, w->stream), "cuMemcpyDtoHAsync");
		dma |= !sync;
	}
	return err ? err : dma;
}

/*
 * io.progress of a read into a slot: the bytes that have arrived move on
 * (to the GPU, on the worker's stream) while the rest still come, a chunk
 * at a time, so the copy of a large object range does not wait for its end.
 */
/* The slot's segment is one piece, the whole payload: its CRC can be taken as the bytes arrive. */
static int sl_one_piece(const struct sl__slot *sl)
{
	const struct sl__seg *s = &sl->job->segs[sl->seg];
	const struct sl__piece *p = &sl->job->pieces[s->piece0];

	return s->npieces == 1 && p->seg_off == 0 && p->len == s->len;
}

static void sl_early(struct sl__io *io, size_t bytes)
{
	struct sl__slot *sl = io->user;
	struct sl__seg *s = &sl->job->segs[sl->seg];
	size_t avail = (size_t)((char *)io->buf + bytes - (sl->buf + sl->head));
	int rc;

	/*
	 * The backend started over (a retry): the bytes of the failed attempt
	 * may have been wrong (another range), so everything is moved and
	 * summed again; the copies are ordered on the stream, the last wins.
	 */
	if (bytes < sl->arrived)
		sl->sent = 0;
	sl->arrived = bytes;
	if (avail > s->len)
		avail = s->len;
	if (sl->early_err || avail < sl->sent + sl_early_chunk(sl->w->eng))
		return;
	rc = sl_copy_range(sl->w, sl, sl->sent, avail);
	if (rc < 0)
		sl->early_err = rc;
	sl->early_dma |= rc == 1;
	sl->sent = avail;
}

/*
 * Moves what is left of a segment between the slot and caller memory (all
 * of it, but for what sl_early moved already).  Returns 1 if DMA was queued
 * (wait for the event).
 */
static int sl_copy_pieces(struct sl__worker *w, struct sl__slot *sl, int *err)
{
	const struct sl__cuda_api *cu = w->eng->gpu.cu;
	int dma;

	*err = sl->early_err;
	if (sl->zero_copy || *err)
		return 0;
	dma = sl_copy_range(w, sl, sl->sent, sl->job->segs[sl->seg].len);
	if (dma < 0) {
		*err = dma;
		return 0;
	}
	dma |= sl->early_dma;
	if (dma)
		*err = SL_CU(cu->EventRecord(sl->ev, w->stream), "cuEventRecord");
	return dma && !*err;
}

/* Prepares and submits the storage I/O of a write once its bytes are in the slot. */
static int sl_write_io(struct sl__worker *w, struct sl__slot *sl)
{
	struct sl__seg *s = &sl->job->segs[sl->seg];

	if (!sl->zero_copy) {
		size_t len = s->len;

		if (sl->direct && len % SL_ALIGN) {
			/* Pad the tail; the file is truncated to size afterwards. */
			size_t pad = (size_t)sl__align_up(len, SL_ALIGN) - len;

			memset(sl->buf + len, 0, pad);
			len += pad;
		}
		sl->io.buf = sl->buf;
		sl->io.len = len;
	}
	sl->need = sl->io.len;
	return sl_submit_io(w, sl);
}

/*
 * Asks the segment's file's store how its I/O runs (struct sl__route) and
 * sets the slot's I/O up so: the store instance, its handle, O_DIRECT or
 * not, and the memory the I/O uses (the caller's, as it is, where it can).
 */
static void sl_route(struct sl__worker *w, struct sl__slot *sl, int single_host)
{
	struct sluice_engine *eng = w->eng;
	const struct sl__job *job = sl->job;
	const struct sl__seg *s = &job->segs[sl->seg];
	const struct sl__piece *p0 = &job->pieces[s->piece0];
	const struct sl__sfile *sf = &s->file->s;
	struct sl__route_ask a = { .op = job->op, .off = s->off, .len = s->len, .pad_ok = s->pad_ok,
				   .gpu_whole = !job->crc && s->npieces == 1 && p0->gpu, .cfg = &eng->cfg,
				   .local = eng->local };
	struct sl__route r = { .store = sf->ops, .handle = sf->handle };

	/* job->map_dma: the plan found the call fit (plan.c); the driver may have refused since. */
	a.want_map = job->map_dma && a.gpu_whole && sl_one_piece(sl) && !atomic_load(&eng->map_dma_off);
	if (sf->ops->route)
		sf->ops->route(sf, &a, &r);
	sl->map_src = r.map;
	sl->ctx = &w->ctx[r.store->id];
	sl->direct = r.direct;
	sl->gpu_route = r.gpu;
	sl->io.handle = r.handle;
	sl->io.direct = r.direct;
	sl->io.file_index = s->file->index;
	sl->io.file_gen = s->file->gen;
	sl->io.offset = s->off;
	sl->io.len = s->len;
	if (r.gpu || (single_host && (!sl->direct || (s->off % SL_ALIGN == 0 && s->len % SL_ALIGN == 0 &&
						     (uintptr_t)p0->mem % SL_ALIGN == 0)))) {
		/* Memory that the I/O can use as it is: no bounce. */
		sl->zero_copy = 1;
		sl->io.buf = p0->mem;
		return;
	}
	sl->io.buf = sl->buf;
	sl->io.buf_index = sl->index;
	if (sl->direct && job->op == SL_IO_READ) {
		uint64_t a0 = sl__align_down(s->off, SL_ALIGN);

		sl->head = (size_t)(s->off - a0);
		sl->io.offset = a0;
		sl->io.len = (size_t)(sl__align_up(s->off + s->len, SL_ALIGN) - a0);
	}
}

/*
 * A read of a local file's cached bytes into GPU memory by DMA from the
 * page cache itself (SLUICE_PAGECACHE_DMA_MIN/MAX, off by default): the
 * segment's pages, mapped (route.map), registered with the driver
 * read-only and copied, no CPU copy; unregistered once the copy is done
 * (sl_slot_finish).  On the H100 machine this ran at 0.2-0.8x the copy
 * through the bounce slots at 1-16 MiB: a worker's registration took 2-3x
 * the bench's own, and a call's segments on several workers registered one
 * after another in the driver.  Done best, the steps still only tie the
 * copy path (bench/pagecache_stages.py, docs/BENCHMARKS.md).  Returns 1 if the DMA is queued;
 * 0 where the driver refused (the pages of a neighbouring segment
 * registered at the moment, or no read-only registration: then never
 * again), the copy path then; or an error.
 */
static int sl_map_dma(struct sl__worker *w, struct sl__slot *sl)
{
	struct sluice_engine *eng = w->eng;
	const struct sl__cuda_api *cu = eng->gpu.cu;
	const struct sl__seg *s = &sl->job->segs[sl->seg];
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a0 = (uintptr_t)sl->map_src & ~(pg - 1),
		  a1 = ((uintptr_t)sl->map_src + s->len + pg - 1) & ~(pg - 1);
	sl_CUresult r = cu->MemHostRegister((void *)a0, a1 - a0, SL_CU_MEMHOSTREGISTER_READ_ONLY);
	int err;

	if (r != SL_CUDA_SUCCESS) {
		if (r != SL_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED && !atomic_exchange(&eng->map_dma_off, 1))
			sl__info("gpu", "page-cache pages not registered (CUDA error %d): GPU reads copy through the bounce slots",
				 r);
		return 0;
	}
	sl->mapped = (void *)a0;
	sl->path = sl_path(sl);
	atomic_fetch_add(&sl->job->ios, 1);
	err = SL_CU(cu->MemcpyHtoDAsync((sl_CUdeviceptr)(uintptr_t)sl->job->pieces[s->piece0].mem, sl->map_src, s->len,
					w->stream), "cuMemcpyHtoDAsync");
	if (!err && (err = SL_CU(cu->EventRecord(sl->ev, w->stream), "cuEventRecord")))
		cu->StreamSynchronize(w->stream); /* the copy may be queued: not unregistered under it */
	return err ? err : 1;
}

/* Starts segment seg of job in a free slot. */
static void sl_start(struct sl__worker *w, struct sl__slot *sl, struct sl__job *job, size_t seg)
{
	struct sluice_engine *eng = w->eng;
	struct sl__seg *s = &job->segs[seg];
	const struct sl__sfile *sf = &s->file->s;
	struct sl__piece *p0 = &job->pieces[s->piece0];
	uint32_t nrun = 0;
	/*
	 * Host memory that mirrors the segment byte for byte (one piece, or
	 * neighbours one copy would move, gaps included): the I/O can use it.
	 */
	int err = 0, single_host = !p0->gpu && p0->seg_off == 0 && sl_run(job, s, 0, &nrun) == s->len &&
				   nrun == s->npieces;

	sl->job = job;
	sl->seg = seg;
	sl->t0 = sl__now_ns();
	sl->got = 0;
	sl->head = 0;
	sl->zero_copy = 0;
	sl->sent = sl->arrived = 0;
	sl->early_dma = sl->early_err = 0;
	sl->gpu_any = 0;
	sl->mapped = NULL;
	if (atomic_load(&job->err)) {
		sl_slot_finish(w, sl, SLUICE_ECANCELED);
		return;
	}
	for (uint32_t i = 0; i < s->npieces; i++)
		sl->gpu_any |= job->pieces[s->piece0 + i].gpu;
	memset(&sl->io, 0, sizeof(sl->io));
	sl->io.op = job->op;
	sl->io.buf_index = -1;
	sl->io.user = sl;
	sl_route(w, sl, single_host);
	sl->path = sl_path(sl);
	if (job->op == SL_IO_READ && sl->map_src && (err = sl_map_dma(w, sl))) {
		if (err == 1) {
			sl->state = SL_DMA;
			return;
		}
	} else if (job->op == SL_IO_READ) {
		sl->need = sl->head + s->len;
		/* Bytes that arrive over the I/O's whole time (a GET's) move on as they come. */
		if ((sf->ops->caps & SL_STORE_STREAM) && !sl->zero_copy && eng->cfg.staging != SLUICE_STAGING_PAGEABLE)
			sl->io.progress = sl_early;
		/* And a whole file's checksum is summed by its store as they come, while each is still in cache. */
		if ((sl->ctx->ops->caps & SL_STORE_SUMS) && job->crc == SL_JOB_OBJECT_SUM && sl_one_piece(sl))
			sl->io.sum_kind = sf->sum_kind;
		err = sl_submit_io(w, sl);
	} else if (sl_copy_pieces(w, sl, &err)) {
		sl->state = SL_DMA;
		return;
	} else if (!err) {
		err = sl_write_io(w, sl);
	}
	if (err)
		sl_slot_finish(w, sl, err);
}

/* Handles a finished storage I/O of slot sl. */
static void sl_io_done(struct sl__worker *w, struct sl__slot *sl)
{
	struct sl__seg *s = &sl->job->segs[sl->seg];
	ssize_t res = sl->io.res;
	int err = 0;

	if (res == -EINTR || res == -EAGAIN) {
		err = sl_submit_io(w, sl);
		goto out;
	}
	if (res < 0) {
		if (res == -EINVAL && sl->direct && !sl->gpu_route) {
			/* The filesystem refused this O_DIRECT I/O: redo it buffered. */
			sl__warn("io", "%s: O_DIRECT I/O at %llu refused (EINVAL); retrying through the page cache",
				 s->file->path, (unsigned long long)sl->io.offset);
			sl->direct = sl->io.direct = 0;
			sl->path = sl_path(sl);
			err = sl_submit_io(w, sl);
			goto out;
		}
		err = sl__err((int)res, "%s: %s of %zu bytes at offset %llu failed: %s", s->file->path,
			      sl->io.op == SL_IO_READ ? "read" : "write", sl->io.len,
			      (unsigned long long)sl->io.offset, sl->io.detail[0] ? sl->io.detail : sluice_strerror((int)res));
		goto out;
	}
	sl->got += (size_t)res;
	if (sl->got < sl->need) {
		if (res == 0) {
			err = sl__err(sl->io.op == SL_IO_READ ? SLUICE_ESHORT : -EIO,
				      "%s: %s stopped at offset %llu, %zu bytes short (file shrank?)",
				      s->file->path, sl->io.op == SL_IO_READ ? "read" : "write",
				      (unsigned long long)(sl->io.offset + (uint64_t)res), sl->need - sl->got);
			goto out;
		}
		/* Short transfer: continue; O_DIRECT needs alignment, else go buffered. */
		sl->io.offset += (uint64_t)res;
		sl->io.buf = (char *)sl->io.buf + res;
		sl->io.len -= (size_t)res;
		sl->io.buf_index = -1;
		if (sl->direct && ((uint64_t)res % SL_ALIGN))
			sl->io.direct = 0;
		err = sl_submit_io(w, sl);
		goto out;
	}
	if (sl->io.op == SL_IO_WRITE) {
		sl_slot_finish(w, sl, 0);
		return;
	}
	if (sl->job->crc) {
		/* Checksums on this worker, from the host bytes, before any DMA. */
		for (uint32_t i = 0; i < s->npieces; i++) {
			struct sl__piece *p = &sl->job->pieces[s->piece0 + i];
			const char *b = sl->zero_copy ? p->mem : sl->buf + sl->head + p->seg_off;

			int kind = sl->job->crc == SL_JOB_OBJECT_SUM ? s->file->s.sum_kind : SL_CRC32C;
			/* The backend's sum, taken as the bytes arrived, where it covers exactly this piece. */
			if (sl->io.sum_kind && sl_one_piece(sl) && !sl->head && sl->got == p->len)
				p->crc = sl->io.sum;
			else
				p->crc = sl__crc(kind, 0, b, p->len);
		}
	}
	if (sl_copy_pieces(w, sl, &err)) {
		sl->state = SL_DMA;
		return;
	}
	if (!err) {
		sl_slot_finish(w, sl, 0);
		return;
	}
out:
	if (err)
		sl_slot_finish(w, sl, err);
}

/* Handles a slot whose DMA has completed. */
static void sl_dma_done(struct sl__worker *w, struct sl__slot *sl)
{
	int err = 0;

	if (sl->job->op == SL_IO_READ) {
		sl_slot_finish(w, sl, 0);
		return;
	}
	err = sl_write_io(w, sl);
	if (err)
		sl_slot_finish(w, sl, err);
}

static int sl_reap(struct sl__worker *w, struct sl__io_ctx *ctx, int wait)
{
	struct sl__io *done[64];
	int n = sl__io_reap(ctx, done, 64, wait);

	if (n < 0) {
		/* Ring failure: fail everything this backend has in flight. */
		for (unsigned i = 0; i < w->nslots; i++)
			if (w->slots[i].state == SL_IO && w->slots[i].ctx == ctx) {
				w->slots[i].io.res = n;
				sl_io_done(w, &w->slots[i]);
			}
		ctx->inflight = 0;
		return 1;
	}
	for (int i = 0; i < n; i++)
		sl_io_done(w, done[i]->user);
	return n;
}

/* Polls DMA completions; with block set, waits for the oldest one. */
static int sl_poll_dma(struct sl__worker *w, int block)
{
	const struct sl__cuda_api *cu = w->eng->gpu.cu;
	struct sl__slot *oldest = NULL;
	int progressed = 0;

	for (unsigned i = 0; i < w->nslots; i++) {
		struct sl__slot *sl = &w->slots[i];
		sl_CUresult r;

		if (sl->state != SL_DMA)
			continue;
		r = cu->EventQuery(sl->ev);
		if (r == SL_CUDA_ERROR_NOT_READY) {
			if (!oldest || sl->t0 < oldest->t0)
				oldest = sl;
			continue;
		}
		if (r != SL_CUDA_SUCCESS) {
			sl_slot_finish(w, sl, sl__cuda_err(r, "DMA completion"));
		} else {
			sl_dma_done(w, sl);
		}
		progressed = 1;
	}
	if (!progressed && block && oldest) {
		sl_CUresult r = cu->EventSynchronize(oldest->ev);

		if (r != SL_CUDA_SUCCESS)
			sl_slot_finish(w, oldest, sl__cuda_err(r, "DMA completion"));
		else
			sl_dma_done(w, oldest);
		progressed = 1;
	}
	return progressed;
}

static void sl_worker_loop(struct sl__worker *w)
{
	struct sluice_engine *eng = w->eng;

	for (;;) {
		unsigned busy = 0, dma = 0, freeslots = 0, buffered = 0;
		int more = 1;

		for (unsigned i = 0; i < w->nslots; i++)
			buffered += w->slots[i].state != SL_FREE && !w->slots[i].direct;
		/* Fill free slots with new segments. */
		for (unsigned i = 0; i < w->nslots && more; i++) {
			struct sl__slot *sl = &w->slots[i];
			struct sl__job *job;
			size_t seg;

			if (sl->state != SL_FREE)
				continue;
			if (buffered >= SL_BUFFERED_DEPTH) {
				more = 0;
				break;
			}
			job = sl__claim(eng, &seg, w->lane);
			if (!job) {
				more = 0;
			} else {
				sl_start(w, sl, job, seg);
				buffered += !sl->direct;
			}
		}
		for (unsigned i = 0; i < w->nslots; i++) {
			busy += w->slots[i].state != SL_FREE;
			dma += w->slots[i].state == SL_DMA;
			freeslots += w->slots[i].state == SL_FREE;
		}
		if (!busy) {
			pthread_mutex_lock(&eng->lock);
			while (!sl__claimable(eng, w->lane) && !eng->stopping)
				pthread_cond_wait(&eng->work_cv, &eng->lock);
			if (!sl__claimable(eng, w->lane) && eng->stopping) {
				pthread_mutex_unlock(&eng->lock);
				return;
			}
			pthread_mutex_unlock(&eng->lock);
			continue;
		}
		/*
		 * Progress: block on storage only when no DMA is pending (a DMA
		 * of one chunk takes far less time than a storage read of one).
		 */
		int progressed = sl_reap(w, &w->ctx[eng->local->id], !dma && !(freeslots && more)) > 0;

		for (int i = 0; i < SL_STORES; i++)
			if (w->ctx[i].ops && i != eng->local->id)
				progressed |= sl_reap(w, &w->ctx[i], 0) > 0;
		if (dma)
			progressed |= sl_poll_dma(w, !progressed);
	}
}

static void *sl_worker_thread(void *arg)
{
	struct sl__worker *w = arg;
	struct sluice_engine *eng = w->eng;
	int rc;

	/*
	 * On the GPU's NUMA node before anything is touched: the slots' pages
	 * are faulted in (pinned) by this thread, so they land on that node.
	 * A cpuset that excludes the node's CPUs refuses this; the worker
	 * then runs where it may.
	 */
	if (eng->numa_node[w->lane] >= 0 &&
	    pthread_setaffinity_np(pthread_self(), sizeof(eng->numa_cpus[0]), &eng->numa_cpus[w->lane]))
		sl__debug("xfer", "worker: not placed on NUMA node %d (cpuset)", eng->numa_node[w->lane]);
	rc = sl_worker_init(w);

	pthread_mutex_lock(&eng->lock);
	if (rc && !eng->init_err)
		eng->init_err = rc;
	eng->started++;
	pthread_cond_broadcast(&eng->done_cv);
	/*
	 * Register the slots only once every worker has started: it faults
	 * and pins their pages, CPU time that the workers still starting, and
	 * so the engine's open, would otherwise share (12 workers on the
	 * 2-core CPU machine: open 37-290 ms before, 7-16 ms after).
	 */
	while (eng->started < eng->nworkers)
		pthread_cond_wait(&eng->done_cv, &eng->lock);
	pthread_mutex_unlock(&eng->lock);
	if (!rc) {
		sl_worker_prepare(w);
		sl_worker_loop(w);
	} else {
		/* Stay joinable; engine_open closes the engine on init_err. */
		pthread_mutex_lock(&eng->lock);
		while (!eng->stopping)
			pthread_cond_wait(&eng->work_cv, &eng->lock);
		pthread_mutex_unlock(&eng->lock);
	}
	sl_worker_fini(w);
	return NULL;
}

void sl__worker_join(struct sl__worker *w)
{
	if (w->eng)
		pthread_join(w->thread, NULL);
}

void sl__worker_setup(struct sl__worker *w, struct sluice_engine *eng, unsigned id)
{
	int rc;

	w->eng = eng;
	w->id = id;
	w->lane = id % eng->nlanes;
	w->gpu = eng->lane[w->lane];
	rc = pthread_create(&w->thread, NULL, sl_worker_thread, w);
	if (rc) {
		pthread_mutex_lock(&eng->lock);
		if (!eng->init_err)
			eng->init_err = -rc;
		eng->started++;
		pthread_mutex_unlock(&eng->lock);
		w->eng = NULL;
	}
}
