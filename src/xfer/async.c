/*
 * Transfers ordered on a caller's CUDA stream.
 *
 * Two host functions are enqueued on the stream: the gate, which runs
 * once all earlier work on the stream is done and hands the job to the
 * workers, and the barrier, which holds the stream until the job has
 * finished, so later work sees the bytes.  The workers' own streams are
 * non-blocking, so a barrier parked on the legacy default stream cannot
 * deadlock them.  Host functions MUST NOT call CUDA; these only take
 * locks.
 *
 * The future is shared by the caller and the barrier; whoever drops the
 * last reference frees it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "xfer/xfer.h"

struct sluice_future {
	struct sluice_engine *eng;
	struct sl__job job;
	struct sluice_range range;
	_Atomic int refs;
	int write;
};

static void sl_future_put(struct sluice_future *fut)
{
	if (atomic_fetch_sub(&fut->refs, 1) == 1) {
		sl__plan_free(&fut->job);
		free(fut);
	}
}

static void sl_gate(void *arg)
{
	struct sluice_future *fut = arg;

	sl__job_submit(fut->eng, &fut->job);
}

static void sl_barrier(void *arg)
{
	struct sluice_future *fut = arg;
	struct sluice_engine *eng = fut->eng;

	pthread_mutex_lock(&eng->lock);
	while (!fut->job.finished)
		pthread_cond_wait(&eng->done_cv, &eng->lock);
	pthread_mutex_unlock(&eng->lock);
	sl_future_put(fut);
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
	fut->range = (struct sluice_range){ f, off, len, mem };
	rc = sl__plan(eng, &fut->job, op, &fut->range, 1);
	if (rc) {
		free(fut);
		return rc;
	}
	fut->refs = 2;
	rc = sl__gpu_bind(&eng->gpu);
	if (!rc)
		rc = SL_CU(cu->LaunchHostFunc((sl_CUstream)stream, sl_gate, fut), "cuLaunchHostFunc");
	if (rc) {
		sl__plan_free(&fut->job);
		free(fut);
		return rc;
	}
	rc = SL_CU(cu->LaunchHostFunc((sl_CUstream)stream, sl_barrier, fut), "cuLaunchHostFunc");
	if (rc) /* the gate still runs the job; only the ordering after it is lost */
		atomic_fetch_sub(&fut->refs, 1);
	fut->write = op == SL_IO_WRITE;
	*out = fut;
	return 0;
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
	if (!fut)
		return;
	(void)sl__job_wait(fut->eng, &fut->job, NULL);
	sl_future_put(fut);
}
