/*
 * The engine: backend selection, the pinned pool, starting and stopping the
 * worker threads (worker.c), and the GPU helpers of the public API.  The
 * job list the workers claim segments from is job.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "diag/diag.h"
#include "engine/pipeline.h"

static void sl_note_unusable(struct sluice_engine *eng, const char *why)
{
	size_t l = strlen(eng->unusable);

	snprintf(eng->unusable + l, sizeof(eng->unusable) - l, "%s%s", l ? "\n" : "", why);
	sl__info("io", "%s", why);
}

/* gds: only for GPU destinations, and without nvidia-fs only when forced (SLUICE_BACKEND=gds). */
static int sl_select_gds(struct sluice_engine *eng, const struct sl__store *st)
{
	const struct sluice_config *cfg = &eng->cfg;
	char why[512];
	int rc;

	if (eng->gpu.ctx && cfg->backend == SLUICE_BACKEND_AUTO && !sl__nvfs_loaded()) {
		sl_note_unusable(eng, "gds unused: nvidia-fs is not loaded (no /sys/module/nvidia_fs), so cuFile "
				      "would run in compat mode through host bounce buffers; set SLUICE_BACKEND=gds to force it");
	} else if (eng->gpu.ctx && (cfg->backend == SLUICE_BACKEND_AUTO || cfg->backend == SLUICE_BACKEND_GDS)) {
		rc = st->probe(cfg, why, sizeof(why));
		if (rc == 0) {
			eng->gds = st;
			eng->gds_real = sl__cufile(NULL)->gds;
		} else {
			sl_note_unusable(eng, why);
		}
		if (rc && cfg->backend == SLUICE_BACKEND_GDS)
			return sl__err(SLUICE_EBACKEND, "%s", why);
	} else if (cfg->backend == SLUICE_BACKEND_GDS) {
		return sl__err(SLUICE_EBACKEND, "gds requested but no GPU is usable");
	}
	return 0;
}

/*
 * The stores this engine uses: of local files, the first usable in the
 * registry's order (SLUICE_BACKEND may name one), with gds beside it
 * where usable; and each store of other paths that its probe finds usable.
 */
static int sl_select_stores(struct sluice_engine *eng)
{
	static const char *const backend[] = { [SLUICE_BACKEND_URING] = "uring", [SLUICE_BACKEND_PSYNC] = "psync" };
	const struct sluice_config *cfg = &eng->cfg;
	const char *want = (size_t)cfg->backend < sizeof(backend) / sizeof(backend[0]) ? backend[cfg->backend] : NULL;
	char why[512];
	int rc = 0;

	for (size_t i = 0; !rc && !eng->local && sl__local_order[i]; i++) {
		const struct sl__store *st = sl__local_order[i];

		if (st->caps & SL_STORE_GPU_MEM) {
			rc = sl_select_gds(eng, st);
			continue;
		}
		if (want && strcmp(want, st->name))
			continue;
		if (st->probe(cfg, why, sizeof(why)) == 0) {
			eng->local = st;
			break;
		}
		sl_note_unusable(eng, why);
		if (want)
			return sl__err(SLUICE_EBACKEND, "%s", why);
	}
	if (!rc && !eng->local)
		return sl__err(SLUICE_EBACKEND, "no usable store of local files");
	if (rc)
		return rc;
	eng->usable[eng->local->id] = 1;
	if (eng->gds)
		eng->usable[eng->gds->id] = 1;
	for (int i = 0; i < SL_STORES; i++) {
		const struct sl__store *st = sl__stores[i];

		if (!st->match)
			continue;
		if (st->probe(cfg, why, sizeof(why)) == 0)
			eng->usable[i] = 1;
		else
			sl_note_unusable(eng, why);
	}
	return 0;
}

int sl__store_for(struct sluice_engine *eng, const char *path, const struct sl__store **out)
{
	const struct sl__store *st = sl__store_match(path);

	if (st && !eng->usable[st->id])
		return sl__err(SLUICE_EBACKEND, "%s: the %s store is unusable here (sluice doctor says why)", path,
			       st->name);
	*out = st ? st : eng->gds ? eng->gds : eng->local;
	return 0;
}

static void sl_lock(void *eng)
{
	pthread_mutex_lock(&((struct sluice_engine *)eng)->lock);
}

static void sl_unlock(void *eng)
{
	pthread_mutex_unlock(&((struct sluice_engine *)eng)->lock);
}

