/*
 * The loader's life: open (sizes, the ring and the window buffers
 * allocated up front), starting and stopping its threads for an epoch, and
 * close.  The stages live apart: window.c reads shuffle windows, collate.c
 * builds batches into the ring, ring.c hands them to the consumer, stats.c
 * says where the time goes; order.c decides the epoch order.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/format.h"
#include "diag/diag.h"
#include "loader/state.h"
#include "engine/engine.h"

/* Stops the loader's threads and waits for them. */
static void sl_halt(struct sluice_loader *ld)
{
	pthread_mutex_lock(&ld->lock);
	ld->stop = 1;
	sl__loader_wake_all(ld);
	pthread_mutex_unlock(&ld->lock);
	while (ld->producers_running)
		pthread_join(ld->producer[--ld->producers_running], NULL);
	while (ld->readers_running)
		pthread_join(ld->reader[--ld->readers_running], NULL);
	ld->stop = 0;
}

static void sl_stop(struct sluice_loader *ld)
{
	if (!ld->running)
		return;
	sl_halt(ld);
	ld->running = 0;
}

/* Positions of a node's sequence that decide the batch count: the shortest node's (drop_last), else the longest's. */
static uint64_t sl_count_len(const struct sluice_loader *ld)
{
	return ld->opt.drop_last ? ld->view.shortest : ld->view.longest;
}

/*
 * This rank's batches in the epoch from ld->origin: every rank of every
 * node the same number, the last partial global batch dropped (drop_last),
 * filled from the start of the node's sequence (even_batches), or else
 * short: what is left, rounded up to a multiple of the node's ranks L, so
 * each rank takes the same number of records and at most L - 1 are taken
 * twice (one process: none).  With fewer records than that, they are taken
 * more than once.
 */
static void sl_count_batches(struct sluice_loader *ld)
{
	const uint64_t len = sl_count_len(ld), bw = ld->per_global, L = bw / ld->opt.batch_size;
	const uint64_t left = ld->origin < len ? len - ld->origin : 0;

	ld->nbatches = ld->opt.drop_last ? left / bw : (left + bw - 1) / bw;
	ld->last_global = bw;
	if (ld->nbatches && !ld->opt.drop_last && !ld->opt.even_batches) {
		const uint64_t rem = left - (ld->nbatches - 1) * bw;

		ld->last_global = (rem + L - 1) / L * L;
	}
}

/*
 * Places this rank in the epoch resumed from the segments seg[0, nseg)
 * (none: from its start): its view, the batch it takes next and its batch
 * count.  A place the last run reached with another world size goes on from
 * there (origin, see sl__gstart); one at or past the end (the last batch
 * wrapped) finds the epoch over.
 */
static int sl_place(struct sluice_loader *ld, const struct sluice_loader_segment *seg, unsigned nseg)
{
	uint64_t position, len;
	int rc = sl__order_view_init(&ld->view, ld->n, ld->opt.shuffle, ld->opt.nodes, ld->fresh.node, seg, nseg,
				     &position);

	if (rc)
		return rc;
	ld->len = ld->view.len;
	len = sl_count_len(ld);
	ld->origin = position < len ? position % ld->per_global : position;
	ld->next_g = position < len ? position / ld->per_global : 0;
	sl_count_batches(ld);
	return 0;
}

/*
 * Tells the dataset the files this rank's node reads this epoch, in the
 * order it first uses them: a remote dataset fetches ahead only those, and
 * lets the other copies go first (its cache holds the node's share).
 */
static int sl_plan_files(struct sluice_loader *ld)
{
	unsigned *files = malloc((ld->nshards ? ld->nshards : 1) * sizeof(*files)), n = 0;
	int rc = files ? sl__order_node_shards(&ld->order, ld->opt.nodes, ld->fresh.node, files, &n) : -ENOMEM;

	if (!rc)
		rc = sl__ds_plan(ld->ds, files, n);
	free(files);
	return rc;
}

