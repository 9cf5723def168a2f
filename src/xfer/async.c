/*
 * Transfers ordered on a caller's CUDA stream.
 *
 * The transfer is cut into chunks of max_transfer_size x threads bytes,
 * staged through two halves of a pinned host buffer.  At submission the
 * stream gets, for every chunk i:
 *
 *   read:  wait(flag >= i + 1)  H2D copy half -> dst   record ev[i]
 *   write: wait(flag >= i - 1)  D2H copy src -> half   record ev[i]
 *
 * A coordinator thread runs the storage side: it hands each chunk to the
 * engine's workers as a host-memory job and raises the flag (pinned host
 * memory mapped into the GPU) as chunks finish.  A read's chunk i + 2
 * reuses a half once ev[i] says the GPU has copied it out; a write's
 * chunk i goes to storage once ev[i] says its bytes are in the half.
 *
 * So the GPU only ever waits for storage I/O, which waits for nothing on
 * the GPU but the copies this stream already passed: no cycle.  No host
 * function is used: CUDA forbids one to wait on other CUDA work, and an
 * earlier design that let the workers' own DMA release the stream
 * deadlocked when the driver put the caller's stream and a worker's stream
 * in one hardware queue.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "xfer/xfer.h"


struct sluice_future {
	struct sluice_engine *eng;
	struct sl_async *a;       /* the engine's async state */
	struct sluice_range range;
	int write;
	unsigned flag;
	size_t chunk, nchunks;    /* chunk size and count */
	char *stage;              /* 2 * chunk bytes */
	size_t stage_len;
	int stage_pinned;
	sl_CUevent *ev;           /* ev[i]: the stream is past chunk i's copy */
	pthread_t thread;
	int joined;
	struct sl__job jobs[2];   /* chunks i and i - 1 in flight */
	struct sl__job sum;       /* counters of all chunks, for the report */
	ssize_t result;
	char detail[384];
	uint64_t t0;
	/* A call future (sl__future_call): fn(arg) on the thread, then cb. */
	ssize_t (*fn)(void *arg, struct sluice_xfer_report *rep);
	void *arg;
	void (*free_arg)(void *arg);
	void (*cb)(ssize_t result, void *user);
	void *user;
	struct sluice_xfer_report rep;
};

static void *sl_call_run(void *p)
{
	struct sluice_future *fut = p;

	fut->result = fut->fn(fut->arg, &fut->rep);
	if (fut->result < 0)
		snprintf(fut->detail, sizeof(fut->detail), "%s", sluice_last_error_detail());
	if (fut->cb)
		fut->cb(fut->result, fut->user);
	return NULL;
}

int sl__future_call(struct sluice_future **out, ssize_t (*fn)(void *arg, struct sluice_xfer_report *rep), void *arg,
		    void (*free_arg)(void *arg), void (*cb)(ssize_t result, void *user), void *user)
{
	struct sluice_future *fut = calloc(1, sizeof(*fut));
	int rc;

	*out = NULL;
	if (!fut) {
		free_arg(arg);
		return -ENOMEM;
	}
	*fut = (struct sluice_future){ .fn = fn, .arg = arg, .free_arg = free_arg, .cb = cb, .user = user,
				       .t0 = sl__now_ns(), .rep = { .size = sizeof(fut->rep) } };
	rc = pthread_create(&fut->thread, NULL, sl_call_run, fut);
	if (rc) {
		free_arg(arg);
		free(fut);
		return sl__err(-rc, "no thread for the transfer: %s", strerror(rc));
	}
	*out = fut;
	return 0;
}

#define SL_FLAGS 4096 /* async transfers in flight per engine */

/*
 * An engine's async state (sl__eng_attach): its completion flags, pinned
 * and mapped into the GPU's address space so a caller's stream can wait on
 * one, and a spare staging buffer for the next transfer.
 */
struct sl_async {
	struct sluice_engine *eng;
	pthread_mutex_t lock;
	_Atomic uint32_t *flags;
	sl_CUdeviceptr flags_dev;
	uint16_t *flag_free;       /* stack of free flag indexes */
	unsigned nflag_free;
	char *stage_cache;
	size_t stage_cache_len;
	int stage_cache_pinned;
};