void sl__open_env(struct sluice_engine *eng, const struct sl__store *st, void *arg, struct sl__open_env *env)
{
	env->cfg = &eng->cfg;
	env->shared = &eng->store_shared[st->id];
	env->lock = sl_lock;
	env->unlock = sl_unlock;
	env->lock_arg = eng;
	env->arg = arg;
}

static int sl_pool_alloc(struct sluice_engine *eng)
{
	const struct sluice_config *cfg = &eng->cfg;
	size_t want;
	unsigned per;

	/* Slack of one page each side lets O_DIRECT widen unaligned ranges. */
	eng->slot_size = cfg->max_transfer_size + 2 * SL_ALIGN;
	if (cfg->buffer_pool_size && cfg->buffer_pool_size < cfg->max_transfer_size)
		return sl__err(SLUICE_EINVAL_CONFIG,
			       "buffer_pool_size (SLUICE_BUFFER_POOL_SIZE) %zu bytes is less than one bounce slot "
			       "(max_transfer_size, SLUICE_MAX_TRANSFER_SIZE: %zu bytes)",
			       cfg->buffer_pool_size, cfg->max_transfer_size);
	want = cfg->buffer_pool_size ? cfg->buffer_pool_size
				     : (size_t)cfg->threads * cfg->queue_depth * eng->slot_size;
	per = (unsigned)(want / ((size_t)cfg->threads * eng->slot_size));
	if (per > cfg->queue_depth)
		per = cfg->queue_depth;
	if (per < 2) {
		if (cfg->buffer_pool_size)
			sl__warn("xfer", "buffer_pool_size %zu too small for %u threads x 2 slots of %zu bytes; using 2 slots per thread",
				 cfg->buffer_pool_size, cfg->threads, eng->slot_size);
		per = cfg->queue_depth < 2 ? cfg->queue_depth : 2;
	}
	eng->slots_per_worker = per;
	/* Mapped here; each slot is pinned by its worker on its first GPU copy (worker.c, sl_slot_pin). */
	eng->pool_len = (size_t)cfg->threads * per * eng->slot_size;
	eng->pool_pinned = eng->gpu.ctx && cfg->staging == SLUICE_STAGING_PINNED;
	return sl__host_alloc(NULL, eng->pool_len, (void **)&eng->pool, &(int){ 0 });
}

/* Which GPU reads copy by DMA from the page cache itself (SLUICE_PAGECACHE_DMA_MIN/MAX, worker.c). */
static int sl_open_map_dma(struct sluice_engine *eng)
{
	uint64_t lo, hi;
	int rc = sl__setting_u64("SLUICE_PAGECACHE_DMA_MIN", &lo);

	if (!rc)
		rc = sl__setting_u64("SLUICE_PAGECACHE_DMA_MAX", &hi);
	if (!rc) {
		eng->map_dma_min = (size_t)lo;
		eng->map_dma_max = (size_t)hi;
	}
	return rc;
}

/* Phase 1: the struct, with the settings of cfg (NULL: the environment's and the file's). */
static int sl_open_struct(struct sluice_engine **out, const struct sluice_config *cfg)
{
	struct sluice_config *envcfg = NULL;
	struct sluice_engine *eng;
	int rc = cfg ? 0 : sluice_config_new(&envcfg);

	if (!rc)
		rc = sl__metrics_auto(); /* SLUICE_METRICS_PORT: the first engine starts the exporter */
	eng = rc ? NULL : calloc(1, sizeof(*eng));
	if (!rc && !eng)
		rc = -ENOMEM;
	if (!rc) {
		eng->cfg = cfg ? *cfg : *envcfg;
		pthread_mutex_init(&eng->lock, NULL);
		pthread_cond_init(&eng->work_cv, NULL);
		pthread_cond_init(&eng->done_cv, NULL);
		eng->queue_tail = &eng->queue;
		eng->gpu.ordinal = -1;
		eng->nlanes = 1;
		eng->lane[0] = &eng->gpu;
		for (unsigned l = 0; l < SLUICE_MAX_DEVICES; l++)
			eng->numa_node[l] = -1;
		rc = sl_open_map_dma(eng);
	}
	sluice_config_free(envcfg);
	*out = eng;
	return rc;
}

