/*
 * Collation: producer threads take batches in order, each into its own ring
 * buffer, gather the batch's records from the window buffers into pinned
 * staging (per field, the data then, for variable-size fields, offsets)
 * and, for GPU loaders, queue the copy into the buffer's device memory on the
 * loader's copy stream (docs/LOADER.md).
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

/* Room in buffer s for a batch of size bytes: pinned staging and, for GPU loaders, its GPU copy. */
int sl__buf_reserve(struct sluice_loader *ld, struct sl__batch_buf *s, uint64_t size)
{
	int rc;

	if (size > s->host_cap) {
		size_t cap = sl__align_up(size + size / 4, 4096);

		sl__host_free(ld->gpu, s->host, s->host_cap, s->host_pinned);
		s->host = NULL;
		s->host_cap = 0;
		rc = sl__host_alloc(ld->gpu->ctx ? ld->gpu : NULL, cap, (void **)&s->host, &s->host_pinned);
		if (rc)
			return rc;
		s->host_cap = cap;
	}
	if (ld->opt.gpu && size > s->dev_cap) {
		sl__gpu_free(ld->gpu, s->dev);
		s->dev = NULL;
		s->dev_cap = 0;
		rc = sl__gpu_alloc(ld->gpu, s->host_cap, (void **)&s->dev);
		if (rc)
			return sl__err(rc, "loader: GPU memory for a batch of %llu bytes: %s", (unsigned long long)size,
				       sluice_last_error_detail());
		s->dev_cap = s->host_cap;
	}
	return 0;
}

/*
 * A batch's layout: the fields stages make (each its bound), those producer
 * p's stages write in GPU memory themselves first, then per field as stored
 * its data and, for variable size, B + 1 offsets, each 256-byte aligned.
 * host_from: where the bytes the host collates start (past the fields
 * written in GPU memory).
 */
struct sl_layout {
	uint64_t base[SLUICE_MAX_FIELDS], offs[SLUICE_MAX_FIELDS], size, host_from;
};

static void sl_lay_out(const struct sluice_loader *ld, unsigned p, uint32_t m, const uint64_t *var,
		       struct sl_layout *l)
{
	l->size = 0;
	for (int on_gpu = 1; on_gpu >= 0; on_gpu--) {
		for (unsigned f = 0; f < ld->nf; f++) {
			const struct sl__stage *st = ld->fstage[f];

			if (!st || (ld->opt.gpu && sl__stage_on_gpu(st, p)) != on_gpu)
				continue;
			l->base[f] = l->size;
			l->size = sl__align_up(l->size + sl__stage_bound(st, m), 256);
		}
		if (on_gpu)
			l->host_from = l->size;
	}
	for (unsigned f = 0; f < ld->nf; f++) {
		if (ld->fstage[f])
			continue;
		l->base[f] = l->size;
		l->size = sl__align_up(l->size + (ld->fixed[f] ? ld->fixed[f] * m : var[f]), 256);
		l->offs[f] = l->size;
		if (!ld->fixed[f])
			l->size = sl__align_up(l->size + 8 * ((uint64_t)m + 1), 256);
	}
}

/*
 * The records of batch g, found in its windows and decoded into rec; *m
 * of them kept (corrupt ones skipped, counted), each field's bytes added
 * to var.
 */
static int sl_gather(struct sluice_loader *ld, struct sl__batch_buf *s, uint64_t g, struct sluice_record *rec,
		     uint32_t *m, uint64_t *var)
{
	const uint32_t B = sl__bsize(ld, g);
	uint64_t nw = ld->blast[g] - ld->bfirst[g] + 1, t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld);
	struct sl__window **wins = malloc(nw * sizeof(*wins));
	uint64_t *pos = malloc(B * sizeof(uint64_t));
	int rc = wins && pos ? sl__batch_windows(ld, g, wins) : -ENOMEM;

	sl__hist_add(&ld->h_swait, sl__now_ns() - t0);
	sl__ld_span(ld, "storage wait", t0, cpu0, g);
	if (!rc)
		rc = sl__rank_positions(ld, &ld->order, g, pos);
	for (uint32_t j = 0; j < B && !rc; j++) {
		uint64_t q = pos[j] % ld->len;
		size_t len = 0;
		const char *bytes;

		s->ids[*m] = sl__ld_at(ld, q);
		bytes = sl__window_lookup(wins, nw, q / ld->window, s->ids[*m], &len, &rc);
		if (!rc && len == UINT32_MAX) {
			atomic_fetch_add(&ld->skipped, 1);
			continue;
		}
		if (!rc && (rc = sluice_dataset_decode(ld->ds, s->ids[*m], bytes, len, &rec[*m])))
			rc = sl__err(rc, "%s: record %llu: %s", ld->ds->path, (unsigned long long)s->ids[*m],
				     sluice_last_error_detail());
		for (unsigned f = 0; !rc && f < ld->nf; f++)
			var[f] += rec[*m].len[ld->fidx[f]];
		*m += !rc;
	}
	free(wins);
	free(pos);
	return rc;
}