static void sl_async_drop(struct sluice_engine *eng, void *state)
{
	struct sl_async *a = state;
	struct sl__gpu *g = sl__eng_gpu(eng);

	if (a->stage_cache)
		sl__host_free(g, a->stage_cache, a->stage_cache_len, a->stage_cache_pinned);
	g->cu->MemHostUnregister((void *)a->flags);
	munmap((void *)a->flags, SL_FLAGS * sizeof(uint32_t));
	pthread_mutex_destroy(&a->lock);
	free(a->flag_free);
	free(a);
}

/* Maps the flag page on an engine's first async transfer; NULL and the error in *err if it cannot. */
static void *sl_async_make(struct sluice_engine *eng, int *err)
{
	const struct sl__cuda_api *cu = sl__eng_gpu(eng)->cu;
	size_t len = SL_FLAGS * sizeof(uint32_t);
	struct sl_async *a = calloc(1, sizeof(*a));
	void *p = MAP_FAILED;
	int rc = -ENOMEM;

	if (a && (a->flag_free = malloc(SL_FLAGS * sizeof(*a->flag_free))))
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED) {
		rc = SL_CU(cu->MemHostRegister(p, len, SL_CU_MEMHOSTREGISTER_PORTABLE | SL_CU_MEMHOSTREGISTER_DEVICEMAP),
			   "cuMemHostRegister (async flags)");
		if (!rc)
			rc = SL_CU(cu->MemHostGetDevicePointer(&a->flags_dev, p, 0), "cuMemHostGetDevicePointer");
		if (rc)
			cu->MemHostUnregister(p);
	}
	if (rc) {
		if (p != MAP_FAILED)
			munmap(p, len);
		if (a)
			free(a->flag_free);
		free(a);
		*err = rc == -ENOMEM ? sl__err(rc, "the async transfers' flag page: no memory") : rc;
		return NULL;
	}
	for (unsigned i = 0; i < SL_FLAGS; i++)
		a->flag_free[i] = (uint16_t)(SL_FLAGS - 1 - i);
	a->nflag_free = SL_FLAGS;
	a->flags = p;
	a->eng = eng;
	pthread_mutex_init(&a->lock, NULL);
	return a;
}

static void sl_set_flag(struct sluice_future *fut, size_t v)
{
	/* Release: the chunk's bytes are in place before the GPU sees the flag. */
	atomic_store_explicit(&fut->a->flags[fut->flag], (uint32_t)v, memory_order_release);
}

/* Chunk i's share of the transfer, as a host-memory range on its staging half. */
static struct sluice_range sl_chunk(const struct sluice_future *fut, size_t i)
{
	size_t off = i * fut->chunk, len = fut->range.len - off < fut->chunk ? fut->range.len - off : fut->chunk;

	return (struct sluice_range){ fut->range.file, fut->range.offset + off, len,
				      fut->stage + (i % 2) * fut->chunk };
}

/* Waits for chunk i's job and adds it to the sum; 0 or its error. */
static int sl_chunk_wait(struct sluice_future *fut, size_t i)
{
	struct sl__job *job = &fut->jobs[i % 2];
	ssize_t rc = sl__job_wait(fut->eng, job, NULL);

	atomic_fetch_add(&fut->sum.bytes, atomic_load(&job->bytes));
	atomic_fetch_add(&fut->sum.bytes_direct, atomic_load(&job->bytes_direct));
	atomic_fetch_add(&fut->sum.bytes_buffered, atomic_load(&job->bytes_buffered));
	atomic_fetch_add(&fut->sum.ios, atomic_load(&job->ios));
	atomic_fetch_add(&fut->sum.bytes_storage, atomic_load(&job->bytes_storage));
	sl__paths_merge(&fut->sum.paths, &job->paths);
	if (rc < 0)
		snprintf(fut->detail, sizeof(fut->detail), "%s", job->detail);
	sl__plan_free(job);
	return rc < 0 ? (int)rc : 0;
}

