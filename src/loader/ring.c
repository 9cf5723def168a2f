/*
 * The consumer's side of the ring: sluice_loader_next() takes ready buffers
 * in order; giving a buffer back records an event on the consumer's stream
 * that the copy stream waits on before reusing it, and wakes a producer.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "loader/state.h"
#include "engine/engine.h"

/*
 * Gives back the batch the consumer holds, ordered after its stream's work:
 * the event is recorded outside the lock (the buffer is the consumer's until
 * its state changes); sl_free_buf, under the lock, hands it to a producer.
 */
static struct sl__batch_buf *sl_release(struct sluice_loader *ld, void *stream)
{
	struct sl__batch_buf *s = ld->held;

	ld->held = NULL;
	if (s && ld->opt.gpu && sl__gpu_bind(ld->gpu) == 0)
		s->release_set = SL_CU_RAW(ld->gpu->cu->EventRecord(s->release, (sl_CUstream)stream)) == SL_CUDA_SUCCESS;
	return s;
}

/*
 * Under ld->lock: the buffer is free again; 1 if a producer is to be woken,
 * which the caller does once it has let go of the lock (the producer then
 * does not wake only to wait for it).  A producer is woken for every buffer
 * given back, so the ring stays full: waking them only once half of it is
 * free saves the consumer about a microsecond a call, but leaves half the
 * ring to absorb hiccups when the step is barely longer than the loader's
 * time per batch.
 */
static int sl_free_buf(struct sl__batch_buf *s)
{
	if (!s || s->state != SL_B_OUT)
		return 0;
	s->state = SL_B_FREE;
	return 1;
}

void sl__give_back(struct sluice_loader *ld, void *stream)
{
	struct sl__batch_buf *s = sl_release(ld, stream);
	int wake;

	pthread_mutex_lock(&ld->lock);
	wake = sl_free_buf(s);
	pthread_mutex_unlock(&ld->lock);
	if (wake)
		pthread_cond_signal(&ld->buf_cv);
}

/*
 * Under ld->lock: the buffer of batch next_g once it is ready or failed, or
 * NULL at the epoch's end; *wake as sl_free_buf's.  The batches before the
 * first one that failed (ld->fail_g: a bad record, a window whose read
 * failed, a transform's error) are all made and handed out, the same every
 * run, and the error comes with that batch.  A batch whose every record was skipped (skip_corrupt) is
 * moved past, with one rank: nothing to hand over, and no empty step.  Not
 * with several ranks: each must take as many steps as the others, or their
 * collectives wait forever.
 */
static struct sl__batch_buf *sl_await(struct sluice_loader *ld, int *wake)
{
	for (;;) {
		struct sl__batch_buf *s;

		if (ld->next_g >= ld->nbatches)
			return NULL;
		s = sl__slot(ld, ld->next_g);
		if (*wake && !(s->state == SL_B_READY && s->g == ld->next_g)) {
			pthread_cond_signal(&ld->buf_cv); /* before waiting: the producer may make the very batch awaited */
			*wake = 0;
		}
		while (!(s->state == SL_B_READY && s->g == ld->next_g) && ld->next_g != ld->fail_g &&
		       (!ld->err || (s->state == SL_B_BUILDING && s->g == ld->next_g)))
			pthread_cond_wait(&ld->batch_cv, &ld->lock);
		if (!(s->state == SL_B_READY && s->g == ld->next_g && s->b.size == 0 && ld->opt.world_size <= 1))
			return s;
		s->state = SL_B_FREE;
		ld->next_g++;
		*wake = 1;
	}
}

/*
 * Under ld->lock: ready buffer s handed to the consumer as b, and counted;
 * with hold, the caller's until released (one reference, its token the
 * batches handed out so far, never 0), else until the next call.
 */
static void sl_hand_over(struct sluice_loader *ld, struct sl__batch_buf *s, struct sluice_batch *b, void *stream)
{
	s->state = SL_B_OUT;
	ld->last_out = (unsigned)(s - ld->bufs);
	s->b.hold = 0;
	if (ld->opt.hold) {
		s->token = s->b.hold = ld->delivered + 1;
		s->refs = 1;
		s->stream = stream;
	} else {
		ld->held = s;
	}
	sl__report_copy(b, &s->b, sizeof(s->b));
	ld->next_g++;
	ld->delivered++;
	ld->delivered_records += s->b.size;
	ld->epoch_records += s->b.size;
	for (unsigned f = 0; f < s->b.nfields; f++) {
		const struct sluice_batch_field *bf = &s->b.field[f];

		ld->delivered_bytes += bf->host_offsets ? bf->host_offsets[s->b.size] * sluice_dtype_size(bf->dtype)
						       : bf->item_bytes * s->b.size;
	}
}