/* Phase 2: CUDA and a lane per device id, each with its NUMA node; without CUDA, why not (host memory only). */
static int sl_open_gpus(struct sluice_engine *eng)
{
	const char *why = "CUDA not loaded (SLUICE_GPU=0)";
	char line[300];
	int rc;

	if (eng->cfg.gpu && sl__cuda(&why)) {
		if ((rc = sl__gpu_open(&eng->gpu, eng->cfg.device)))
			return rc;
		for (unsigned l = 1; l < eng->cfg.ndevices; l++) {
			if ((rc = sl__gpu_open(&eng->xgpu[l - 1], eng->cfg.devices[l])))
				return rc;
			eng->lane[l] = &eng->xgpu[l - 1];
			eng->nlanes = l + 1;
		}
		for (unsigned l = 0; l < eng->nlanes; l++)
			sl__numa_of_pci(eng->lane[l]->pci, &eng->numa_node[l], &eng->numa_cpus[l]);
		return 0;
	}
	snprintf(eng->gpu_unusable, sizeof(eng->gpu_unusable), "%s", why);
	snprintf(line, sizeof(line), "gpu: %s; host memory only", eng->gpu_unusable);
	sl_note_unusable(eng, line);
	return 0;
}

/* Phase 5: the workers, started; returns once each has its ring, stream and events (or the first failure). */
static int sl_open_workers(struct sluice_engine *eng)
{
	int rc;

	eng->nworkers = eng->cfg.threads;
	eng->workers = calloc(eng->nworkers, sl__worker_size());
	if (!eng->workers)
		return -ENOMEM;
	for (unsigned i = 0; i < eng->nworkers; i++)
		sl__worker_setup(SL_WORKER(eng, i), eng, i);
	pthread_mutex_lock(&eng->lock);
	while (eng->started < eng->nworkers)
		pthread_cond_wait(&eng->done_cv, &eng->lock);
	rc = eng->init_err;
	pthread_mutex_unlock(&eng->lock);
	return rc;
}

/*
 * In named phases, each timed (what a one-shot call pays before its first
 * byte moves, docs/BENCHMARKS.md): the struct, the GPUs, the stores, the
 * pinned pool, the workers.  A failure closes what was made.
 */
int sluice_engine_open(struct sluice_engine **out, const struct sluice_config *cfg)
{
	struct sluice_engine *eng;
	int (*const phase[4])(struct sluice_engine *) = { sl_open_gpus, sl_select_stores, sl_pool_alloc,
							   sl_open_workers };
	uint64_t t[5] = { sl__now_ns() };
	int rc;

	*out = NULL;
	sl__err_clear();
	if ((rc = sl_open_struct(&eng, cfg)))
		return rc;
	eng->opened_ns = t[0];
	for (int i = 0; i < 4 && !rc; i++) {
		rc = phase[i](eng);
		t[i + 1] = sl__now_ns();
	}
	if (rc) {
		sluice_engine_close(eng);
		return rc;
	}
	t[4] = sl__now_ns();
	sl__info("xfer", "engine: stores %s%s, %u threads x %u slots of %zu bytes, GPU %d %s",
		 eng->local->name, eng->gds ? "+gds" : "", eng->nworkers, eng->slots_per_worker,
		 eng->cfg.max_transfer_size, eng->gpu.ordinal, eng->gpu.name);
	sl__info("xfer", "engine open %.1f ms: CUDA %.1f, stores %.1f, pool %.1f, workers %.1f",
		 (double)(t[4] - t[0]) / 1e6, (double)(t[1] - t[0]) / 1e6, (double)(t[2] - t[1]) / 1e6,
		 (double)(t[3] - t[2]) / 1e6, (double)(t[4] - t[3]) / 1e6);
	*out = eng;
	return 0;
}

void sluice_engine_close(struct sluice_engine *eng)
{
	if (!eng)
		return;
	pthread_mutex_lock(&eng->lock);
	eng->stopping = 1;
	pthread_cond_broadcast(&eng->work_cv);
	pthread_mutex_unlock(&eng->lock);
	for (unsigned i = 0; eng->workers && i < eng->nworkers; i++)
		sl__worker_join(SL_WORKER(eng, i));
	free(eng->workers);
	for (int i = 0; i < SL_ATTACHMENTS; i++)
		if (eng->attached[i])
			eng->drop[i](eng, eng->attached[i]);
	sl__host_free(NULL, eng->pool, eng->pool_len, 0); /* the workers unpinned their slots */
	for (int i = 0; i < SL_STORES; i++)
		if (eng->store_shared[i])
			sl__stores[i]->release(eng->store_shared[i]);
	for (unsigned l = 1; l < eng->nlanes; l++)
		sl__gpu_close(eng->lane[l]);
	sl__gpu_close(&eng->gpu);
	pthread_mutex_destroy(&eng->lock);
	pthread_cond_destroy(&eng->work_cv);
	pthread_cond_destroy(&eng->done_cv);
	free(eng);
}