/* (Re)starts production at the consumer's next batch of the current epoch. */
static int sl_start(struct sluice_loader *ld)
{
	int rc;

	uint64_t keep = 0;

	/* This epoch's order: the one made ahead, if it is this epoch's; and the next epoch's. */
	if (ld->next_order.perm && ld->next_order.epoch == ld->opt.epoch) {
		struct sl__order t = ld->order;

		ld->order = ld->next_order;
		ld->next_order = t;
	} else {
		sl__order_free(&ld->order);
		rc = sl__order_init(&ld->order, ld->shard_records, ld->nshards, ld->opt.seed, ld->opt.epoch, ld->window,
				    ld->chunk);
		if (rc)
			return rc;
	}
	sl__order_set_view(&ld->order, &ld->view);
	if ((rc = sl_plan_files(ld)))
		return rc;
	sl__order_free(&ld->next_order);
	rc = sl__order_init(&ld->next_order, ld->shard_records, ld->nshards, ld->opt.seed, ld->opt.epoch + 1,
			    ld->window, ld->chunk);
	if (rc)
		return rc;
	sl__order_set_view(&ld->next_order, &ld->fresh);
	rc = sl__plan_windows(ld);
	if (rc)
		return rc;
	/* Windows read ahead for this epoch from its start: places 0, 1, ... in hand. */
	for (int found = ld->next_g == 0; found && keep < ld->nseq;) {
		found = 0;
		for (unsigned i = 0; i < ld->nwin && !found; i++)
			found = ld->win[i].state == SL_W_READY && ld->win[i].epoch == ld->opt.epoch && ld->win[i].idx == keep;
		keep += (uint64_t)found;
	}
	for (unsigned i = 0; i < ld->nwin; i++)
		if (!(ld->win[i].state == SL_W_READY && ld->win[i].epoch == ld->opt.epoch && ld->win[i].idx < keep))
			ld->win[i].state = SL_W_EMPTY;
	ld->pre_next = 0;
	ld->preloaded += keep;
	ld->low = ld->next_g < ld->nbatches ? ld->bfirst[ld->next_g] : 0;
	for (unsigned i = 0; i < ld->nbufs; i++)
		if (ld->bufs[i].state != SL_B_OUT) {
			ld->bufs[i].state = SL_B_FREE;
			ld->bufs[i].err = 0;
		}
	ld->produce_g = ld->next_g;
	ld->slot_base = (unsigned)((ld->last_out + 1 + ld->nbufs - ld->next_g % ld->nbufs) % ld->nbufs);
	ld->epoch_records = 0;
	ld->fail_g = UINT64_MAX;
	ld->epoch_skipped0 = atomic_load(&ld->skipped);
	ld->filling = 1;
	ld->err = 0;
	ld->read_next = ld->next_g < ld->nbatches ? ld->bfirst[ld->next_g] + keep : ld->nseq;
	for (rc = 0; !rc && ld->readers_running < ld->nreaders; ld->readers_running++)
		rc = pthread_create(&ld->reader[ld->readers_running], NULL, sl__read_ahead, ld);
	if (rc)
		ld->readers_running--;
	for (; !rc && ld->producers_running < ld->nprod; ld->producers_running++)
		rc = pthread_create(&ld->producer[ld->producers_running], NULL, sl__produce,
				    &ld->prod[ld->producers_running]);
	if (rc && ld->producers_running)
		ld->producers_running--;
	if (rc) {
		sl_halt(ld);
		return sl__err(-rc, "loader: starting its threads");
	}
	ld->running = 1;
	return 0;
}

/* The options against the engine and the dataset; 0 or the error naming what is wrong. */
static int sl_check_options(struct sluice_engine *eng, struct sluice_dataset *ds, const struct sluice_loader_options *opt)
{
	uint64_t world = opt && opt->world_size ? opt->world_size : 1;

	if (!opt || !opt->batch_size)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: batch_size must be at least 1");
	if (opt->rank >= world)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: rank %u is not below world_size %llu", opt->rank,
			       (unsigned long long)world);
	if (world % (opt->nodes ? opt->nodes : 1))
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: world_size %llu is not a multiple of nodes %u "
			       "(ranks a node: world_size / nodes)", (unsigned long long)world, opt->nodes);
	if (opt->nresume && (!opt->resume || opt->position))
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: nresume %u needs resume set and position 0 (the segments "
			       "say where the epoch stands)", opt->nresume);
	if (opt->gpu && !sl__eng_gpu(eng)->ctx)
		return sl__err(SLUICE_ENOGPU, "loader: gpu set, but the engine has no GPU");
	if (opt->gpu && opt->device_index >= sl__eng_nlanes(eng))
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: device_index %u, but the engine serves %u GPU%s (SLUICE_DEVICE_IDS)",
			       opt->device_index, sl__eng_nlanes(eng), sl__eng_nlanes(eng) > 1 ? "s" : "");
	if (sluice_dataset_count(ds) == 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: %s holds no records", ds->path);
	return 0;
}