int sluice_loader_next(struct sluice_loader *ld, struct sluice_batch *b, void *stream)
{
	struct sl__batch_buf *s;
	uint64_t t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld), calls0 = sl__cu_ncalls;
	int rc = 0, wake;

	sl__err_clear();
	if ((rc = SL_REPORT_IN(b, batch)))
		return rc;
	s = sl_release(ld, stream);
	pthread_mutex_lock(&ld->lock);
	wake = sl_free_buf(s);
	if (!(s = sl_await(ld, &wake))) {
		uint64_t skipped = atomic_load(&ld->skipped) - ld->epoch_skipped0;

		/* skip_corrupt: an epoch with nothing but bad records is an unreadable dataset, not an empty epoch. */
		if (ld->nbatches && !ld->epoch_records && skipped)
			rc = sl__err(SLUICE_EFORMAT, "%s: every record of epoch %llu this rank read failed its check "
				     "(%llu skipped under skip_corrupt)", ld->ds->path, (unsigned long long)ld->opt.epoch,
				     (unsigned long long)skipped);
		pthread_mutex_unlock(&ld->lock);
		if (wake)
			pthread_cond_signal(&ld->buf_cv);
		return rc;
	}
	if (s->state == SL_B_READY && s->g == ld->next_g) {
		sl_hand_over(ld, s, b, stream);
		wake |= ld->opt.hold; /* a held batch's buffer is one a producer may take (sl__hold_detach) */
	} else {
		/* The first failed batch's own error; else the one that stopped the loader. */
		rc = ld->next_g == ld->fail_g ? sl__err(ld->fail_rc, "%s", ld->fail_detail) : sl__err(ld->err, "%s", ld->detail);
		s = NULL;
	}
	pthread_mutex_unlock(&ld->lock);
	if (wake)
		pthread_cond_signal(&ld->buf_cv);
	/*
	 * The caller's stream waits for the copy, so work queued on it sees the
	 * batch; with no stream, the copy is waited for here.  Outside the lock:
	 * the buffer is the consumer's now, and the producers need the lock.
	 */
	if (s && ld->opt.gpu && sl__gpu_bind(ld->gpu) == 0)
		rc = stream ? SL_CU(ld->gpu->cu->StreamWaitEvent((sl_CUstream)stream, s->ready, 0), "cuStreamWaitEvent")
			    : SL_CU(ld->gpu->cu->EventSynchronize(s->ready), "cuEventSynchronize");
	uint64_t waited = sl__now_ns() - t0;

	atomic_fetch_add(&ld->cu_cons, sl__cu_ncalls - calls0);
	sl__hist_add(&ld->h_wait, waited);
	sl__ld_span(ld, "next", t0, cpu0, ld->next_g - 1);
	if (ld->filling) {
		ld->fill_ns += waited;
		ld->filling = 0;
	}
	if (!ld->t_first)
		ld->t_first = t0;
	ld->t_last = sl__now_ns();
	sl__loader_publish(ld);
	if (ld->stats_every && ld->t_last - ld->t_logged >= ld->stats_every)
		sl__loader_log_stats(ld);
	return rc ? rc : 1;
}

/* The GPU work queued on stream before now must be done before the memory of release is reused. */
static void sl_mark_released(struct sluice_loader *ld, sl_CUevent *release, int *set, void *stream)
{
	*set = 0;
	if (!ld->opt.gpu || sl__gpu_bind(ld->gpu))
		return;
	if (!*release && SL_CU_RAW(ld->gpu->cu->EventCreate(release, SL_CU_EVENT_DISABLE_TIMING)) != SL_CUDA_SUCCESS)
		*release = NULL;
	/* Without an event, the stream is waited for here: the memory is never reused under the caller's work. */
	if (*release)
		*set = SL_CU_RAW(ld->gpu->cu->EventRecord(*release, (sl_CUstream)stream)) == SL_CUDA_SUCCESS;
	if (!*set)
		SL_CU_RAW(ld->gpu->cu->StreamSynchronize((sl_CUstream)stream));
}

int sluice_loader_release(struct sluice_loader *ld, uint64_t hold)
{
	int wake = 0, found = 0;
	uint64_t calls0 = sl__cu_ncalls;

	sl__err_clear();
	pthread_mutex_lock(&ld->lock);
	for (unsigned i = 0; hold && !found && i < ld->nbufs; i++) {
		struct sl__batch_buf *s = &ld->bufs[i];

		if (s->state == SL_B_OUT && s->token == hold) {
			found = 1;
			if (--s->refs == 0) {
				sl_mark_released(ld, &s->release, &s->release_set, s->stream);
				s->token = 0;
				s->state = SL_B_FREE;
				wake = 1;
			}
		}
	}
	for (unsigned i = 0; hold && !found && i < ld->nsets; i++) {
		struct sl__held *h = &ld->sets[i];

		if (h->token == hold) {
			found = 1;
			if (--h->refs == 0) {
				sl_mark_released(ld, &h->release, &h->release_set, h->stream);
				h->token = 0; /* a spare now */
				ld->held_bytes -= h->host_cap + h->dev_cap;
			}
		}
	}
	pthread_mutex_unlock(&ld->lock);
	atomic_fetch_add(&ld->cu_cons, sl__cu_ncalls - calls0);
	if (wake)
		pthread_cond_signal(&ld->buf_cv);
	return found ? 0 : sl__err(SLUICE_EINVAL_CONFIG, "sluice_loader_release: %llu is no batch this loader holds for "
				   "the caller (released already, or a loader without the hold option)",
				   (unsigned long long)hold);
}