int sluice_engine_get_info(const struct sluice_engine *eng, struct sluice_engine_info *info)
{
	/* The workers' registration settles fixed_bufs: wait for it (the lock is the engine's own). */
	pthread_mutex_t *lock = (pthread_mutex_t *)&eng->lock;
	int rc = SL_REPORT_IN(info, engine_info);

	if (rc || !info)
		return rc ? rc : sl__err(-EINVAL, "sluice_engine_get_info: no struct to fill");
	pthread_mutex_lock(lock);
	while (eng->prepared < eng->nworkers)
		pthread_cond_wait((pthread_cond_t *)&eng->done_cv, lock);
	pthread_mutex_unlock(lock);
	info->backend = eng->local->name;
	info->gpu = eng->gpu.ordinal;
	snprintf(info->gpu_name, sizeof(info->gpu_name), "%s", eng->gpu.name);
	info->gds = eng->gds && eng->gds_real;
	info->threads = eng->nworkers;
	info->queue_depth = eng->slots_per_worker;
	info->max_transfer_size = eng->cfg.max_transfer_size;
	info->buffer_pool_size = eng->pool_len;
	info->pool_pinned = eng->pool_pinned;
	info->uring_fixed_buffers = eng->fixed_bufs;
	info->unusable = eng->unusable;
	info->gpu_unusable = eng->gpu_unusable;
	info->numa_node = eng->numa_node[0];
	info->ngpus = eng->gpu.ordinal >= 0 ? eng->nlanes : 0; /* the host-memory engine has one lane, and no GPU */
	return 0;
}

int sluice_engine_stats(struct sluice_engine *eng, struct sluice_stats *st)
{
	uint64_t n = atomic_load(&eng->lat.n);
	int rc = SL_REPORT_IN(st, stats);

	if (rc || !st)
		return rc ? rc : sl__err(-EINVAL, "sluice_engine_stats: no struct to fill");
	st->ios = atomic_load(&eng->st_ios);
	st->bytes = atomic_load(&eng->st_bytes);
	if (!n)
		return 0;
	st->lat_avg_us = (double)atomic_load(&eng->lat.sum) / (double)n / 1e3;
	st->lat_p50_us = (double)sl__hist_percentile(&eng->lat, 50) / 1e3;
	st->lat_p99_us = (double)sl__hist_percentile(&eng->lat, 99) / 1e3;
	st->lat_p999_us = (double)sl__hist_percentile(&eng->lat, 99.9) / 1e3;
	st->lat_max_us = (double)atomic_load(&eng->lat.max) / 1e3;
	return 0;
}

void sluice_engine_stats_reset(struct sluice_engine *eng)
{
	sl__hist_reset(&eng->lat);
	atomic_store(&eng->st_ios, 0);
	atomic_store(&eng->st_bytes, 0);
}

/* ---- GPU helpers of the public API ---- */

int sluice_gpu_count(void)
{
	const struct sl__cuda_api *cu = sl__cuda(NULL);
	int n = 0;

	if (!cu || cu->DeviceGetCount(&n) != SL_CUDA_SUCCESS)
		return 0;
	return n;
}

int sluice_gpu_alloc(struct sluice_engine *eng, size_t n, void **out)
{
	int rc = sl__gpu_alloc(&eng->gpu, n, out);

	/* Registered where a store takes it; a refusal leaves the memory usable, unregistered. */
	if (!rc && sluice_gpu_register(eng, *out, n))
		sl__debug("gpu", "%zu bytes of GPU memory not registered: %s", n, sluice_last_error_detail());
	return rc;
}

void sluice_gpu_free(struct sluice_engine *eng, void *p)
{
	if (p)
		sluice_gpu_deregister(eng, p);
	sl__gpu_free(&eng->gpu, p);
}

