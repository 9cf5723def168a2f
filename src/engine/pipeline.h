/*
 * The engine's own struct and its workers, private to src/engine: others
 * go through engine.h.  Calls run one way: engine.c -> worker.c -> job.c,
 * and plan.c, job.c for the callers.
 */
#ifndef SL_PIPELINE_H
#define SL_PIPELINE_H

#include "engine/engine.h"

struct sl__worker;

struct sluice_engine {
	struct sluice_config cfg;
	struct sl__gpu gpu;        /* gpu.ctx NULL without CUDA: the first of the device ids */
	/*
	 * Lanes: one per device id, lane 0 being gpu.  Worker i serves lane
	 * i % nlanes on that GPU's context and NUMA node (-1: none, any CPU).
	 */
	unsigned nlanes;
	struct sl__gpu *lane[SLUICE_MAX_DEVICES];
	struct sl__gpu xgpu[SLUICE_MAX_DEVICES - 1]; /* lanes 1.. */
	int numa_node[SLUICE_MAX_DEVICES];
	cpu_set_t numa_cpus[SLUICE_MAX_DEVICES];
	const struct sl__store *local; /* the store of local files: uring or psync */
	const struct sl__store *gds;   /* NULL unless GDS is in use: then local files open through it */
	int gds_real;
	unsigned char usable[SL_STORES]; /* by store id: 1 where workers keep an instance of the store */
	void *store_shared[SL_STORES]; /* each store's state shared by the engine's files (engine lock) */
	char unusable[1024];
	char gpu_unusable[256];    /* why gpu.ctx is NULL */
	char *pool;                /* all slots of all workers */
	size_t pool_len;
	int pool_pinned;           /* with a GPU: no slot's pinning was refused (slots pin on first use) */
	uint64_t opened_ns;        /* sl__now_ns() when the engine's open began */
	size_t slot_size;
	unsigned slots_per_worker;
	int fixed_bufs;

	pthread_mutex_t lock;
	pthread_cond_t work_cv;    /* workers wait for jobs */
	pthread_cond_t done_cv;    /* callers wait for jobs to finish */
	struct sl__job *queue;     /* jobs with unclaimed segments */
	struct sl__job **queue_tail;
	int stopping;
	int init_err;              /* first worker start-up error */
	unsigned started;          /* workers through sl_worker_init: open waits for these */
	unsigned prepared;         /* and through registering their slots: get_info waits for these */

	struct sluice_file *files[SL_MAX_FILES];
	unsigned file_gen;

	void *attached[SL_ATTACHMENTS];  /* the layers' per-engine state (sl__eng_attach), engine lock */
	void (*drop[SL_ATTACHMENTS])(struct sluice_engine *eng, void *state);

	struct sl__worker *workers;
	unsigned nworkers;
	struct sl__hist lat;
	_Atomic uint64_t st_ios, st_bytes;
	/*
	 * GPU reads of cached local bytes whose call moves map_dma_min to
	 * map_dma_max bytes: each segment's page-cache pages registered with
	 * the driver and copied by DMA, no CPU copy (worker.c).  map_dma_off:
	 * the driver refused once, the copy path from then on.
	 */
	size_t map_dma_min, map_dma_max;
	_Atomic int map_dma_off;
};

/* worker.c */
SL_HIDDEN void *sl__worker_main(void *arg);
SL_HIDDEN size_t sl__worker_size(void);
/* Starts worker id; a start failure is recorded in eng->init_err. */
SL_HIDDEN void sl__worker_setup(struct sl__worker *w, struct sluice_engine *eng, unsigned id);
SL_HIDDEN void sl__worker_join(struct sl__worker *w);
/* The i-th worker of the engine's array. */
#define SL_WORKER(eng, i) ((struct sl__worker *)((char *)(eng)->workers + (size_t)(i) * sl__worker_size()))


#endif
