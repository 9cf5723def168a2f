/*
 * Dataset micro-benchmarks (public API only).
 *
 *   ds_bench make DIR N              a dataset of N records (8-byte i64 field)
 *   ds_bench open DIR REPS           median time of sluice_dataset_open+close,
 *                                    page cache dropped before each (root)
 *   ds_bench resident DIR K          touch records 0..K-1 after a cold open;
 *                                    resident bytes of index.sli per record touched
 *   ds_bench makeblob DIR N BYTES    N records of one BYTES-long bytes field (random)
 *   ds_bench seqread DIR gpu|host    every record in order through sluice_dataset_read_batch
 *                                    (batches of up to 256 MiB), against the engine's raw read
 *                                    of the same data files (sluice_file_read), page cache
 *                                    dropped before each; median of 3 of each; GB/s and ratio
 *   ds_bench recs DIR                records/s reading every record in order into host memory
 *                                    (for comparison with a format's reference reader)
 *   ds_bench loader DIR gpu|host B STEP_US cold|warm [PREFETCH [EPOCHS]]
 *                                    EPOCHS (default 1) shuffled epochs of the loader, batches
 *                                    of B; the consumer spends STEP_US per batch (a stand-in
 *                                    for the training step; gSTEP_US: a kernel of that length
 *                                    on a CUDA stream the batches are ordered on, the CPU thread
 *                                    free, and the GPU's idle share measured with events);
 *                                    cold drops the page cache first,
 *                                    warm reads every file of DIR through it first;
 *                                    samples/s, GB/s, CPU s/GB, the loader's time per batch
 *                                    after the first, epochs' fills left out (batch_us), the
 *                                    consumer's wait share in each tenth of the run (first
 *                                    batches of epochs left out), its longest wait (and the
 *                                    epoch and batch of it) and the loader's own stats
 *   ds_bench randread DIR QD READS   READS uniformly random records, cold, O_DIRECT,
 *                                    batches of 256 from two submitting threads through
 *                                    one engine with QD I/O slots (threads x queue
 *                                    depth); records/s
 * Prints one JSON object.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sluice.h"

/* Records per seqread batch at most: enough that 4 KiB records fill the 256 MiB buffer, as raw reads do. */
#define SL_SEQ_BATCH 65536

/* Reads every regular file of dir through the page cache, so that a warm pass is warm. */
static void warm_dir(const char *dir)
{
	static char buf[1 << 20];
	char path[4096];
	struct dirent *e;
	DIR *d = opendir(dir);

	while (d && (e = readdir(d))) {
		int fd;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		fd = e->d_name[0] == '.' ? -1 : open(path, O_RDONLY);
		while (fd >= 0 && read(fd, buf, sizeof(buf)) > 0)
			;
		if (fd >= 0)
			close(fd);
	}
	if (d)
		closedir(d);
}

/*
 * A synthetic GPU step: a kernel that spins on the GPU's clock for a given
 * time (PTX, compiled by the driver), launched on a stream of the primary
 * context the engine uses.  The driver is loaded at run time, as sluice does.
 */
static const char spin_ptx[] =
	".version 6.0\n.target sm_50\n.address_size 64\n"
	".visible .entry spin(.param .u64 ns)\n{\n"
	"\t.reg .pred %p<2>;\n\t.reg .b64 %rd<5>;\n"
	"\tld.param.u64 %rd1, [ns];\n\tmov.u64 %rd2, %globaltimer;\n"
	"LOOP:\n\tmov.u64 %rd3, %globaltimer;\n\tsub.s64 %rd4, %rd3, %rd2;\n"
	"\tsetp.lt.u64 %p1, %rd4, %rd1;\n\t@%p1 bra LOOP;\n\tret;\n}\n";

struct gstep {
	void *st, *fn;
	int (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
		      void **);
	int (*ev_create)(void **, unsigned);
	int (*ev_record)(void *, void *);
	int (*ev_elapsed)(float *, void *, void *);
	int (*ev_sync)(void *);
	int (*sync)(void *);
	void *done[2];              /* after the last two steps: the loop waits for the one before last */
};

