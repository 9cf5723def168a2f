/*
 * The engine's job list: a call's job is queued here, workers claim its
 * segments one at a time (sl__claim) and count each one done
 * (sl__seg_done); the caller waits for the last (sl__job_wait).
 *
 * Calls among the transfer files run one way: the public calls (file.c,
 * async.c, dsread.c) plan (plan.c) and run jobs here; worker.c claims and
 * finishes their segments here; engine.c starts and stops the workers.
 * Nothing here calls up into those files.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag/diag.h"
#include "engine/pipeline.h"

void sl__job_submit(struct sluice_engine *eng, struct sl__job *job)
{
	job->t0 = sl__now_ns();
	pthread_mutex_lock(&eng->lock);
	if (job->nsegs == 0) {
		job->finished = 1;
		if (job->on_finish)
			job->on_finish(job);
		pthread_cond_broadcast(&eng->done_cv);
	} else {
		job->qnext = NULL;
		*eng->queue_tail = job;
		eng->queue_tail = &job->qnext;
		/*
		 * A worker a segment: waking all of them for a small job cost
		 * every call tens of microseconds (64 KiB reads went at half
		 * the speed with 16 threads as with 1).  All where GPUs divide
		 * the workers into lanes: a woken worker of another lane would
		 * leave the job to the sleepers.
		 */
		if (eng->nlanes > 1 || job->nsegs >= eng->nworkers)
			pthread_cond_broadcast(&eng->work_cv);
		else
			for (size_t i = 0; i < job->nsegs; i++)
				pthread_cond_signal(&eng->work_cv);
	}
	pthread_mutex_unlock(&eng->lock);
}

int sl__claimable(const struct sluice_engine *eng, unsigned lane)
{
	for (const struct sl__job *job = eng->queue; job; job = job->qnext)
		if (job->lane < 0 || (unsigned)job->lane == lane)
			return 1;
	return 0;
}

struct sl__job *sl__claim(struct sluice_engine *eng, size_t *seg, unsigned lane)
{
	struct sl__job *job, **pp;

	pthread_mutex_lock(&eng->lock);
	/* The first job this lane may take: its own GPU's, or one of host memory. */
	for (pp = &eng->queue; (job = *pp) && job->lane >= 0 && (unsigned)job->lane != lane; pp = &job->qnext)
		;
	if (job) {
		*seg = job->next++;
		if (job->next == job->nsegs) {
			*pp = job->qnext;
			if (!*pp)
				eng->queue_tail = pp;
		}
	}
	pthread_mutex_unlock(&eng->lock);
	return job;
}

void sl__seg_done(struct sluice_engine *eng, struct sl__job *job, int err, uint64_t t0)
{
	/*
	 * Read nsegs before counting this segment done: once the last one is
	 * counted the caller may return and reuse the job's memory, so only
	 * the thread that counts the last segment may touch the job after.
	 */
	const size_t nsegs = job->nsegs;
	int zero = 0;

	/* Details are thread-local: keep the first one for the caller. */
	if (err && atomic_compare_exchange_strong(&job->err, &zero, err))
		snprintf(job->detail, sizeof(job->detail), "%s", sluice_last_error_detail());
	else if (!err && t0) {
		uint64_t ns = sl__now_ns() - t0;

		sl__hist_add(&eng->lat, ns);
		sl__metrics_segment(ns);
	}
	if (atomic_fetch_add(&job->done, 1) + 1 == nsegs) {
		sl__metrics_call(job->op == SL_IO_WRITE, atomic_load(&job->bytes), atomic_load(&job->ios),
				 atomic_load(&job->err), sl__now_ns() - job->t0);
		pthread_mutex_lock(&eng->lock);
		job->finished = 1;
		if (job->on_finish)
			job->on_finish(job);
		pthread_cond_broadcast(&eng->done_cv);
		pthread_mutex_unlock(&eng->lock);
	}
}