/* The storage side of one transfer (see the top of the file). */
static void *sl_coordinate(void *arg)
{
	struct sluice_future *fut = arg;
	struct sluice_engine *eng = fut->eng;
	const struct sl__cuda_api *cu = sl__eng_gpu(eng)->cu;
	size_t n = fut->nchunks, live = 0; /* chunks submitted */
	int err = sl__gpu_bind(sl__eng_gpu(eng));

	for (size_t i = 0; i <= n; i++) {
		if (i < n && !err) {
			/* A read's half is free once chunk i - 2 left it; a write's bytes are in it. */
			if (fut->write || i >= 2) {
				sl_CUresult r = cu->EventSynchronize(fut->ev[fut->write ? i : i - 2]);

				if (r != SL_CUDA_SUCCESS)
					err = sl__cuda_err(r, "cuEventSynchronize (async chunk)");
			}
			if (!err) {
				struct sluice_range w = sl_chunk(fut, i);

				err = sl__plan(eng, &fut->jobs[i % 2], fut->write ? SL_IO_WRITE : SL_IO_READ, &w, 1, 0);
				if (err)
					snprintf(fut->detail, sizeof(fut->detail), "%s", sluice_last_error_detail());
				else
					sl__job_submit(eng, &fut->jobs[i % 2]);
				live += !err;
			}
		}
		if (i >= 1 && i <= live) {
			int rc = sl_chunk_wait(fut, i - 1);

			if (rc && !err)
				err = rc;
		}
		/* After an error the rest of the stream is let go: the future carries the error. */
		if (i >= 1)
			sl_set_flag(fut, err ? n + 1 : i);
	}
	/* Every submitted chunk has been waited for: the halves are idle on the host side. */
	fut->result = err ? err : (ssize_t)fut->range.len;
	return NULL;
}

/* Pinned staging: the engine's async state keeps one buffer for the next transfer. */
static int sl_stage_get(struct sluice_future *fut)
{
	struct sl_async *a = fut->a;
	size_t len = 2 * fut->chunk;

	pthread_mutex_lock(&a->lock);
	if (a->stage_cache && a->stage_cache_len >= len) {
		fut->stage = a->stage_cache;
		fut->stage_len = a->stage_cache_len;
		fut->stage_pinned = a->stage_cache_pinned;
		a->stage_cache = NULL;
	}
	pthread_mutex_unlock(&a->lock);
	if (fut->stage)
		return 0;
	fut->stage_len = len;
	return sl__host_alloc(sl__eng_gpu(fut->eng), len, (void **)&fut->stage, &fut->stage_pinned);
}

static void sl_stage_put(struct sluice_future *fut)
{
	struct sl_async *a = fut->a;

	if (!fut->stage)
		return;
	pthread_mutex_lock(&a->lock);
	if (!a->stage_cache || a->stage_cache_len < fut->stage_len) {
		char *old = a->stage_cache;
		size_t old_len = a->stage_cache_len;
		int old_pinned = a->stage_cache_pinned;

		a->stage_cache = fut->stage;
		a->stage_cache_len = fut->stage_len;
		a->stage_cache_pinned = fut->stage_pinned;
		fut->stage = old;
		fut->stage_len = old_len;
		fut->stage_pinned = old_pinned;
	}
	pthread_mutex_unlock(&a->lock);
	sl__host_free(sl__eng_gpu(fut->eng), fut->stage, fut->stage_len, fut->stage_pinned);
	fut->stage = NULL;
}

/* Releases everything but the thread; the stream must be past every recorded event. */
static void sl_future_release(struct sluice_future *fut, size_t nev)
{
	struct sl_async *a = fut->a;

	for (size_t i = 0; i < nev; i++)
		if (fut->ev[i])
			sl__eng_gpu(fut->eng)->cu->EventDestroy(fut->ev[i]);
	free(fut->ev);
	sl_stage_put(fut);
	pthread_mutex_lock(&a->lock);
	a->flag_free[a->nflag_free++] = (uint16_t)fut->flag;
	pthread_mutex_unlock(&a->lock);
	free(fut);
}