/* Buffer s's memory and the set h's change places, the references and stream with them. */
static void sl_swap(struct sl__batch_buf *s, struct sl__held *h)
{
	struct sl__held t = { s->token, s->refs, s->stream, s->host, s->host_cap, s->host_pinned, s->dev, s->dev_cap,
			      s->ids, s->ready, s->release, s->release_set };

	s->token = h->token;
	s->refs = h->refs;
	s->stream = h->stream;
	s->host = h->host;
	s->host_cap = h->host_cap;
	s->host_pinned = h->host_pinned;
	s->dev = h->dev;
	s->dev_cap = h->dev_cap;
	s->ids = h->ids;
	s->ready = h->ready;
	s->release = h->release;
	s->release_set = h->release_set;
	*h = t;
}

int sl__hold_detach(struct sluice_loader *ld, struct sl__batch_buf *s)
{
	const uint64_t bytes = s->host_cap + s->dev_cap;
	struct sl__held *h = NULL;

	if (ld->held_bytes + bytes > ld->hold_limit)
		return sl__err(-ENOBUFS, "%s: the batches held past their turn take %llu bytes, and one more of %llu "
			       "would pass the loader's hold_bytes of %llu: release batches done with (delete them), "
			       "copy what must be kept, or raise hold_bytes",
			       ld->ds->path, (unsigned long long)ld->held_bytes, (unsigned long long)bytes,
			       (unsigned long long)ld->hold_limit);
	for (unsigned i = 0; !h && i < ld->nsets; i++)
		if (!ld->sets[i].token)
			h = &ld->sets[i];
	if (!h) {
		if (sl__reserve(&ld->sets, &ld->sets_cap, (ld->nsets + 1) * sizeof(*ld->sets)))
			return -ENOMEM;
		h = &ld->sets[ld->nsets];
		memset(h, 0, sizeof(*h));
		if (!(h->ids = malloc(ld->bmax * sizeof(uint64_t))))
			return -ENOMEM;
		ld->nsets++;
		/* Its own copy's event: a spare's staging is written once its last copy is done (sl_wait_buf). */
		if (ld->opt.gpu && (sl__gpu_bind(ld->gpu) ||
				    ld->gpu->cu->EventCreate(&h->ready, SL_CU_EVENT_DISABLE_TIMING) != SL_CUDA_SUCCESS))
			return sl__err(SLUICE_ECUDA, "loader: an event for a held batch's memory");
	}
	sl_swap(s, h);
	ld->held_bytes += bytes;
	ld->held_moved++;
	s->state = SL_B_FREE;
	return 0;
}

void sl__hold_free(struct sluice_loader *ld)
{
	for (unsigned i = 0; i < ld->nsets; i++) {
		struct sl__held *h = &ld->sets[i];

		sl__host_free(ld->gpu, h->host, h->host_cap, h->host_pinned);
		sl__gpu_free(ld->gpu, h->dev);
		if (h->release)
			ld->gpu->cu->EventDestroy(h->release);
		if (h->ready)
			ld->gpu->cu->EventDestroy(h->ready);
		free(h->ids);
	}
	free(ld->sets);
}

uint64_t sluice_loader_batches(const struct sluice_loader *ld)
{
	return ld->nbatches;
}

void sluice_loader_state(const struct sluice_loader *ld, uint64_t *seed, uint64_t *epoch, uint64_t *position)
{
	const uint64_t c = sl__consumed(ld);

	*seed = ld->opt.seed;
	*epoch = ld->opt.epoch;
	/* One node from the epoch's start: its sequence is the epoch's order, and c the place in it. */
	*position = ld->view.nlev == 1 && ld->opt.nodes == 1 ? c : sl__order_consumed(&ld->view, ld->n, c);
}

int sluice_loader_state_ex(const struct sluice_loader *ld, uint64_t *seed, uint64_t *epoch,
			   struct sluice_loader_segment *seg, unsigned cap)
{
	const struct sl__order_view *v = &ld->view;

	sl__err_clear();
	if (cap < v->nlev)
		return sl__err(-ENOSPC, "sluice_loader_state_ex: the state has %u segments, room for %u", v->nlev, cap);
	*seed = ld->opt.seed;
	*epoch = ld->opt.epoch;
	for (unsigned i = 0; i + 1 < v->nlev; i++)
		seg[i] = (struct sluice_loader_segment){ v->lev[i].nodes, v->lev[i].done };
	seg[v->nlev - 1] = (struct sluice_loader_segment){ ld->opt.nodes, sl__consumed(ld) };
	return (int)v->nlev;
}