void sl__job_report(const struct sl__job *job, struct sluice_xfer_report *rep)
{
	/* Memory side of a path, by SL_K_*, as seen by a read and by a write. */
	static const char *const to[] = { "host", "bounce>host", "pinned>gpu", "pageable>gpu", "gpu" };
	static const char *const from[] = { "host", "host>bounce", "gpu>pinned", "gpu>pageable", "gpu" };
	size_t l = 0;

	if (!rep)
		return;
	SL_REPORT_CLEAR(rep);
	rep->bytes = atomic_load(&job->bytes);
	rep->bytes_direct = atomic_load(&job->bytes_direct);
	rep->bytes_buffered = atomic_load(&job->bytes_buffered);
	rep->ios = atomic_load(&job->ios);
	if (SL_COVERS(rep, bytes_storage))
		rep->bytes_storage = atomic_load(&job->bytes_storage);
	for (unsigned c = 0; c < SL_PATH_CODES && l < sizeof(rep->path); c++) {
		unsigned b = c / 10, d = (c % 10) / 5, k = c % 5;
		char io[32];

		if (!sl__paths_has(&job->paths, c))
			continue;
		if (k == SL_K_GDS) /* straight between storage (GPUDirect) or the page cache (DMA from it) and GPU memory */
			snprintf(io, sizeof(io), d ? "%s" : "%s:pagecache", sl__stores[b]->name);
		else
			snprintf(io, sizeof(io), "%s:%s", sl__stores[b]->name, d ? "direct" : "buffered");
		if (job->op == SL_IO_READ)
			l += (size_t)snprintf(rep->path + l, sizeof(rep->path) - l, "%s%s>%s", l ? "+" : "", io, to[k]);
		else
			l += (size_t)snprintf(rep->path + l, sizeof(rep->path) - l, "%s%s>%s", l ? "+" : "", from[k], io);
	}
}

ssize_t sl__job_wait(struct sluice_engine *eng, struct sl__job *job, struct sluice_xfer_report *rep)
{
	int err;

	pthread_mutex_lock(&eng->lock);
	while (!job->finished)
		pthread_cond_wait(&eng->done_cv, &eng->lock);
	pthread_mutex_unlock(&eng->lock);
	err = atomic_load(&job->err);
	if (err)
		sl__err(err, "%s", job->detail);
	sl__job_report(job, rep);
	if (rep)
		rep->seconds = (double)(sl__now_ns() - job->t0) / 1e9;
	return err ? err : (ssize_t)atomic_load(&job->bytes);
}

/* A read of a whole file whose checksum its store learnt at open (an object's: store/store.h's struct sl__sfile). */
static int sl_whole_object(int op, const struct sluice_range *r)
{
	const struct sl__sfile *sf = &r->file->s;

	return op == SL_IO_READ && sf->sum_kind && r->offset == 0 && r->len == atomic_load(&sf->size);
}

/* A whole read of a file whose checksum only its store checks, in one pass over its bytes (store.h's verify). */
static int sl_whole_verify(int op, const struct sluice_range *r)
{
	const struct sl__sfile *sf = &r->file->s;

	return op == SL_IO_READ && !sf->sum_kind && sf->ops->verify && r->offset == 0 && r->len == atomic_load(&sf->size);
}

/* A range read into GPU memory, read back by a store's verify. */
struct sl_readback {
	struct sluice_engine *eng;
	const char *dev;
};

/* len bytes at off of the range into host memory dst (the finished job's copies to it have landed). */
static int sl_readback(void *ctx, void *dst, uint64_t off, size_t len)
{
	const struct sl_readback *b = ctx;

	return sluice_gpu_copy(b->eng, dst, b->dev + off, len);
}

/*
 * The ranges of a finished job that read whole objects, their pieces'
 * CRCs folded in order (a range's pieces are consecutive and in file
 * order) and matched, or their bytes checked by their store (store.h's
 * verify) in host memory, or read back from GPU memory in order (one
 * device-to-host pass: a SHA cannot be folded from pieces); the bytes
 * verified, or SLUICE_EVERIFY naming the first object that did not match.
 * what (cap bytes): what the first range of a file with a checksum name
 * (sum_name) was checked with, or why it was not.
 */