/* Queues chunk i's wait, copy and event on the stream. */
static int sl_enqueue(struct sluice_future *fut, size_t i, sl_CUstream s)
{
	const struct sl__cuda_api *cu = sl__eng_gpu(fut->eng)->cu;
	struct sluice_range w = sl_chunk(fut, i);
	sl_CUdeviceptr flag = fut->a->flags_dev + fut->flag * sizeof(uint32_t);
	sl_CUdeviceptr dev = (sl_CUdeviceptr)(uintptr_t)((char *)fut->range.buf + i * fut->chunk);
	int rc;

	rc = SL_CU(cu->EventCreate(&fut->ev[i], SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
	if (rc)
		return rc;
	if (!fut->write || i >= 2)
		rc = SL_CU(cu->StreamWaitValue32(s, flag, (uint32_t)(fut->write ? i - 1 : i + 1),
						 SL_CU_STREAM_WAIT_VALUE_GEQ),
			   "cuStreamWaitValue32 (stream memory operations unsupported?)");
	if (!rc && fut->write)
		rc = SL_CU(cu->MemcpyDtoHAsync(w.buf, dev, w.len, s), "cuMemcpyDtoHAsync");
	else if (!rc)
		rc = SL_CU(cu->MemcpyHtoDAsync(dev, w.buf, w.len, s), "cuMemcpyHtoDAsync");
	if (!rc)
		rc = SL_CU(cu->EventRecord(fut->ev[i], s), "cuEventRecord");
	if (rc) {
		cu->EventDestroy(fut->ev[i]);
		fut->ev[i] = NULL;
	}
	return rc;
}

static int sl_async(struct sluice_file *f, uint64_t off, size_t len, void *mem, void *stream,
		    int write, struct sluice_future **out)
{
	struct sluice_engine *eng = f->eng;
	struct sl__gpu *g = sl__eng_gpu(eng);
	struct sluice_future *fut;
	struct sl_async *a;
	size_t i = 0;
	int rc;

	*out = NULL;
	sl__err_clear();
	if (!g->ctx)
		return sl__err(SLUICE_ENOGPU, "asynchronous transfers need a GPU stream; engine has no GPU");
	if (!len)
		return sl__err(-EINVAL, "asynchronous transfer of 0 bytes");
	if (!sl__gpu_is_device_ptr(g, mem))
		return sl__err(SLUICE_ENOTGPU, "asynchronous transfers move GPU memory; %p is not", mem);
	if (!write && off + len > atomic_load(&f->s.size))
		return sl__err(SLUICE_ERANGE, "%s: async read of [%llu, %llu) passes the end (%llu bytes)", f->path,
			       (unsigned long long)off, (unsigned long long)(off + len),
			       (unsigned long long)atomic_load(&f->s.size));
	if (!(a = sl__eng_attach(eng, SL_ATTACH_ASYNC, sl_async_make, sl_async_drop, &rc)))
		return rc;
	fut = calloc(1, sizeof(*fut));
	if (!fut)
		return -ENOMEM;
	fut->eng = eng;
	fut->a = a;
	fut->write = write;
	fut->range = (struct sluice_range){ f, off, len, mem };
	fut->sum.op = write ? SL_IO_WRITE : SL_IO_READ;
	fut->chunk = sl__eng_cfg(eng)->max_transfer_size * (sl__eng_threads(eng) ? sl__eng_threads(eng) : 1);
	if (fut->chunk > ((len + 4095) & ~(size_t)4095))
		fut->chunk = (len + 4095) & ~(size_t)4095;
	fut->nchunks = (len + fut->chunk - 1) / fut->chunk;
	fut->ev = calloc(fut->nchunks, sizeof(*fut->ev));
	if (!fut->ev) {
		free(fut);
		return -ENOMEM;
	}

	pthread_mutex_lock(&a->lock);
	rc = a->nflag_free ? 0 : sl__err(-EBUSY, "more than %d asynchronous transfers in flight", SL_FLAGS);
	if (!rc)
		fut->flag = a->flag_free[--a->nflag_free];
	pthread_mutex_unlock(&a->lock);
	if (rc) {
		free(fut->ev);
		free(fut);
		return rc;
	}
	sl_set_flag(fut, 0);
	rc = sl_stage_get(fut);
	if (!rc)
		rc = sl__gpu_bind(g);
	for (; !rc && i < fut->nchunks; i++)
		rc = sl_enqueue(fut, i, (sl_CUstream)stream);
	if (!rc) {
		fut->t0 = sl__now_ns();
		rc = pthread_create(&fut->thread, NULL, sl_coordinate, fut);
		if (rc)
			rc = sl__err(-rc, "starting the async transfer's thread");
	}
	if (rc) {
		/* Let go of whatever was queued, and wait until the stream is past it. */
		sl_set_flag(fut, fut->nchunks + 1);
		if (i)
			g->cu->StreamSynchronize((sl_CUstream)stream);
		sl_future_release(fut, fut->nchunks);
		return rc;
	}
	*out = fut;
	return 0;
}

int sluice_read_async(struct sluice_file *f, uint64_t offset, size_t len, void *dst, void *stream,
		      struct sluice_future **out)
{
	return sl_async(f, offset, len, dst, stream, 0, out);
}

int sluice_write_async(struct sluice_file *f, uint64_t offset, size_t len, const void *src,
		       void *stream, struct sluice_future **out)
{
	return sl_async(f, offset, len, (void *)src, stream, 1, out);
}

ssize_t sluice_future_wait(struct sluice_future *fut, struct sluice_xfer_report *rep)
{
	int rc = SL_REPORT_IN(rep, xfer_report);

	if (rc)
		return rc;
	if (fut->fn) {
		if (!fut->joined) {
			pthread_join(fut->thread, NULL);
			fut->joined = 1;
		}
		sl__report_copy(rep, &fut->rep, sizeof(fut->rep));
		if (fut->result < 0)
			sl__err((int)fut->result, "%s", fut->detail);
		return fut->result;
	}
	if (!fut->joined) {
		pthread_join(fut->thread, NULL);
		fut->joined = 1;
		if (fut->result >= 0 && fut->write) {
			rc = sl__fix_size(&fut->range, 1);
			if (rc) {
				fut->result = rc;
				snprintf(fut->detail, sizeof(fut->detail), "%s", sluice_last_error_detail());
			}
		}
	}
	if (rep) {
		struct sl__paths host = { 0 };

		/* The chunks moved host memory; the stream carried it on to the GPU. */
		sl__paths_merge(&host, &fut->sum.paths);
		for (unsigned i = 0; i < SL_PATH_WORDS; i++)
			atomic_store(&fut->sum.paths.w[i], 0);
		for (unsigned c = 0; c < SL_PATH_CODES; c++)
			if (sl__paths_has(&host, c))
				sl__paths_add(&fut->sum.paths, c - c % 5 + (fut->stage_pinned ? SL_K_PINNED_GPU : SL_K_PAGEABLE_GPU));
		sl__job_report(&fut->sum, rep);
		for (unsigned i = 0; i < SL_PATH_WORDS; i++)
			atomic_store(&fut->sum.paths.w[i], atomic_load(&host.w[i]));
		rep->seconds = (double)(sl__now_ns() - fut->t0) / 1e9;
	}
	if (fut->result < 0)
		sl__err((int)fut->result, "%s", fut->detail);
	return fut->result;
}

void sluice_future_free(struct sluice_future *fut)
{
	if (!fut)
		return;
	if (sluice_future_wait(fut, NULL) < 0)
		sl__err_clear(); /* the caller chose not to look */
	if (fut->fn) {
		fut->free_arg(fut->arg);
		free(fut);
		return;
	}
	/* The flag, events and halves may go once the stream is past the last copy. */
	sl__gpu_bind(sl__eng_gpu(fut->eng));
	sl__eng_gpu(fut->eng)->cu->EventSynchronize(fut->ev[fut->nchunks - 1]);
	sl_future_release(fut, fut->nchunks);
}