static int gstep_init(struct gstep *g)
{
	void *cu = dlopen("libcuda.so.1", RTLD_NOW), *ctx, *mod;
	int dev, (*init)(unsigned), (*dget)(int *, int), (*retain)(void **, int), (*setcur)(void *);
	int (*load)(void **, const void *), (*getfn)(void **, void *, const char *), (*screate)(void **, unsigned);

	if (!cu)
		return -1;
	*(void **)&init = dlsym(cu, "cuInit");
	*(void **)&dget = dlsym(cu, "cuDeviceGet");
	*(void **)&retain = dlsym(cu, "cuDevicePrimaryCtxRetain");
	*(void **)&setcur = dlsym(cu, "cuCtxSetCurrent");
	*(void **)&load = dlsym(cu, "cuModuleLoadData");
	*(void **)&getfn = dlsym(cu, "cuModuleGetFunction");
	*(void **)&screate = dlsym(cu, "cuStreamCreate");
	*(void **)&g->launch = dlsym(cu, "cuLaunchKernel");
	*(void **)&g->ev_create = dlsym(cu, "cuEventCreate");
	*(void **)&g->ev_record = dlsym(cu, "cuEventRecord");
	*(void **)&g->ev_elapsed = dlsym(cu, "cuEventElapsedTime");
	*(void **)&g->sync = dlsym(cu, "cuStreamSynchronize");
	*(void **)&g->ev_sync = dlsym(cu, "cuEventSynchronize");
	if (!init || !dget || !retain || !setcur || !load || !getfn || !screate || !g->launch || !g->ev_create ||
	    !g->ev_record || !g->ev_elapsed || !g->sync || !g->ev_sync)
		return -1;
	if (init(0) || dget(&dev, 0) || retain(&ctx, dev) || setcur(ctx) || load(&mod, spin_ptx) ||
	    getfn(&g->fn, mod, "spin") || screate(&g->st, 1 /* non-blocking */) ||
	    g->ev_create(&g->done[0], 2 /* no timing */) || g->ev_create(&g->done[1], 2))
		return -1;
	return 0;
}

static int gstep_run(struct gstep *g, unsigned long long ns)
{
	void *arg[] = { &ns };

	return g->launch(g->fn, 1, 1, 1, 1, 1, 1, 0, g->st, arg, NULL);
}

/* Seconds of GPU time between two events recorded now and after n kernels of ns each. */
static double gstep_span(struct gstep *g, unsigned n, unsigned long long ns)
{
	void *a, *b;
	float ms = -1;

	if (g->ev_create(&a, 0) || g->ev_create(&b, 0) || g->ev_record(a, g->st))
		return -1;
	for (unsigned i = 0; i < n; i++)
		gstep_run(g, ns);
	if (g->ev_record(b, g->st) || g->sync(g->st) || g->ev_elapsed(&ms, a, b))
		return -1;
	return ms / 1e3;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * What the machine did beside the run: CPU time the hypervisor gave to
 * others (steal, from /proc/stat, every 5 ms), and from /proc/vmstat the
 * kernel's reclaim, compaction and major faults over the run.  A burst of
 * waits in a tenth with steal in it is the host's, not the loader's.  And a
 * canary: every 5 ms, the CPU time a fixed loop of arithmetic takes (no
 * memory; its CPU time, so preemption does not count).  Where it grows, the
 * CPU itself ran slower for everything on it.
 */
struct sampler {
	pthread_t tid;
	atomic_int stop;
	double t[4096], steal[4096]; /* seconds of steal over all CPUs, at time t */
	double canary[4096];         /* the loop's CPU seconds, at time t */
	unsigned n;
	long long vm0[4], vm1[4];
};

static const char *const vm_keys[4] = { "pgscan_kswapd", "pgscan_direct", "compact_stall", "pgmajfault" };

static double steal_s(void)
{
	unsigned long long v[8] = { 0 };
	FILE *f = fopen("/proc/stat", "r");

	if (!f)
		return 0;
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
		   &v[7]) != 8)
		v[7] = 0;
	fclose(f);
	return (double)v[7] / (double)sysconf(_SC_CLK_TCK);
}

