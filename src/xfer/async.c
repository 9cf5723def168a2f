/*
 * Transfers ordered on a caller's CUDA stream.
 *
 * At submission three things are queued on the caller's stream:
 *   1. a host function, the gate, that hands the job to the workers once
 *      every earlier piece of work on the stream has finished;
 *   2. cuStreamWaitValue32 on a 32-bit flag in pinned host memory mapped
 *      into the GPU, so later work waits until the flag is set;
 *   3. an event, so the future knows when the stream has passed the wait.
 * When the job finishes (all its DMA complete) the engine sets the flag
 * from the CPU.  No host function ever blocks: CUDA forbids a host
 * function to wait on work it does not precede, and a blocking one
 * deadlocked against the workers' own copies.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "xfer/xfer.h"

#define SL_FLAGS 4096 /* async transfers in flight per engine */

struct sluice_future {
	struct sluice_engine *eng;
	struct sl__job job;
	struct sluice_range range;
	sl_CUevent passed; /* recorded on the caller's stream after the wait */
	unsigned flag;
	int write;
};

/* Maps the flag page on first use. */
static int sl_flags_init(struct sluice_engine *eng)
{
	const struct sl__cuda_api *cu = eng->gpu.cu;
	size_t len = SL_FLAGS * sizeof(uint32_t);
	void *p;
	int rc;

	if (eng->flags)
		return 0;
	eng->flag_free = malloc(SL_FLAGS * sizeof(*eng->flag_free));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!eng->flag_free || p == MAP_FAILED) {
		free(eng->flag_free);
		eng->flag_free = NULL;
		if (p != MAP_FAILED)
			munmap(p, len);
		return -ENOMEM;
	}
	rc = SL_CU(cu->MemHostRegister(p, len, SL_CU_MEMHOSTREGISTER_PORTABLE | SL_CU_MEMHOSTREGISTER_DEVICEMAP),
		   "cuMemHostRegister (async flags)");
	if (!rc)
		rc = SL_CU(cu->MemHostGetDevicePointer(&eng->flags_dev, p, 0), "cuMemHostGetDevicePointer");
	if (rc) {
		cu->MemHostUnregister(p);
		munmap(p, len);
		free(eng->flag_free);
		eng->flag_free = NULL;
		return rc;
	}
	for (unsigned i = 0; i < SL_FLAGS; i++)
		eng->flag_free[i] = (uint16_t)(SL_FLAGS - 1 - i);
	eng->nflag_free = SL_FLAGS;
	eng->flags = p;
	return 0;
}

void sl__async_fini(struct sluice_engine *eng)
{
	if (!eng->flags)
		return;
	eng->gpu.cu->MemHostUnregister((void *)eng->flags);
	munmap((void *)eng->flags, SL_FLAGS * sizeof(uint32_t));
	free(eng->flag_free);
	eng->flags = NULL;
}

/* Called under the engine lock when the job finishes, with or without error. */
static void sl_release_stream(struct sl__job *job)
{
	struct sluice_future *fut = job->user;

	/*
	 * Release store: every byte of the transfer is in place (all DMA
	 * events completed) before the GPU can observe the flag.
	 */
	atomic_store_explicit(&fut->eng->flags[fut->flag], 1, memory_order_release);
}

static void sl_gate(void *arg)
{
	struct sluice_future *fut = arg;

	sl__job_submit(fut->eng, &fut->job);
}