/* The m records' fields copied into the buffer's host staging, laid out as l says. */
static int sl_collate(struct sluice_loader *ld, struct sl__batch_buf *s, const struct sluice_record *rec, uint32_t m,
		      const struct sl_layout *l)
{
	for (unsigned f = 0; f < ld->nf; f++) {
		unsigned fi = ld->fidx[f];
		char *d = s->host + l->base[f];

		if (ld->fstage[f])
			continue;
		{
		uint64_t *o = ld->fixed[f] ? NULL : (uint64_t *)(void *)(s->host + l->offs[f]), at = 0;
		/* Offsets count elements of the field's dtype (bytes for bytes), as cu_seqlens do: decode checked each
		 * value is whole elements. */
		const uint64_t es = sluice_dtype_size(ld->ds->fields[fi].dtype);

		for (uint32_t j = 0; j < m; j++) {
			if (ld->fixed[f] && rec[j].len[fi] != ld->fixed[f])
				return sl__err(SLUICE_EFORMAT, "%s: record %llu: field '%s' has %zu bytes, not %zu",
					       ld->ds->path, (unsigned long long)s->ids[j], ld->ds->fields[fi].name,
					       rec[j].len[fi], ld->fixed[f]);
			if (o)
				o[j] = at / es;
			memcpy(d + at, rec[j].data[fi], rec[j].len[fi]);
			at += rec[j].len[fi];
		}
		if (o)
			o[m] = at / es;
		}
	}
	return 0;
}

/*
 * The buffer's previous copy must be done before its staging is
 * overwritten.  It was queued a whole ring ago, so this rarely waits; the
 * copy itself is not waited for (the consumer's stream waits on the
 * batch's event), so a producer never waits for the consumer's GPU work
 * while it could be collating.  The time it took into *ns.
 */
static int sl_wait_buf(struct sluice_loader *ld, struct sl__batch_buf *s, uint64_t *ns)
{
	uint64_t t0 = sl__now_ns();
	int rc = sl__gpu_bind(ld->gpu);

	if (!rc)
		rc = SL_CU(ld->gpu->cu->EventSynchronize(s->ready), "cuEventSynchronize");
	*ns = sl__now_ns() - t0;
	return rc;
}

/* The batch's host-collated bytes to the GPU on the producer's stream (the consumer is done with the buffer's last). */
static int sl_send(struct sl__producer *p, struct sl__batch_buf *s, const struct sl_layout *l, uint64_t g,
		   uint64_t waited)
{
	struct sluice_loader *ld = p->ld;
	const struct sl__cuda_api *cu = ld->gpu->cu;
	uint64_t t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld);
	int rc = 0;

	if (l->size > l->host_from)
		rc = SL_CU(cu->MemcpyHtoDAsync((sl_CUdeviceptr)(uintptr_t)(s->dev + l->host_from), s->host + l->host_from,
					       l->size - l->host_from, p->stream),
			   "cuMemcpyHtoDAsync");
	if (rc)
		return rc;
	/* The H2D stage: the wait for the buffer's previous copy, and queueing this one. */
	sl__hist_add(&ld->h_h2d, waited + sl__now_ns() - t0);
	sl__ld_span(ld, "h2d", t0, cpu0, g);
	return 0;
}