static int64_t sl_match_sums(struct sluice_engine *eng, const struct sl__job *job, const struct sluice_range *r,
			     char *what, size_t cap)
{
	int64_t verified = 0;

	for (size_t p = 0; p < job->npieces;) {
		const uint32_t k = job->pieces[p].range;
		const struct sl__sfile *sf = &r[k].file->s;
		uint64_t crc = job->pieces[p].crc;
		int gpu = job->pieces[p].gpu, rc = 0;

		for (p++; p < job->npieces && job->pieces[p].range == k; p++) {
			gpu |= job->pieces[p].gpu;
			if (sl_whole_object(job->op, &r[k]))
				crc = sl__crc_combine(sf->sum_kind, crc, job->pieces[p].crc, job->pieces[p].len);
		}
		if (sl_whole_object(job->op, &r[k])) {
			const int digits = sf->sum_kind == SL_CRC64NVME ? 16 : 8;

			if (crc != sf->sum)
				return sl__err(SLUICE_EVERIFY, "%s: the %s of the %llu bytes read is %0*llx, the object's is %0*llx",
					       r[k].file->path, sf->sum_name, (unsigned long long)r[k].len, digits,
					       (unsigned long long)crc, digits, (unsigned long long)sf->sum);
			rc = 1;
		} else if (sl_whole_verify(job->op, &r[k])) {
			struct sl_readback back = { eng, r[k].buf };

			rc = gpu ? sf->ops->verify(sf, NULL, r[k].len, sl_readback, &back)
				 : sf->ops->verify(sf, r[k].buf, r[k].len, NULL, NULL);
			if (rc < 0)
				return rc;
		}
		if (rc == 1)
			verified += (int64_t)r[k].len;
		if (what[0] || !sf->sum_name[0])
			continue;
		if (rc == 1 && gpu && !sl_whole_object(job->op, &r[k]))
			snprintf(what, cap, "%.10s (verified: read back from GPU memory)", sf->sum_name);
		else if (rc == 1 || !strncmp(sf->sum_name, "none", 4) || strchr(sf->sum_name, '('))
			snprintf(what, cap, "%s", sf->sum_name);
		else if (r[k].offset || r[k].len != atomic_load(&sf->size))
			snprintf(what, cap, "none (a part; its %.10s covers the whole)", sf->sum_name);
		else
			snprintf(what, cap, "%.10s (not verified)", sf->sum_name);
	}
	return verified;
}

ssize_t sl__transfer(struct sluice_engine *eng, int op, const struct sluice_range *r, size_t n,
		     struct sluice_xfer_report *rep)
{
	struct sl__job job;
	ssize_t rc;
	int64_t verified = 0;
	int sums = 0, check = 0;
	char what[64] = "";
	uint64_t t0 = sl__now_ns();

	sl__err_clear();
	if ((rc = SL_REPORT_IN(rep, xfer_report)))
		return rc;
	for (size_t k = 0; k < n; k++) {
		sums |= sl_whole_object(op, &r[k]);
		check |= op == SL_IO_READ && r[k].file->s.sum_name[0];
	}
	/* A mismatch (bytes damaged on the way) is read once more, then is an error. */
	for (int pass = 0; pass < 2; pass++) {
		rc = sl__plan(eng, &job, op, r, n, sums ? SL_JOB_OBJECT_SUM : 0);
		if (rc) {
			if (rep) {
				SL_REPORT_CLEAR(rep);
				rep->seconds = (double)(sl__now_ns() - t0) / 1e9;
			}
			return rc;
		}
		sl__job_submit(eng, &job);
		rc = sl__job_wait(eng, &job, rep);
		what[0] = 0;
		if (rc >= 0 && check)
			verified = sl_match_sums(eng, &job, r, what, sizeof(what));
		sl__plan_free(&job);
		if (rc < 0 || verified >= 0)
			break;
		if ((rc = verified) != SLUICE_EVERIFY)
			break; /* not a mismatch (no memory, a failed read back from the GPU): no reason to read again */
		sl__warn("s3", "%s%s", sluice_last_error_detail(), pass ? " (read twice)" : "; reading it again");
	}
	if (rep && rc >= 0)
		rep->bytes_verified = (uint64_t)verified;
	if (rep && rc >= 0 && SL_COVERS(rep, checksum))
		snprintf(rep->checksum, sizeof(rep->checksum), "%s", what);
	return rc;
}