/* The fields to load (all, or those named), and the fixed size of each. */
static int sl_pick_fields(struct sluice_loader *ld, const char *const *names)
{
	struct sluice_dataset *ds = ld->ds;

	for (unsigned f = 0; f < sluice_dataset_nfields(ds) && !names; f++)
		ld->fidx[ld->nf++] = f;
	for (const char *const *name = names; name && *name; name++) {
		unsigned f = 0;

		while (f < sluice_dataset_nfields(ds) && strcmp(sluice_dataset_field(ds, f)->name, *name))
			f++;
		if (f == sluice_dataset_nfields(ds) || ld->nf == SLUICE_MAX_FIELDS)
			return sl__err(SLUICE_EINVAL_CONFIG, "loader: %s has no field '%s'", ds->path, *name);
		for (unsigned k = 0; k < ld->nf; k++)
			if (ld->fidx[k] == f)
				return sl__err(SLUICE_EINVAL_CONFIG, "loader: field '%s' is named twice", *name);
		ld->fidx[ld->nf++] = f;
	}
	if (!ld->nf)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: no fields to load");
	for (unsigned f = 0; f < ld->nf; f++)
		ld->fixed[f] = sl__field_fixed_size(sluice_dataset_field(ds, ld->fidx[f]));
	return 0;
}

/* Records per shard (one run for formats that do not count them), the dataset's bytes into *bytes. */
static int sl_count_shards(struct sluice_loader *ld, uint64_t *bytes)
{
	struct sluice_dataset *ds = ld->ds;

	*bytes = 0;
	ld->n = sluice_dataset_count(ds);
	ld->nshards = sluice_dataset_shards(ds);
	if (!(ld->shard_records = malloc(ld->nshards * sizeof(uint64_t))))
		return -ENOMEM;
	for (unsigned s = 0; s < sluice_dataset_shards(ds); s++) {
		uint64_t r = UINT64_MAX, b = 0;

		if (sluice_dataset_shard_info(ds, s, &r, &b))
			r = UINT64_MAX;
		ld->shard_records[s] = r;
		*bytes += b;
		if (r == UINT64_MAX)
			ld->nshards = 1;
	}
	if (ld->nshards == 1)
		ld->shard_records[0] = ld->n;
	return 0;
}

/*
 * The shuffle window and its chunks, from the average record: a window is
 * SL_CHUNKS chunks from all over the dataset, each at least SL_CHUNK_MIN
 * bytes so that its reads stay large (small windows are one chunk).
 */
static void sl_size_window(struct sluice_loader *ld, uint64_t bytes, uint64_t window_bytes)
{
	uint64_t avg = bytes / ld->n ? bytes / ld->n : 1, wb = window_bytes ? window_bytes : 64ull << 20;
	uint64_t cb = wb / SL_CHUNKS > SL_CHUNK_MIN ? wb / SL_CHUNKS : SL_CHUNK_MIN;

	ld->window = wb / avg ? wb / avg : 1;
	if (ld->window > ld->n)
		ld->window = ld->n;
	ld->chunk = cb / avg ? cb / avg : 1;
	if (ld->chunk > ld->window)
		ld->chunk = ld->window;
	ld->window -= ld->window % ld->chunk;
}

/*
 * The most records a global batch of this node takes, in this epoch or the
 * next: a whole one, but one past the longest node sequence is that
 * sequence, rounded up to the node's ranks (sl_count_batches counts on the
 * longest; with even_batches a last batch is filled whole, taking records
 * more than once).
 */