/* The batch as the consumer sees it. */
static void sl_publish(struct sluice_loader *ld, struct sl__batch_buf *s, uint64_t g, uint32_t m, const struct sl_layout *l)
{
	char *mem = ld->opt.gpu ? s->dev : s->host;

	memset(&s->b, 0, sizeof(s->b));
	s->b.struct_size = sizeof(s->b);
	s->b.index = g;
	s->b.size = m;
	s->b.nfields = ld->nf;
	s->b.ids = s->ids;
	s->b.event = ld->opt.gpu ? (void *)s->ready : NULL;
	for (unsigned f = 0; f < ld->nf; f++) {
		struct sluice_batch_field *bf = &s->b.field[f];
		const struct sluice_field *df = &ld->ds->fields[ld->fidx[f]];

		bf->name = df->name;
		bf->dtype = df->dtype;
		bf->data = mem + l->base[f];
		bf->offsets = ld->fixed[f] ? NULL : (uint64_t *)(void *)(mem + l->offs[f]);
		bf->host_offsets = ld->fixed[f] ? NULL : (const uint64_t *)(void *)(s->host + l->offs[f]);
		bf->item_bytes = ld->fixed[f];
		if (ld->fstage[f]) {
			sl__stage_describe(ld->fstage[f], m, bf);
		} else if (ld->fixed[f]) {
			const int64_t es = (int64_t)sluice_dtype_size(df->dtype), n = (int64_t)ld->fixed[f] / es;
			int64_t st = 1;

			bf->ndim = 1;
			bf->shape[0] = m;
			for (int d = 0; d < df->ndim; d++)
				bf->shape[bf->ndim++] = df->shape[d];
			if (df->ndim <= 0 && n != 1) /* fixed-size bytes: their elements */
				bf->shape[bf->ndim++] = n;
			for (int d = bf->ndim - 1; d >= 0; d--) {
				bf->strides[d] = st;
				st *= bf->shape[d];
			}
		} else {
			bf->ndim = 1;
			bf->shape[0] = (int64_t)bf->host_offsets[m];
			bf->strides[0] = 1;
		}
	}
	atomic_fetch_add(&ld->bytes, l->size);
	atomic_fetch_add(&ld->records, m);
}

/*
 * The fields stages make, in the table's order.  A stage that leaves
 * records out closes up rec and ids, not the fields the stages before it
 * made: those run again on the records kept (it once left their rows of the
 * refused records in place, every later row another record's).  *m only
 * falls, so this ends; with one field stage (sluice's table) nothing runs
 * twice.
 */
static int sl_run_stages(struct sl__producer *p, struct sl__batch_buf *s, struct sluice_record *rec, uint32_t *m,
			 const struct sl_layout *l)
{
	struct sluice_loader *ld = p->ld;
	uint32_t made[SL_STAGES_MAX]; /* the records each stage's field was made of: *m then (UINT32_MAX: not yet) */
	int rc = 0;

	for (unsigned i = 0; i < ld->nstage; i++)
		made[i] = UINT32_MAX;
	for (unsigned i = 0; i < ld->nstage && !rc; i++) {
		struct sl__stage *st = &ld->stage[i];
		const uint32_t before = *m;

		if (st->ops->window || made[i] == *m)
			continue;
		rc = sl__stage_run(st, p, s, rec, m, l->base[st->field]);
		made[i] = *m;
		if (!rc && *m < before)
			i = (unsigned)-1; /* from the first again: those made of more records run on the kept ones */
	}
	return rc;
}

/* Batch g into buffer s: ids, the fields stages make, collation into pinned staging, and the copy to the GPU. */
static int sl_build(struct sl__producer *p, struct sl__batch_buf *s, uint64_t g)
{
	struct sluice_loader *ld = p->ld;
	struct sluice_record *rec = malloc(ld->bmax * sizeof(*rec));
	uint64_t var[SLUICE_MAX_FIELDS] = { 0 }, t0, cpu0, waited = 0, calls0 = sl__cu_ncalls;
	struct sl_layout l = { .size = 0 };
	uint32_t m = 0; /* records kept: B, less those skipped as corrupt */
	int rc = rec ? sl_gather(ld, s, g, rec, &m, var) : -ENOMEM;

	t0 = sl__now_ns();
	cpu0 = sl__ld_cpu(ld);
	/* Laid out for every record gathered: records a stage leaves out later only shorten what the host collates. */
	sl_lay_out(ld, (unsigned)(p - ld->prod), m, var, &l);
	if (!rc && ld->opt.gpu)
		rc = sl_wait_buf(ld, s, &waited);
	if (!rc)
		rc = sl__buf_reserve(ld, s, l.size);
	/* The consumer's stream must be done with the buffer's last batch before anything writes its GPU copy. */
	if (!rc && ld->opt.gpu && s->release_set)
		rc = SL_CU(ld->gpu->cu->StreamWaitEvent(p->stream, s->release, 0), "cuStreamWaitEvent");
	if (!rc)
		rc = sl_run_stages(p, s, rec, &m, &l);
	if (!rc)
		rc = sl_collate(ld, s, rec, m, &l);
	free(rec);
	if (rc)
		return rc;
	sl__hist_add(&ld->h_collate, sl__now_ns() - t0);
	sl__ld_span(ld, "collate", t0, cpu0, g);
	if (ld->opt.gpu && (rc = sl_send(p, s, &l, g, waited)))
		return rc;
	sl_publish(ld, s, g, m, &l);
	/* The caller's own work, after sluice's, on the same stream; the batch is ready once it is done. */
	if (ld->opt.transform && (rc = ld->opt.transform(&s->b, ld->opt.gpu ? (void *)p->stream : NULL,
							 ld->opt.transform_arg)))
		return sl__err(rc, "%s: batch %llu: the loader's transform returned %d (%s)", ld->ds->path,
			       (unsigned long long)g, rc, sluice_strerror(rc));
	if (ld->opt.gpu)
		rc = SL_CU(ld->gpu->cu->EventRecord(s->ready, p->stream), "cuEventRecord");
	atomic_fetch_add(&ld->cu_prod, sl__cu_ncalls - calls0);
	return rc;
}

