/*
 * engine: the transfer pipeline, as the layers above it (xfer/, dsread/,
 * loader/) use it.
 *
 * A call (read, write, batch, async) becomes a job: a plan of segments,
 * each one storage I/O of at most max_transfer_size, with the pieces of
 * caller memory it feeds or drains.  Worker threads claim segments from
 * the engine's job list and run each through a bounce slot:
 *
 *   read:  storage --io--> slot --H2D (async, event)--> GPU pieces
 *   write: GPU pieces --D2H (async, event)--> slot --io--> storage
 *
 * Each worker owns queue_depth slots, an instance of each store the engine
 * uses (store/store.h) and a CUDA stream, so storage I/O of one slot
 * overlaps DMA of another.  The engine's struct is private to this
 * directory (pipeline.h); what others need of it has a function here.
 *
 * Depends on core, store, gpu and diag.
 */
#ifndef SL_ENGINE_H
#define SL_ENGINE_H

#include <pthread.h>

#include "core/core.h"
#include "gpu/gpu.h"
#include "store/store.h"
#include "engine/job.h"

#define SL_MAX_FILES 1024 /* open sluice_files per engine */

struct sluice_file {
	struct sluice_engine *eng;
	char *path;
	struct sl__sfile s; /* its store and the store's handle (store/store.h) */
	int index;          /* slot in eng->files */
	unsigned gen;
	int writable;
};

/*
 * engine.c: into *out the store that serves path in eng (the registry's
 * match, else eng->gds or eng->local): 0, or an error naming path where
 * that store is unusable.
 */
SL_HIDDEN int sl__store_for(struct sluice_engine *eng, const char *path, const struct sl__store **out);
/* The struct sl__open_env of a store's open or put in eng. */
SL_HIDDEN void sl__open_env(struct sluice_engine *eng, const struct sl__store *st, void *arg, struct sl__open_env *env);

/* The engine's settings, its first GPU (gpu->ctx NULL without CUDA), its lanes (one per device id, lane 0 the first GPU), its worker count. */
SL_HIDDEN const struct sluice_config *sl__eng_cfg(const struct sluice_engine *eng);
SL_HIDDEN struct sl__gpu *sl__eng_gpu(struct sluice_engine *eng);
SL_HIDDEN unsigned sl__eng_nlanes(const struct sluice_engine *eng);
SL_HIDDEN struct sl__gpu *sl__eng_lane(struct sluice_engine *eng, unsigned lane);
SL_HIDDEN unsigned sl__eng_threads(const struct sluice_engine *eng);

/*
 * The engine's file table: sl__eng_file_add gives f its index (f->index,
 * f->gen), or -EMFILE naming f->path; sl__eng_file_remove frees it.
 */
SL_HIDDEN int sl__eng_file_add(struct sluice_engine *eng, struct sluice_file *f);
SL_HIDDEN void sl__eng_file_remove(struct sluice_engine *eng, struct sluice_file *f);

/*
 * State a layer above keeps per engine (async's flag page), made by
 * make(eng, err) on first use under the engine's lock and freed by
 * drop(eng, state) at engine close: the engine calls back without knowing
 * the layer.  NULL, and make's error in *err, if make failed.
 */
enum { SL_ATTACH_ASYNC, SL_ATTACH_DSFILES, SL_ATTACHMENTS };
SL_HIDDEN void *sl__eng_attach(struct sluice_engine *eng, int key, void *(*make)(struct sluice_engine *eng, int *err),
			       void (*drop)(struct sluice_engine *eng, void *state), int *err);

#endif