static uint64_t sl_most(const struct sluice_loader *ld)
{
	const uint64_t L = ld->per_global / ld->opt.batch_size;
	uint64_t len = ld->view.len > ld->fresh.len ? ld->view.len : ld->fresh.len, all;

	len = len > ld->view.longest ? len : ld->view.longest;
	len = len > ld->fresh.longest ? len : ld->fresh.longest;
	all = (len + L - 1) / L * L;
	return ld->opt.even_batches || all > ld->per_global ? ld->per_global : all;
}

/* A batch's bytes, guessed from the fields; variable-size ones share what the record holds beyond its fixed ones. */
static uint64_t sl_guess_batch(const struct sluice_loader *ld, uint64_t bytes)
{
	uint64_t fixed = 0, avg = bytes / ld->n, nvar = 0, nvar_loaded = 0, guess = 0, B = ld->bmax;

	for (unsigned f = 0; f < sluice_dataset_nfields(ld->ds); f++) {
		uint64_t z = sl__field_fixed_size(sluice_dataset_field(ld->ds, f));

		fixed += z;
		nvar += !z;
	}
	for (unsigned f = 0; f < ld->nf; f++) {
		nvar_loaded += !ld->fixed[f];
		guess = sl__align_up(guess + ld->fixed[f] * B + (ld->fixed[f] ? 0 : 8 * (B + 1)), 256) + 256;
	}
	if (nvar_loaded && avg > fixed)
		guess += (avg - fixed) * B / nvar * nvar_loaded;
	for (unsigned f = 0; f < ld->nf; f++) /* a field a stage makes, beside its stored bytes (the stage's bound) */
		if (ld->fstage[f])
			guess += sl__align_up(sl__stage_bound(ld->fstage[f], B), 256);
	return guess;
}