/*
 * Under ld->lock: the windows before those of the oldest batch being built
 * (or, with none, the next to be taken) are done with.
 */
static void sl_set_low(struct sluice_loader *ld)
{
	uint64_t g = ld->produce_g;

	for (unsigned i = 0; i < ld->nbufs; i++)
		if (ld->bufs[i].state == SL_B_BUILDING && ld->bufs[i].g < g)
			g = ld->bufs[i].g;
	if (g < ld->nbatches)
		ld->low = ld->bfirst[g];
	pthread_cond_broadcast(&ld->cv);
}

/*
 * Under ld->lock: buffer s can take the next batch.  With hold, so can one
 * whose batch the caller still holds (its memory moves out, sl__hold_detach),
 * but only once fewer than half the ring's batches are made ahead of the
 * caller: the usual loop lets go of a batch a step after taking it, and its
 * buffer then comes back with no move; a caller who keeps batches, or waits
 * on the very batch, still finds the ring at least half full.  The consumer
 * wakes a producer at every hand-over, so the count is looked at again.
 */
static int sl_takeable(const struct sluice_loader *ld, const struct sl__batch_buf *s)
{
	return s->state == SL_B_FREE ||
	       (ld->opt.hold && s->state == SL_B_OUT && ld->produce_g - ld->next_g < (ld->nbufs + 1) / 2);
}

/* ld->nprod of these take batches in order, each building its own in its buffer. */
void *sl__produce(void *arg)
{
	struct sl__producer *p = arg;
	struct sluice_loader *ld = p->ld;

	if (ld->opt.gpu)
		sl__gpu_bind(ld->gpu);
	pthread_mutex_lock(&ld->lock);
	for (;;) {
		struct sl__batch_buf *s;
		uint64_t g;
		int rc;

		uint64_t t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld);

		while (!ld->stop && !ld->err && ld->produce_g < ld->nbatches &&
		       !sl_takeable(ld, sl__slot(ld, ld->produce_g)))
			pthread_cond_wait(&ld->buf_cv, &ld->lock);
		sl__ld_span(ld, "buffer wait", t0, cpu0, ld->produce_g);
		if (ld->stop || ld->err || ld->produce_g >= ld->nbatches || ld->produce_g >= ld->fail_g)
			break;
		s = sl__slot(ld, ld->produce_g);
		if (s->state == SL_B_OUT && (rc = sl__hold_detach(ld, s))) {
			/* Batch produce_g cannot be made: its error is the consumer's when it gets there. */
			if (ld->produce_g < ld->fail_g) {
				ld->fail_g = ld->produce_g;
				ld->fail_rc = rc;
				snprintf(ld->fail_detail, sizeof(ld->fail_detail), "%s", sluice_last_error_detail());
			}
			sl__loader_wake_all(ld);
			break;
		}
		g = ld->produce_g++;
		s->g = g;
		s->err = 0;
		s->state = SL_B_BUILDING;
		/* The next buffer may be free already: the other producer takes it. */
		if (ld->produce_g < ld->nbatches && sl_takeable(ld, sl__slot(ld, ld->produce_g)))
			pthread_cond_signal(&ld->buf_cv);
		sl_set_low(ld);
		pthread_mutex_unlock(&ld->lock);
		rc = sl_build(p, s, g);
		pthread_mutex_lock(&ld->lock);
		if (rc) {
			s->state = SL_B_FREE;
			s->err = rc;
			snprintf(s->detail, sizeof(s->detail), "%s", sluice_last_error_detail());
			/* The earliest failed batch is the consumer's error; the ones before it are still made. */
			if (g < ld->fail_g) {
				ld->fail_g = g;
				ld->fail_rc = rc;
				snprintf(ld->fail_detail, sizeof(ld->fail_detail), "%s", s->detail);
			}
			sl__loader_wake_all(ld);
		} else {
			s->state = SL_B_READY;
			if (g == ld->next_g)
				pthread_cond_signal(&ld->batch_cv);
		}
		sl_set_low(ld);
	}
	pthread_mutex_unlock(&ld->lock);
	return NULL;
}