static void vmstat(long long *out)
{
	char key[64];
	long long v;
	FILE *f = fopen("/proc/vmstat", "r");

	for (unsigned i = 0; i < 4; i++)
		out[i] = 0;
	while (f && fscanf(f, "%63s %lld", key, &v) == 2)
		for (unsigned i = 0; i < 4; i++)
			if (!strcmp(key, vm_keys[i]))
				out[i] = v;
	if (f)
		fclose(f);
}

static double thread_cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *sampler_thread(void *arg)
{
	struct sampler *sm = arg;
	volatile uint64_t sink = 0;

	while (!atomic_load(&sm->stop) && sm->n < 4096) {
		uint64_t x = 88172645463325252ull;
		double c = thread_cpu();

		for (unsigned i = 0; i < 20000; i++) { /* about 20 us */
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
		}
		sink += x;
		sm->canary[sm->n] = thread_cpu() - c;
		sm->t[sm->n] = now();
		sm->steal[sm->n++] = steal_s();
		usleep(5000);
	}
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median of the canary's CPU time between times a and b, in us (0: no sample). */
static double canary_between(const struct sampler *sm, double a, double b)
{
	double v[4096];
	unsigned k = 0;

	for (unsigned i = 0; i < sm->n; i++)
		if (sm->t[i] >= a && sm->t[i] < b)
			v[k++] = sm->canary[i];
	if (!k)
		return 0;
	qsort(v, k, sizeof(double), cmp_double);
	return v[k / 2] * 1e6;
}

/* Steal seconds (all CPUs) between times a and b. */
static double steal_between(const struct sampler *sm, double a, double b)
{
	double lo = 0, hi = 0;
	int have_lo = 0;

	for (unsigned i = 0; i < sm->n; i++) {
		if (sm->t[i] <= a || !have_lo) {
			lo = sm->steal[i];
			have_lo = 1;
		}
		if (sm->t[i] <= b)
			hi = sm->steal[i];
	}
	return hi - lo;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Bytes of path currently in the page cache. */
static uint64_t resident(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	uint64_t r = 0;

	if (fd < 0 || fstat(fd, &st) < 0)
		return 0;
	size_t pages = ((size_t)st.st_size + 4095) / 4096;
	unsigned char *vec = malloc(pages);
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);

	if (m != MAP_FAILED && vec && mincore(m, (size_t)st.st_size, vec) == 0)
		for (size_t p = 0; p < pages; p++)
			r += (vec[p] & 1) ? 4096 : 0;
	if (m != MAP_FAILED)
		munmap(m, (size_t)st.st_size);
	free(vec);
	close(fd);
	return r;
}

/* Two submitters keep batches in flight back to back, as a loader does. */
struct rr {
	struct sluice_engine *eng;
	struct sluice_dataset *ds;
	uint64_t reads, seed;
	_Atomic uint64_t *done;
	int err;
};

static void *rr_thread(void *arg)
{
	struct rr *r = arg;
	uint64_t idx[256];
	char *buf = aligned_alloc(4096, 256u << 17);

	while (atomic_fetch_add(r->done, 256) < r->reads) {
		for (int k = 0; k < 256; k++) {
			r->seed = r->seed * 6364136223846793005ull + 1442695040888963407ull;
			idx[k] = (r->seed >> 11) % sluice_dataset_count(r->ds);
		}
		if (sluice_dataset_read_batch(r->eng, r->ds, idx, 256, buf, 256u << 17, NULL, NULL) < 0) {
			fprintf(stderr, "read_batch: %s\n", sluice_last_error_detail());
			r->err = 1;
			break;
		}
	}
	free(buf);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "makeblob")) {
		struct sluice_field f[1] = { { "blob", SLUICE_DTYPE_BYTES, 0, { 0 } } };
		struct sluice_writer *w;
		uint64_t n = strtoull(argv[3], NULL, 10), seed = 1;
		size_t len = strtoull(argv[4], NULL, 10);
		unsigned char *b = malloc(len);

		if (!b || sluice_writer_open(&w, argv[2], f, 1, NULL))
			return 1;
		for (uint64_t i = 0; i < n; i++) {
			const void *v[1] = { b };

			for (size_t k = 0; k + 8 <= len; k += 8) {
				seed = seed * 6364136223846793005ull + 1442695040888963407ull;
				memcpy(b + k, &seed, 8);
			}
			if (sluice_writer_add(w, v, &len))
				return 1;
		}
		free(b);
		return sluice_writer_close(w) ? 1 : 0;
	}
	if (argc == 4 && (!strcmp(argv[1], "seqread") || !strcmp(argv[1], "recs"))) {
		struct sluice_dataset *ds;
		struct sluice_engine *eng;
		int gpu = !strcmp(argv[1], "seqread") && !strcmp(argv[3], "gpu"), recs = !strcmp(argv[1], "recs");
		const size_t cap = 256u << 20;
		uint64_t n, bytes = 0, *idx;
		/* Passes, median taken: DS_BENCH_REPS (1..3, default 3); a harness interleaving peers asks for 1. */
		const char *re = getenv("DS_BENCH_REPS");
		int reps = re && *re >= '1' && *re <= '3' && !re[1] ? *re - '0' : 3;
		double raw[3], dsr[3];
		char *dst;

		if (sluice_dataset_open(&ds, argv[2]) || sluice_engine_open(&eng, NULL))
			return 1;
		if (gpu ? sluice_gpu_alloc(eng, cap, (void **)&dst) != 0 : !(dst = aligned_alloc(4096, cap))) {
			fprintf(stderr, "no buffer: %s\n", sluice_last_error_detail());
			return 1;
		}
		n = sluice_dataset_count(ds);
		idx = malloc(((n < SL_SEQ_BATCH ? n : SL_SEQ_BATCH) + 1) * sizeof(uint64_t));
		for (int rep = 0; rep < reps; rep++) {
			double t0;

			/* Raw: each data file whole, in pieces of the buffer's size. */
			if (!recs) {
				sluice_drop_page_cache();
				t0 = now();
				for (unsigned f = 0; f < sluice_dataset_shards(ds); f++) {
					uint64_t r, b, off = 0;
					struct sluice_file *fh;
					char name[4096];

					if (sluice_dataset_shard_info(ds, f, &r, &b))
						return 1;
					/* The native format's files: DIR/shard-NNNNNN.sls. */
					snprintf(name, sizeof(name), "%s/shard-%06u.sls", argv[2], f);
					if (sluice_file_open(&fh, eng, name, SLUICE_RDONLY))
						return 1;
					while (off < b) {
						size_t len = b - off < cap ? (size_t)(b - off) : cap;

						if (sluice_file_read(fh, off, len, dst, NULL) < 0)
							return 1;
						off += len;
					}
					sluice_file_close(fh);
					if (rep == 0)
						bytes += b;
				}
				raw[rep] = (double)bytes / (now() - t0) / 1e9;
			}
			/* Records in order, as many per batch as fit the buffer. */
			uint64_t i = 0, got = 0;

			sluice_drop_page_cache();
			t0 = now();
			while (i < n) {
				size_t k = 0, need = 0;
				struct sluice_record_loc loc;

				while (i + k < n && k < SL_SEQ_BATCH && sluice_dataset_locate(ds, i + k, &loc) == 0 &&
				       need + loc.length + 8 <= cap) {
					idx[k] = i + k;
					need += ((size_t)loc.length + 7) & ~(size_t)7;
					k++;
				}
				ssize_t r = sluice_dataset_read_batch(eng, ds, idx, k, dst, cap, NULL, NULL);

				if (r < 0 || !k) {
					fprintf(stderr, "read_batch: %s\n", sluice_last_error_detail());
					return 1;
				}
				got += (uint64_t)r;
				i += k;
			}
			dsr[rep] = recs ? (double)n / (now() - t0) : (double)got / (now() - t0) / 1e9;
		}
		qsort(dsr, (size_t)reps, sizeof(double), cmp);
		if (recs) {
			printf("{\"records\":%llu,\"records_per_s\":%.0f}\n", (unsigned long long)n, dsr[reps / 2]);
		} else {
			qsort(raw, (size_t)reps, sizeof(double), cmp);
			printf("{\"target\":\"%s\",\"bytes\":%llu,\"raw_gb_s\":%.3f,\"dataset_gb_s\":%.3f,\"ratio\":%.3f}\n",
			       gpu ? "gpu" : "host", (unsigned long long)bytes, raw[reps / 2], dsr[reps / 2],
			       dsr[reps / 2] / raw[reps / 2]);
		}
		return 0;
	}
	if (argc >= 7 && argc <= 9 && !strcmp(argv[1], "loader")) {
		struct sluice_dataset *ds;
		struct sluice_engine *eng;
		struct sluice_loader *ld;
		struct sluice_batch b = SLUICE_BATCH_INIT;
		struct rusage r0, r1;
		int gpu = !strcmp(argv[3], "gpu"), rc = 0;
		struct sluice_loader_options o = { .size = sizeof(struct sluice_loader_options), .batch_size = (uint32_t)strtoul(argv[4], NULL, 10), .gpu = gpu,
						   .seed = 1, .shuffle = 1, .drop_last = 1,
						   .prefetch = argc >= 8 ? (unsigned)strtoul(argv[7], NULL, 10) : 0 };
		unsigned epochs = argc == 9 ? (unsigned)strtoul(argv[8], NULL, 10) : 1;
		int on_gpu = argv[5][0] == 'g';
		/*
		 * SLUICE_BENCH_HOLD=1: the hold option, as sluice.Loader runs it: each batch released once the next
		 * has come (a loop's variable holds the batch while it asks for the next).
		 */
		const char *hv = getenv("SLUICE_BENCH_HOLD");
		uint64_t held = 0;
		double step = strtod(argv[5] + on_gpu, NULL) / 1e6, t0, dt, t_first = 0, t_end = 0, refill = 0;
		struct gstep gs;
		void *ev[2 * 64];
		double gspan = 0, gbusy = 0, gap = 0;
		uint64_t ns = (uint64_t)(step * 1e9), nk = 0;
		uint64_t recs = 0, nb = 0, cap = 0, max_at = 0, max_epoch = 0;
		double max_wait = 0;
		double *wait = NULL, *busy = NULL, *at = NULL; /* per batch: the consumer's wait, its wait + step, when */
		static struct sampler sm;
		static char js[4096];

		if (!epochs || (on_gpu && epochs > 64))
			return 2;
		if (sluice_dataset_open(&ds, argv[2]) || sluice_engine_open(&eng, NULL))
			return 1;
		if (on_gpu) {
			double base;

			if (gstep_init(&gs)) {
				fprintf(stderr, "loader: no CUDA driver for a GPU step\n");
				return 1;
			}
			for (unsigned i = 0; i < 2 * epochs; i++)
				if (gs.ev_create(&ev[i], 0))
					return 1;
			/* The kernels back to back, no loader: what launches alone leave between them. */
			gstep_span(&gs, 20, ns);
			base = gstep_span(&gs, 200, ns);
			gap = base > 0 ? (base - 200 * step) / 200 : 0;
		}
		if (!strcmp(argv[6], "cold"))
			sluice_drop_page_cache();
		else
			warm_dir(argv[2]);
		o.hold = hv && !strcmp(hv, "1");
		getrusage(RUSAGE_SELF, &r0);
		t0 = now();
		if (sluice_loader_open(&ld, eng, ds, &o)) {
			fprintf(stderr, "loader: %s\n", sluice_last_error_detail());
			return 1;
		}
		cap = sluice_loader_batches(ld) * epochs;
		wait = calloc(cap ? cap : 1, sizeof(double));
		busy = calloc(cap ? cap : 1, sizeof(double));
		at = calloc(cap ? cap : 1, sizeof(double));
		if (!wait || !busy || !at)
			return 1;
		vmstat(sm.vm0);
		pthread_create(&sm.tid, NULL, sampler_thread, &sm);
		for (unsigned e = 0; e < epochs && !rc; e++) {
			if (e && sluice_loader_set_epoch(ld, e))
				break;
			for (uint64_t k = 0;; k++) {
				double a = now(), t;

				if ((rc = sluice_loader_next(ld, &b, on_gpu ? gs.st : NULL)) != 1)
					break;
				if (held && sluice_loader_release(ld, held))
					return 1;
				held = b.hold;
				t = now();
				if (on_gpu) {
					/* GPU time of the epoch from its first batch's arrival (the fill left out). */
					if (!k && gs.ev_record(ev[2 * e], gs.st))
						return 1;
					/*
					 * As a training loop reading the loss of the step before (loss.item()),
					 * the thread runs at most two steps ahead of the GPU.
					 */
					if (gstep_run(&gs, ns) || gs.ev_record(gs.done[nk % 2], gs.st) ||
					    (nk && gs.ev_sync(gs.done[(nk - 1) % 2])))
						return 1;
					nk++;
				}
				if (!t_first)
					t_first = t;
				else if (!k)
					refill += t - a; /* later epochs' fills: not the loader's time per batch */
				recs += b.size;
				while (!on_gpu && step > 0 && now() - t < step)
					; /* the consumer's step: busy, as a GPU step's launch thread is */
				if (nb < cap && k) { /* an epoch's first batch is its fill (the stats' fill_us) */
					wait[nb] = t - a;
					at[nb] = a;
					busy[nb++] = now() - a;
					if (t - a > max_wait) {
						max_wait = t - a;
						max_at = k;
						max_epoch = e;
					}
				}
			}
			if (on_gpu && gs.ev_record(ev[2 * e + 1], gs.st))
				return 1;
			t_end = now();
		}
		if (on_gpu) {
			if (gs.sync(gs.st))
				return 1;
			for (unsigned e = 0; e < epochs; e++) {
				float ms = 0;

				if (gs.ev_elapsed(&ms, ev[2 * e], ev[2 * e + 1]))
					return 1;
				gspan += ms / 1e3;
			}
			gbusy = (double)nk * step;
		}
		dt = now() - t0;
		getrusage(RUSAGE_SELF, &r1);
		atomic_store(&sm.stop, 1);
		pthread_join(sm.tid, NULL);
		vmstat(sm.vm1);
		if (rc) {
			fprintf(stderr, "loader: %s\n", sluice_last_error_detail());
			return 1;
		}
		sluice_loader_stats_json(ld, js, sizeof(js));
		double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
			     (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e6;
		uint64_t bytes = strtoull(strstr(js, "\"bytes\":") + 8, NULL, 10);
		uint64_t batches = strtoull(strstr(js, "\"batches\":") + 10, NULL, 10);
		char tenths[256], steals[256], canaries[256], vm[256];
		size_t tl = 0, sl = 0, vl = 0, cl = 0;

		for (unsigned q = 0; q < 10; q++) {
			double w = 0, all = 0;

			for (uint64_t i = nb * q / 10; i < nb * (q + 1) / 10; i++) {
				w += wait[i];
				all += busy[i];
			}
			tl += (size_t)snprintf(tenths + tl, sizeof(tenths) - tl, "%s%.4f", q ? "," : "", all > 0 ? w / all : 0);
			/* Steal in the tenth, as a share of the 16 (or however many) CPUs' time in it. */
			double a0 = nb ? at[nb * q / 10] : 0, a1 = nb ? (q == 9 ? t_end : at[nb * (q + 1) / 10]) : 0;
			double cpus = (double)sysconf(_SC_NPROCESSORS_ONLN);

			sl += (size_t)snprintf(steals + sl, sizeof(steals) - sl, "%s%.4f", q ? "," : "",
					       a1 > a0 ? steal_between(&sm, a0, a1) / (cpus * (a1 - a0)) : 0);
			cl += (size_t)snprintf(canaries + cl, sizeof(canaries) - cl, "%s%.1f", q ? "," : "",
					       canary_between(&sm, a0, a1));
		}
		for (unsigned i = 0; i < 4; i++)
			vl += (size_t)snprintf(vm + vl, sizeof(vm) - vl, "%s\"%s\":%lld", i ? "," : "", vm_keys[i],
					       sm.vm1[i] - sm.vm0[i]);
		printf("{\"target\":\"%s\",\"batch\":%u,\"step_us\":%.1f,\"step_on\":\"%s\",\"temp\":\"%s\",\"epochs\":%u,\"records\":%llu,"
		       "\"seconds\":%.3f,\"samples_per_s\":%.0f,\"gb_s\":%.3f,\"cpu_s_per_gb\":%.3f,\"batch_us\":%.1f,"
		       "\"wait_share_by_tenth\":[%s],\"steal_share_by_tenth\":[%s],\"steal_s\":%.3f,\"vmstat\":{%s},"
		       "\"canary_us_by_tenth\":[%s],\"canary_us\":%.1f,"
		       "\"max_wait_us\":%.1f,\"max_wait_at\":[%llu,%llu],"
		       "\"gpu_step\":{\"kernels\":%llu,\"span_s\":%.4f,\"idle_share\":%.4f,\"launch_gap_us\":%.2f,"
		       "\"idle_share_less_launch_gaps\":%.4f},\"loader\":%s}\n",
		       argv[3], o.batch_size, step * 1e6, on_gpu ? "gpu" : "cpu", argv[6], epochs, (unsigned long long)recs, dt, (double)recs / dt,
		       (double)bytes / dt / 1e9, bytes ? cpu / ((double)bytes / 1e9) : 0.0,
		       batches > 1 ? (t_end - t_first - refill) / (double)(batches - 1) * 1e6 : 0.0, tenths, steals,
		       steal_between(&sm, t0, t0 + dt), vm, canaries, canary_between(&sm, t0, t0 + dt + 1), max_wait * 1e6,
		       (unsigned long long)max_epoch, (unsigned long long)max_at, (unsigned long long)nk, gspan,
		       gspan > 0 ? 1 - gbusy / gspan : 0.0, gap * 1e6,
		       gspan > 0 ? 1 - (gbusy + (double)nk * gap) / gspan : 0.0, js);
		free(wait);
		free(busy);
		free(at);
		if (held && sluice_loader_release(ld, held))
			return 1;
		sluice_loader_close(ld);
		sluice_engine_close(eng);
		sluice_dataset_close(ds);
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "randread")) {
		struct sluice_dataset *ds;
		struct sluice_engine *eng;
		struct sluice_config *cfg;
		unsigned qd = (unsigned)strtoul(argv[3], NULL, 10), threads = qd < 4 ? 1 : qd / 4;
		uint64_t reads = strtoull(argv[4], NULL, 10), seed = 7, done;
		double t0, dt;

		if (sluice_dataset_open(&ds, argv[2]) || sluice_config_new(&cfg) ||
		    sluice_config_set_direct(cfg, SLUICE_DIRECT_ALWAYS) || sluice_config_set_threads(cfg, threads) ||
		    sluice_config_set_queue_depth(cfg, qd / threads) || sluice_config_set_max_transfer_size(cfg, 1 << 20) ||
		    sluice_config_set_gpu(cfg, 0) || sluice_engine_open(&eng, cfg))
			return 1;
		_Atomic uint64_t claimed = 0;
		struct rr rr[2] = { { eng, ds, reads, seed, &claimed, 0 }, { eng, ds, reads, seed + 1, &claimed, 0 } };
		pthread_t tid[2];

		sluice_drop_page_cache();
		t0 = now();
		for (int t = 0; t < 2; t++)
			pthread_create(&tid[t], NULL, rr_thread, &rr[t]);
		for (int t = 0; t < 2; t++)
			pthread_join(tid[t], NULL);
		dt = now() - t0;
		if (rr[0].err || rr[1].err)
			return 1;
		done = (reads + 255) / 256 * 256; /* batches whose claim came before the limit */
		printf("{\"records\":%llu,\"qd\":%u,\"threads\":%u,\"seconds\":%.3f,\"records_per_s\":%.0f}\n",
		       (unsigned long long)done, qd, threads, dt, (double)done / dt);
		return 0;
	}
	if (argc != 4) {
		fprintf(stderr, "usage: ds_bench make|open|resident DIR N | makeblob DIR N BYTES | randread DIR QD READS\n");
		return 2;
	}
	const char *dir = argv[2];
	uint64_t n = strtoull(argv[3], NULL, 10);

	if (!strcmp(argv[1], "make")) {
		struct sluice_field f[1] = { { "v", SLUICE_DTYPE_I64, 0, { 0 } } };
		struct sluice_writer *w;
		struct sluice_writer_options opt = { .size = sizeof(struct sluice_writer_options), .shard_size = 4ull << 30 };
		double t0 = now();

		if (sluice_writer_open(&w, dir, f, 1, &opt))
			return 1;
		for (uint64_t i = 0; i < n; i++) {
			int64_t v = (int64_t)i;
			const void *vals[1] = { &v };
			size_t len = 8;

			if (sluice_writer_add(w, vals, &len))
				return 1;
		}
		if (sluice_writer_close(w))
			return 1;
		printf("{\"made\":%llu,\"seconds\":%.2f}\n", (unsigned long long)n, now() - t0);
		return 0;
	}
	if (!strcmp(argv[1], "open")) {
		double *t = calloc(n, sizeof(double));
		int dropped = 1;

		for (uint64_t r = 0; r < n; r++) {
			struct sluice_dataset *ds;
			double t0;

			dropped &= sluice_drop_page_cache();
			t0 = now();
			if (sluice_dataset_open(&ds, dir))
				return 1;
			t[r] = now() - t0;
			if (r == 0)
				printf("{\"records\":%llu,", (unsigned long long)sluice_dataset_count(ds));
			sluice_dataset_close(ds);
		}
		qsort(t, n, sizeof(double), cmp);
		printf("\"cold\":%s,\"open_ms_median\":%.3f,\"open_ms_max\":%.3f}\n", dropped ? "true" : "false",
		       t[n / 2] * 1e3, t[n - 1] * 1e3);
		return 0;
	}
	if (!strcmp(argv[1], "resident")) {
		struct sluice_dataset *ds;
		struct sluice_record_loc loc;
		char ix[4096];
		uint64_t sum = 0, before;

		snprintf(ix, sizeof(ix), "%s/index.sli", dir);
		sluice_drop_page_cache();
		before = resident(ix);
		if (sluice_dataset_open(&ds, dir))
			return 1;
		for (uint64_t i = 0; i < n && i < sluice_dataset_count(ds); i++)
			if (sluice_dataset_locate(ds, i, &loc) == 0)
				sum += loc.length;
		uint64_t after = resident(ix);

		printf("{\"touched\":%llu,\"resident_before\":%llu,\"resident_after\":%llu,\"bytes_per_record\":%.3f,\"check\":%llu}\n",
		       (unsigned long long)n, (unsigned long long)before, (unsigned long long)after,
		       (double)(after - before) / (double)n, (unsigned long long)sum);
		sluice_dataset_close(ds);
		return 0;
	}
	return 2;
}