/* The producers' streams and the buffers' events of a GPU loader. */
static int sl_open_stream(struct sluice_loader *ld)
{
	const struct sl__cuda_api *cu = ld->gpu->cu;
	int rc = sl__gpu_bind(ld->gpu);

	int least = 0, greatest = 0;

	/*
	 * The highest priority the GPU has: a producer's work (its copies,
	 * nvJPEG's, the image kernel) is scheduled ahead of the model's, so that
	 * the batch is ready before the step that needs it.
	 */
	if (!rc)
		rc = SL_CU(cu->CtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
	for (unsigned p = 0; p < ld->nprod && !rc; p++)
		rc = SL_CU(cu->StreamCreateWithPriority(&ld->prod[p].stream, SL_CU_STREAM_NON_BLOCKING, greatest),
			   "cuStreamCreateWithPriority");
	for (unsigned i = 0; i < ld->nbufs && !rc; i++) {
		rc = SL_CU(cu->EventCreate(&ld->bufs[i].ready, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
		if (!rc)
			rc = SL_CU(cu->EventCreate(&ld->bufs[i].release, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
	}
	return rc;
}

/*
 * The most windows one batch can draw on in a sequence of len positions:
 * each rank reads its share of every window its node's *global* batch
 * overlaps (sl__plan_windows), so a window's worth of positions each, one
 * more where they start inside a window, and one more at each wrap past
 * the sequence's end (a batch larger than what is left starts again at
 * window 0; the last window may be short); a sequence shorter than a window
 * is one window, however often a batch wraps over it.  A producer waits
 * for all of its batch's windows at once: with fewer, it would wait forever.
 */
static uint64_t sl_span(const struct sluice_loader *ld, uint64_t len)
{
	const uint64_t most = sl_most(ld);

	if (len < ld->window)
		return 1;
	return (most + ld->window - 1) / ld->window + 1 + (most + len - 1) / len;
}

/*
 * The ring of batch buffers and the windows, allocated here rather than by
 * the first batches (pinning and GPU allocations take milliseconds each; a
 * larger batch grows its buffer), the windows' buffers touched: fresh memory
 * costs a fault per page (in a VM the host's too), which the first epoch's
 * reads would otherwise pay.
 */
static int sl_alloc_ring(struct sluice_loader *ld, uint64_t guess, uint64_t bytes)
{
	const uint64_t local_world = ld->opt.world_size / ld->opt.nodes;
	/* A resumed epoch's sequence may be shorter than the next epochs' (it wraps more often), or longer. */
	const uint64_t span_now = sl_span(ld, ld->len), span_next = sl_span(ld, ld->fresh.len);
	const uint64_t span = span_now > span_next ? span_now : span_next;
	int rc = 0;

	if (span > SL_WINDOWS_MAX)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: %s: a batch of %llu records on %llu ranks a node spans "
			       "up to %llu windows of %llu records (at most %d): raise window_bytes", ld->ds->path,
			       (unsigned long long)ld->opt.batch_size, (unsigned long long)local_world,
			       (unsigned long long)span, (unsigned long long)ld->window, SL_WINDOWS_MAX);
	/* Those windows, one more for each further producer's batch, and for each reader one loading and one ready. */
	ld->nreaders = sl__stage_readers(ld->wstage);
	if (!ld->nreaders)
		ld->nreaders = SL_READERS;
	ld->nwin = (unsigned)(span + ld->nprod - 1 + 2 * ld->nreaders);
	/* Prefetch: 8 batches ahead, fewer (down to 4) when they are large, or as asked. */
	ld->nbufs = 1 + (ld->opt.prefetch ? ld->opt.prefetch : guess > (64ull << 20) ? 4 : guess > (32ull << 20) ? 6 : 8);
	ld->win = calloc(ld->nwin, sizeof(*ld->win));
	ld->bufs = calloc(ld->nbufs, sizeof(*ld->bufs));
	ld->last_out = ld->nbufs - 1; /* the first start's first batch in bufs[0] */
	if (!ld->win || !ld->bufs)
		return -ENOMEM;
	for (unsigned i = 0; i < ld->nbufs && !rc; i++)
		if (!(ld->bufs[i].ids = malloc(ld->bmax * sizeof(uint64_t))))
			rc = -ENOMEM;
	if (!rc && ld->opt.gpu)
		rc = sl_open_stream(ld);
	for (unsigned i = 0; i < ld->nbufs && !rc; i++)
		rc = sl__buf_reserve(ld, &ld->bufs[i], guess);
	for (unsigned i = 0; i < ld->nwin && !rc; i++) {
		struct sl__window *win = &ld->win[i];

		rc = sl__window_reserve(win, (ld->window + local_world - 1) / local_world *
						     sl__align_up(bytes / ld->n, 8), ld->win_pin);
		if (!rc)
			memset(win->buf, 0, win->cap);
	}
	return rc;
}

int sluice_loader_open(struct sluice_loader **out, struct sluice_engine *eng, struct sluice_dataset *ds,
		       const struct sluice_loader_options *opt)
{
	size_t nops;
	const struct sl__stage_ops *ops = sl__stage_table(&nops);

	return sl__loader_open_staged(out, eng, ds, opt, ops, nops);
}

int sl__loader_open_staged(struct sluice_loader **out, struct sluice_engine *eng, struct sluice_dataset *ds,
			   const struct sluice_loader_options *opt, const struct sl__stage_ops *ops, size_t nops)
{
	struct sluice_loader_options o;
	struct sluice_loader *ld;
	uint64_t bytes = 0;
	unsigned local_world;
	int rc;

	*out = NULL;
	sl__err_clear();
	if ((rc = SL_SIZED_IN(&o, opt, loader_options)))
		return rc;
	opt = &o;
	if ((rc = sl_check_options(eng, ds, opt)))
		return rc;
	if (!(ld = calloc(1, sizeof(*ld))))
		return -ENOMEM;
	ld->eng = eng;
	ld->gpu = sl__eng_lane(eng, opt->gpu ? opt->device_index : 0);
	ld->ds = ds;
	ld->opt = *opt;
	ld->opt.world_size = opt->world_size ? opt->world_size : 1;
	ld->opt.nodes = opt->nodes ? opt->nodes : 1;
	ld->opt.resume = NULL; /* read here only */
	ld->opt.nresume = 0;
	local_world = ld->opt.world_size / ld->opt.nodes;
	ld->local_rank = opt->rank % local_world;
	ld->opt.fields = NULL;
	ld->opt.image = NULL;
	ld->nprod = SL_PRODUCERS;
	for (unsigned p = 0; p < SL_PRODUCERS_MAX; p++)
		ld->prod[p].ld = ld;
	pthread_mutex_init(&ld->lock, NULL);
	pthread_cond_init(&ld->cv, NULL);
	pthread_cond_init(&ld->buf_cv, NULL);
	pthread_cond_init(&ld->batch_cv, NULL);
	if ((rc = sl_pick_fields(ld, opt->fields)) || (rc = sl_count_shards(ld, &bytes)))
		goto fail;
	if ((rc = sl__stages_setup(ld, opt, ops, nops)))
		goto fail;
	sl_size_window(ld, bytes, opt->window_bytes);
	if ((rc = sl__setting_u64("SLUICE_STATS", &ld->stats_every)) < 0 ||
	    (rc = sl__trace_open(&ld->trace, sl__setting("SLUICE_TRACE"))))
		goto fail;
	ld->pub = sl__pub_open(ds->path);
	ld->per_global = (uint64_t)opt->batch_size * local_world;
	ld->hold_limit = opt->hold_bytes ? opt->hold_bytes
					 : (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 4;
	/*
	 * Where an epoch starts on this rank's node, then where this one
	 * resumes: a position alone is one phase on one node, the state of a
	 * loader that knew no nodes.
	 */
	if ((rc = sl__order_view_init(&ld->fresh, ld->n, opt->shuffle, ld->opt.nodes, opt->rank / local_world, NULL, 0,
				      NULL)) ||
	    (rc = opt->nresume ? sl_place(ld, opt->resume, opt->nresume)
			       : sl_place(ld, &(struct sluice_loader_segment){ 1, opt->position }, 1)))
		goto fail;
	/* A batch size past the records: the batches hold the records, not batch_size of them. */
	ld->bmax = (uint32_t)(sl_most(ld) / local_world);
	ld->bmax += !ld->bmax;
	if (!(rc = sl_alloc_ring(ld, sl_guess_batch(ld, bytes), bytes)) && !(rc = sl_start(ld))) {
		*out = ld;
		return 0;
	}
fail:
	sluice_loader_close(ld);
	return rc;
}

int sluice_loader_set_epoch(struct sluice_loader *ld, uint64_t e)
{
	int rc;

	sl_stop(ld);
	sl__give_back(ld, NULL);
	ld->opt.epoch = e;
	if ((rc = sl_place(ld, NULL, 0)))
		return rc;
	return sl_start(ld);
}

void sluice_loader_close(struct sluice_loader *ld)
{
	if (!ld)
		return;
	sl_stop(ld);
	for (unsigned p = 0; p < SL_PRODUCERS_MAX; p++)
		if (ld->opt.gpu && ld->gpu->ctx && sl__gpu_bind(ld->gpu) == 0 && ld->prod[p].stream)
			ld->gpu->cu->StreamSynchronize(ld->prod[p].stream);
	sl__stages_close(ld);
	for (unsigned i = 0; ld->bufs && i < ld->nbufs; i++) {
		struct sl__batch_buf *s = &ld->bufs[i];

		sl__host_free(ld->gpu, s->host, s->host_cap, s->host_pinned);
		sl__gpu_free(ld->gpu, s->dev);
		if (s->ready)
			ld->gpu->cu->EventDestroy(s->ready);
		if (s->release)
			ld->gpu->cu->EventDestroy(s->release);
		free(s->ids);
	}
	sl__hold_free(ld);
	for (unsigned i = 0; ld->win && i < ld->nwin; i++) {
		free(ld->win[i].ids);
		free(ld->win[i].off);
		free(ld->win[i].len);
		sl__window_free(&ld->win[i], ld->win_pin);
	}
	for (unsigned p = 0; p < SL_PRODUCERS_MAX; p++)
		if (ld->prod[p].stream)
			ld->gpu->cu->StreamDestroy(ld->prod[p].stream);
	sl__order_free(&ld->order);
	sl__order_free(&ld->next_order);
	free(ld->seq);
	free(ld->bfirst);
	free(ld->blast);
	free(ld->win);
	free(ld->bufs);
	free(ld->shard_records);
	sl__pub_close(ld->pub);
	if (sl__trace_close(ld->trace))
		sl__warn("loader", "%s", sluice_last_error_detail());
	pthread_mutex_destroy(&ld->lock);
	pthread_cond_destroy(&ld->cv);
	pthread_cond_destroy(&ld->buf_cv);
	pthread_cond_destroy(&ld->batch_cv);
	free(ld);
}