static int sl_async(struct sluice_file *f, uint64_t off, size_t len, void *mem, void *stream,
		    int op, struct sluice_future **out)
{
	struct sluice_engine *eng = f->eng;
	const struct sl__cuda_api *cu = eng->gpu.cu;
	struct sluice_future *fut;
	int rc;

	*out = NULL;
	sl__err_clear();
	if (!eng->gpu.ctx)
		return sl__err(SLUICE_ENOGPU, "asynchronous transfers need a GPU stream; engine has no GPU");
	fut = calloc(1, sizeof(*fut));
	if (!fut)
		return -ENOMEM;
	fut->eng = eng;
	fut->write = op == SL_IO_WRITE;
	fut->range = (struct sluice_range){ f, off, len, mem };
	rc = sl__plan(eng, &fut->job, op, &fut->range, 1, 0);
	if (rc) {
		free(fut);
		return rc;
	}
	fut->job.on_finish = sl_release_stream;
	fut->job.user = fut;

	pthread_mutex_lock(&eng->lock);
	rc = sl_flags_init(eng);
	if (!rc && !eng->nflag_free)
		rc = sl__err(-EBUSY, "more than %d asynchronous transfers in flight", SL_FLAGS);
	if (!rc)
		fut->flag = eng->flag_free[--eng->nflag_free];
	pthread_mutex_unlock(&eng->lock);
	if (rc)
		goto fail_plan;
	atomic_store(&eng->flags[fut->flag], 0);

	rc = sl__gpu_bind(&eng->gpu);
	if (!rc)
		rc = SL_CU(cu->EventCreate(&fut->passed, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
	if (rc)
		goto fail_flag;
	rc = SL_CU(cu->LaunchHostFunc((sl_CUstream)stream, sl_gate, fut), "cuLaunchHostFunc");
	if (rc)
		goto fail_event;
	/*
	 * The gate is queued and will start the job whatever happens next; if
	 * the wait cannot be queued, the stream is not held but the future
	 * still reports the transfer's result.
	 */
	rc = SL_CU(cu->StreamWaitValue32((sl_CUstream)stream, eng->flags_dev + fut->flag * sizeof(uint32_t), 1,
					 SL_CU_STREAM_WAIT_VALUE_GEQ),
		   "cuStreamWaitValue32 (stream memory operations unsupported?)");
	if (!rc)
		rc = SL_CU(cu->EventRecord(fut->passed, (sl_CUstream)stream), "cuEventRecord");
	if (rc) {
		sl__warn("xfer", "async transfer is not ordered before later stream work: %s",
			 sluice_last_error_detail());
		cu->EventDestroy(fut->passed);
		fut->passed = NULL;
	}
	*out = fut;
	return 0;
fail_event:
	cu->EventDestroy(fut->passed);
fail_flag:
	pthread_mutex_lock(&eng->lock);
	eng->flag_free[eng->nflag_free++] = (uint16_t)fut->flag;
	pthread_mutex_unlock(&eng->lock);
fail_plan:
	sl__plan_free(&fut->job);
	free(fut);
	return rc;
}

int sluice_read_async(struct sluice_file *f, uint64_t offset, size_t len, void *dst, void *stream,
		      struct sluice_future **out)
{
	return sl_async(f, offset, len, dst, stream, SL_IO_READ, out);
}

int sluice_write_async(struct sluice_file *f, uint64_t offset, size_t len, const void *src,
		       void *stream, struct sluice_future **out)
{
	return sl_async(f, offset, len, (void *)src, stream, SL_IO_WRITE, out);
}

ssize_t sluice_future_wait(struct sluice_future *fut, struct sluice_xfer_report *rep)
{
	ssize_t rc = sl__job_wait(fut->eng, &fut->job, rep);

	if (rc >= 0 && fut->write) {
		int frc = sl__fix_size(&fut->range, 1);

		if (frc)
			return frc;
	}
	return rc;
}

void sluice_future_free(struct sluice_future *fut)
{
	struct sluice_engine *eng;

	if (!fut)
		return;
	eng = fut->eng;
	(void)sl__job_wait(eng, &fut->job, NULL);
	/* The flag may be reused only once the stream has passed its wait. */
	if (fut->passed) {
		sl__gpu_bind(&eng->gpu);
		eng->gpu.cu->EventSynchronize(fut->passed);
		eng->gpu.cu->EventDestroy(fut->passed);
	}
	pthread_mutex_lock(&eng->lock);
	eng->flag_free[eng->nflag_free++] = (uint16_t)fut->flag;
	pthread_mutex_unlock(&eng->lock);
	sl__plan_free(&fut->job);
	free(fut);
}