int sluice_gpu_register(struct sluice_engine *eng, void *p, size_t n)
{
	int rc = eng->gpu.ctx ? sl__gpu_bind(&eng->gpu) : sl__err(SLUICE_ENOGPU, "engine has no GPU");

	for (int i = 0; !rc && i < SL_STORES; i++)
		if (eng->usable[i] && sl__stores[i]->register_mem && (rc = sl__stores[i]->register_mem(p, n)))
			while (--i >= 0) /* none stays registered */
				if (eng->usable[i] && sl__stores[i]->deregister_mem)
					sl__stores[i]->deregister_mem(p);
	return rc;
}

void sluice_gpu_deregister(struct sluice_engine *eng, void *p)
{
	if (eng->gpu.ctx && !sl__gpu_bind(&eng->gpu))
		for (int i = 0; i < SL_STORES; i++)
			if (eng->usable[i] && sl__stores[i]->deregister_mem)
				sl__stores[i]->deregister_mem(p);
}

int sluice_gpu_stream_sync(struct sluice_engine *eng, void *stream)
{
	int rc;

	if (!eng->gpu.ctx)
		return sl__err(SLUICE_ENOGPU, "waiting for a stream: the engine has no GPU");
	if ((rc = sl__gpu_bind(&eng->gpu)))
		return rc;
	return SL_CU(eng->gpu.cu->StreamSynchronize((sl_CUstream)stream), "cuStreamSynchronize (the caller's stream)");
}

int sluice_gpu_copy(struct sluice_engine *eng, void *dst, const void *src, size_t n)
{
	int rc;

	if (!eng->gpu.ctx) {
		memmove(dst, src, n);
		return 0;
	}
	rc = sl__gpu_bind(&eng->gpu);
	if (rc)
		return rc;
	/*
	 * With unified addressing cuMemcpy infers both memory kinds.  From
	 * pageable memory it may return before the DMA lands, so synchronise:
	 * the engine's streams do not order after the legacy stream.
	 */
	rc = SL_CU(eng->gpu.cu->Memcpy((sl_CUdeviceptr)(uintptr_t)dst, (sl_CUdeviceptr)(uintptr_t)src, n),
		   "cuMemcpy");
	return rc ? rc : SL_CU(eng->gpu.cu->StreamSynchronize(NULL), "cuStreamSynchronize");
}

int sluice_is_gpu_ptr(struct sluice_engine *eng, const void *p)
{
	return sl__gpu_is_device_ptr(&eng->gpu, p);
}

const struct sluice_config *sl__eng_cfg(const struct sluice_engine *eng)
{
	return &eng->cfg;
}

struct sl__gpu *sl__eng_gpu(struct sluice_engine *eng)
{
	return &eng->gpu;
}

unsigned sl__eng_nlanes(const struct sluice_engine *eng)
{
	return eng->nlanes;
}

struct sl__gpu *sl__eng_lane(struct sluice_engine *eng, unsigned lane)
{
	return eng->lane[lane < eng->nlanes ? lane : 0];
}

unsigned sl__eng_threads(const struct sluice_engine *eng)
{
	return eng->nworkers;
}

int sl__eng_file_add(struct sluice_engine *eng, struct sluice_file *f)
{
	pthread_mutex_lock(&eng->lock);
	for (int i = 0; i < SL_MAX_FILES; i++)
		if (!eng->files[i]) {
			eng->files[i] = f;
			f->index = i;
			f->gen = ++eng->file_gen;
			break;
		}
	pthread_mutex_unlock(&eng->lock);
	return f->index >= 0 ? 0 : sl__err(-EMFILE, "%s: more than %d files open in one engine", f->path, SL_MAX_FILES);
}

void sl__eng_file_remove(struct sluice_engine *eng, struct sluice_file *f)
{
	if (f->index < 0)
		return;
	pthread_mutex_lock(&eng->lock);
	eng->files[f->index] = NULL;
	pthread_mutex_unlock(&eng->lock);
	f->index = -1;
}

void *sl__eng_attach(struct sluice_engine *eng, int key, void *(*make)(struct sluice_engine *eng, int *err),
		     void (*drop)(struct sluice_engine *eng, void *state), int *err)
{
	void *st;

	*err = 0;
	pthread_mutex_lock(&eng->lock);
	if (!eng->attached[key] && (eng->attached[key] = make(eng, err)))
		eng->drop[key] = drop;
	st = eng->attached[key];
	pthread_mutex_unlock(&eng->lock);
	return st;
}
