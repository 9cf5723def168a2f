/*
 * sluice bench: throughput, IOPS and latency of file <-> GPU/host
 * transfers, with modes comparable to gdsio's -x and fio's rw=.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CMD "bench"
#define MAX_FILES 1024

struct opts {
	const char *path;
	const char *rw;
	int write, random;
	uint64_t size, io_size;
	unsigned threads, depth, duration, repeat, gpu;
	int target_gpu; /* -1 auto */
	const char *xpath;
	int cold, verify, json;
};

static int usage(FILE *f)
{
	fprintf(f,
		"usage: sluice bench [options] FILE|DIR\n\n"
		"  --rw read|write|randread|randwrite   access pattern (default read);\n"
		"                  write: a durable atomic write of a fresh file per pass\n"
		"                  (the previous pass's file is removed first, untimed)\n"
		"  --size N        bytes per pass (default: the file's size; 1G for write)\n"
		"  --io-size N     bytes per I/O (default 4M, as the engine; 1M for random)\n"
		"  --threads N     worker threads (default min(cpus, 16))\n"
		"  --queue-depth N I/Os in flight per thread (default 4)\n"
		"  --duration S    repeat passes for at least S seconds\n"
		"  --repeat N      passes to run; the median is reported (default 1)\n"
		"  --target gpu|host   destination memory (default gpu when present)\n"
		"  --gpu N         GPU ordinal (default 0)\n"
		"  --path auto|gds|uring|psync|pageable|pagecache\n"
		"                  auto: best available; pageable: storage->pageable host->GPU\n"
		"                  (gdsio -x 2 baseline); pagecache: buffered reads->pinned->GPU (-x 4)\n"
		"  --cold          O_DIRECT, and the files evicted from the page cache before each\n"
		"                  pass (those files alone; no root needed)\n"
		"  --verify        check every byte after the timed passes\n"
		"  --json          one JSON object on stdout\n"
		"Sizes take K, M, G, T suffixes (powers of 1024).\n");
	return f == stderr ? 2 : 0;
}

static int is_valued(const char *a)
{
	static const char *const names[] = { "--rw", "--size", "--io-size", "--threads", "--queue-depth",
					     "--duration", "--repeat", "--gpu", "--target", "--path", NULL };

	for (int i = 0; names[i]; i++)
		if (!strcmp(a, names[i]))
			return 1;
	return 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof(*o));
	o->rw = "read";
	o->target_gpu = -1;
	o->repeat = 1;
	o->xpath = "auto";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc = 0, val = 1;

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return usage(stdout) - 1;
		else if (!strcmp(a, "--cold"))
			o->cold = 1, val = 0;
		else if (!strcmp(a, "--verify"))
			o->verify = 1, val = 0;
		else if (!strcmp(a, "--json"))
			o->json = 1, val = 0;
		else if (a[0] == '-' && !is_valued(a))
			return cli_fail(CMD, "unknown option '%s' (see --help)", a);
		else if (a[0] == '-' && !v)
			return cli_fail(CMD, "%s needs a value", a);
		else if (!strcmp(a, "--rw"))
			o->rw = v;
		else if (!strcmp(a, "--size"))
			rc = cli_size(CMD, a, v, &o->size);
		else if (!strcmp(a, "--io-size"))
			rc = cli_size(CMD, a, v, &o->io_size);
		else if (!strcmp(a, "--threads"))
			rc = cli_uint(CMD, a, v, 1, 256, &o->threads);
		else if (!strcmp(a, "--queue-depth"))
			rc = cli_uint(CMD, a, v, 1, 256, &o->depth);
		else if (!strcmp(a, "--duration"))
			rc = cli_uint(CMD, a, v, 1, 86400, &o->duration);
		else if (!strcmp(a, "--repeat"))
			rc = cli_uint(CMD, a, v, 1, 1000, &o->repeat);
		else if (!strcmp(a, "--gpu"))
			rc = cli_uint(CMD, a, v, 0, 1023, &o->gpu);
		else if (!strcmp(a, "--target")) {
			if (!strcmp(v, "gpu"))
				o->target_gpu = 1;
			else if (!strcmp(v, "host"))
				o->target_gpu = 0;
			else
				return cli_fail(CMD, "--target: '%s' is not gpu or host", v);
		} else if (!strcmp(a, "--path"))
			o->xpath = v;
		else if (o->path)
			return cli_fail(CMD, "more than one FILE|DIR given ('%s', '%s')", o->path, a);
		else
			o->path = a, val = 0;
		if (rc)
			return rc;
		i += val;
	}
	if (!o->path)
		return cli_fail(CMD, "no FILE or DIR given (see --help)");
	if (!strcmp(o->rw, "read") || !strcmp(o->rw, "randread"))
		o->write = 0;
	else if (!strcmp(o->rw, "write") || !strcmp(o->rw, "randwrite"))
		o->write = 1;
	else
		return cli_fail(CMD, "--rw: '%s' is not read, write, randread or randwrite", o->rw);
	o->random = !strncmp(o->rw, "rand", 4);
	if (!o->io_size)
		o->io_size = o->random ? 1u << 20 : 4u << 20;
	if (o->io_size % 4096 || o->io_size > (1u << 30))
		return cli_fail(CMD, "--io-size: %llu is not a multiple of 4K up to 1G",
				(unsigned long long)o->io_size);
	return 0;
}

static int configure(const struct opts *o, struct sluice_config *cfg)
{
	int rc = sluice_config_set_max_transfer_size(cfg, o->io_size);

	if (!rc && o->threads)
		rc = sluice_config_set_threads(cfg, o->threads);
	if (!rc && o->depth)
		rc = sluice_config_set_queue_depth(cfg, o->depth);
	if (!rc)
		rc = sluice_config_set_device(cfg, (int)o->gpu);
	if (!rc && o->target_gpu == 0)
		rc = sluice_config_set_gpu(cfg, 0);
	if (!rc && o->cold)
		rc = sluice_config_set_direct(cfg, SLUICE_DIRECT_ALWAYS);
	if (rc)
		return rc;
	if (!strcmp(o->xpath, "auto"))
		return 0;
	if (!strcmp(o->xpath, "gds"))
		return sluice_config_set_backend(cfg, SLUICE_BACKEND_GDS);
	if (!strcmp(o->xpath, "uring"))
		return sluice_config_set_backend(cfg, SLUICE_BACKEND_URING);
	if (!strcmp(o->xpath, "psync"))
		return sluice_config_set_backend(cfg, SLUICE_BACKEND_PSYNC);
	if (!strcmp(o->xpath, "pageable"))
		return sluice_config_set_staging(cfg, SLUICE_STAGING_PAGEABLE);
	if (!strcmp(o->xpath, "pagecache"))
		return o->cold ? SLUICE_EINVAL_CONFIG : sluice_config_set_direct(cfg, SLUICE_DIRECT_NEVER);
	return SLUICE_EINVAL_CONFIG;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       (double)ru.ru_stime.tv_usec / 1e6;
}

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: fast, and good enough to place I/Os and fill buffers. */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Collects the regular files of a directory (or the one file). */
static int list_files(const struct opts *o, char ***names, unsigned *n)
{
	unsigned kind = 0;
	struct stat st;
	DIR *d;
	struct dirent *e;

	*n = 0;
	*names = calloc(MAX_FILES, sizeof(char *));
	if (!*names)
		return cli_fail(CMD, "out of memory");
	/* A remote file (s3://, http(s)://): one "file", read with ranged GETs (no listing of prefixes yet). */
	if (sluice_path_store(o->path, &kind), !(kind & SLUICE_STORE_LOCAL)) {
		if (o->verify)
			return cli_fail(CMD, "--verify compares with the kernel's read of the file; %s is a URL", cli_shown(o->path));
		(*names)[(*n)++] = strdup(o->path);
		return 0;
	}
	if (stat(o->path, &st) < 0) {
		if (o->write && errno == ENOENT) {
			(*names)[(*n)++] = strdup(o->path);
			return 0;
		}
		return cli_failed(CMD, 2, -errno, "%s: %s", o->path, strerror(errno));
	}
	if (!S_ISDIR(st.st_mode)) {
		/* Nothing to read measures nothing (its figures were 0 bytes over 0 s: "inf" in the JSON). */
		if (!o->write && S_ISREG(st.st_mode) && !st.st_size)
			return cli_failed(CMD, 2, -EINVAL, "%s is empty: nothing to read", o->path);
		(*names)[(*n)++] = strdup(o->path);
		return 0;
	}
	if (o->write) {
		if (asprintf(&(*names)[0], "%s/sluice-bench.dat", o->path) < 0)
			return cli_fail(CMD, "out of memory");
		*n = 1;
		return 0;
	}
	d = opendir(o->path);
	if (!d)
		return cli_failed(CMD, 2, -errno, "%s: %s", o->path, strerror(errno));
	while ((e = readdir(d)) && *n < MAX_FILES) {
		char *p;

		if (e->d_name[0] == '.' || asprintf(&p, "%s/%s", o->path, e->d_name) < 0)
			continue;
		if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
			(*names)[(*n)++] = p;
		else
			free(p);
	}
	closedir(d);
	if (!*n)
		return cli_fail(CMD, "%s: no non-empty regular files to read", o->path);
	return 0;
}

struct run {
	double seconds, cpu;
	struct sluice_xfer_report rep;
};

/* One benchmark's state, from the options to the report. */
struct bench {
	struct opts o;
	struct sluice_config *cfg;
	struct sluice_engine *eng;
	struct sluice_engine_info info;
	struct sluice_file *files[MAX_FILES];
	struct sluice_range *ranges;
	struct run *runs;
	char **names;
	unsigned nfiles, nf_open, nruns;
	uint64_t total, nranges, seed;
	char *mem, *host;
	int gpu, dropped;       /* --cold: the last pass's files all left the page cache */
	char cold_why[512];     /* where one did not: which, how much stayed, why */
};

/* The engine as the options ask, its files open, and the bytes one pass moves; 0 or the exit code. */
static int bench_open(struct bench *b)
{
	struct opts *o = &b->o;
	uint64_t all = 0;
	int rc = sluice_config_new(&b->cfg);

	if (o->target_gpu == 1 && sluice_gpu_count() == 0)
		return cli_fail(CMD, "--target gpu: no CUDA GPU on this machine");
	if (!rc)
		rc = configure(o, b->cfg);
	if (rc)
		return rc == SLUICE_EINVAL_CONFIG && !*sluice_last_error_detail()
			       ? cli_fail(CMD, "--path: '%s' is not auto, gds, uring, psync, pageable or pagecache%s", o->xpath,
					  o->cold ? " (pagecache cannot be --cold)" : "")
			       : cli_error(CMD, "bad configuration", rc);
	if ((rc = sluice_engine_open(&b->eng, b->cfg)))
		return cli_error(CMD, o->target_gpu == 1 ? "--target gpu" : "cannot open engine", rc);
	b->info.size = sizeof(b->info);
	if ((rc = sluice_engine_get_info(b->eng, &b->info)))
		return cli_error(CMD, "engine", rc);
	b->gpu = o->target_gpu != 0 && b->info.gpu >= 0;
	if (o->target_gpu == 1 && !b->gpu)
		return cli_fail(CMD, "--target gpu: no usable GPU");
	for (unsigned i = 0; i < b->nfiles; i++, b->nf_open++)
		if ((rc = sluice_file_open(&b->files[i], b->eng, b->names[i],
					   o->write ? SLUICE_RDWR | SLUICE_CREATE : SLUICE_RDONLY)))
			return cli_error(CMD, b->names[i], rc);
	for (unsigned i = 0; i < b->nfiles; i++)
		all += sluice_file_size(b->files[i]);
	b->total = o->write ? (o->size ? o->size : 1ull << 30) : o->size ? o->size : all;
	if (o->write && o->random && sluice_file_size(b->files[0]) < b->total)
		return cli_fail(CMD, "--rw randwrite: %s is %llu bytes, smaller than --size %llu (write it sequentially first)",
				b->names[0], (unsigned long long)sluice_file_size(b->files[0]), (unsigned long long)b->total);
	if (!o->write && o->size > all)
		return cli_fail(CMD, "--size %llu exceeds %s (%llu bytes)", (unsigned long long)o->size, o->path,
				(unsigned long long)all);
	if (b->total < o->io_size && o->random)
		return cli_fail(CMD, "--size %llu is smaller than --io-size %llu", (unsigned long long)b->total,
				(unsigned long long)o->io_size);
	return 0;
}

/* Random I/Os touch each block of the first file once, in a shuffled order (fio's random map). */
static int bench_random(struct bench *b)
{
	uint64_t slots = sluice_file_size(b->files[0]) / b->o.io_size;
	uint64_t *perm = malloc((slots ? slots : 1) * sizeof(*perm));

	if (!perm)
		return cli_fail(CMD, "out of memory for %llu blocks", (unsigned long long)slots);
	for (uint64_t i = 0; i < slots; i++)
		perm[i] = i;
	for (uint64_t i = slots ? slots - 1 : 0; i > 0; i--) {
		uint64_t j = rng_next(&b->seed) % (i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (uint64_t i = 0; i < b->nranges; i++)
		b->ranges[i] = (struct sluice_range){ b->files[0], perm[i] * b->o.io_size, b->o.io_size,
						      b->mem + i * b->o.io_size };
	free(perm);
	return 0;
}

/* Sequential I/Os of io_size, cut at file ends, file after file, until a pass's bytes. */
static uint64_t bench_sequential(struct bench *b, int fill)
{
	uint64_t left = b->total, pos = 0, k = 0;

	for (unsigned i = 0; i < b->nfiles && left; i++) {
		uint64_t sz = b->o.write ? b->total : sluice_file_size(b->files[i]);

		for (uint64_t off = 0; off < sz && left; k++) {
			size_t len = (size_t)(sz - off < b->o.io_size ? sz - off : b->o.io_size);

			if (len > left)
				len = (size_t)left;
			if (fill)
				b->ranges[k] = (struct sluice_range){ b->files[i], off, len, b->mem + pos };
			off += len;
			pos += len;
			left -= len;
		}
	}
	return k;
}

/* The destination (or source) memory, faulted in; for writes, random bytes, not zeros. */
static int bench_memory(struct bench *b)
{
	size_t blk = 64u << 20;
	int rc;

	if (b->gpu && (rc = sluice_gpu_alloc(b->eng, b->total, (void **)&b->mem)))
		return cli_error(CMD, "allocating GPU memory", rc);
	if (!b->gpu && posix_memalign((void **)&b->mem, 4096, b->total))
		return cli_fail(CMD, "out of memory for %llu bytes", (unsigned long long)b->total);
	if (!b->gpu)
		memset(b->mem, 0, b->total); /* the pages faulted in now, untimed, as fio's buffers are */
	if (!b->o.write)
		return 0;
	if (!(b->host = malloc(blk)))
		return cli_fail(CMD, "out of memory");
	for (uint64_t off = 0; off < b->total; off += blk) {
		size_t n = b->total - off < blk ? (size_t)(b->total - off) : blk;

		for (size_t k = 0; k + 8 <= n; k += 8) {
			uint64_t r = rng_next(&b->seed);

			memcpy(b->host + k, &r, 8);
		}
		if ((rc = sluice_gpu_copy(b->eng, b->mem + off, b->host, n)))
			return cli_error(CMD, "filling the source buffer", rc);
	}
	return 0;
}

/* The I/O list and its memory. */
static int bench_plan(struct bench *b)
{
	b->nranges = b->o.random ? b->total / b->o.io_size : bench_sequential(b, 0);
	b->ranges = calloc(b->nranges ? b->nranges : 1, sizeof(*b->ranges));
	b->runs = calloc(b->o.repeat + 1024, sizeof(*b->runs));
	if (!b->ranges || !b->runs)
		return cli_fail(CMD, "out of memory for %llu I/Os", (unsigned long long)b->nranges);
	if (bench_memory(b))
		return 1;
	if (b->o.random)
		return bench_random(b);
	bench_sequential(b, 1);
	return 0;
}

/* One timed pass into r; the bytes moved or an error. */
static ssize_t bench_pass(struct bench *b, struct run *r)
{
	const struct opts *o = &b->o;
	double t0, c0;
	ssize_t n;
	int sync;

	/*
	 * Each sequential write pass creates the file afresh, as fio does:
	 * removing the previous pass's file (untimed) keeps the cost of
	 * freeing its blocks out of this pass.
	 */
	if (o->write && !o->random)
		unlink(b->names[0]);
	if (o->cold)
		b->dropped = cli_evict((const char *const *)b->names, b->nfiles, b->cold_why, sizeof(b->cold_why));
	sluice_engine_stats_reset(b->eng);
	r->rep.size = sizeof(r->rep);
	c0 = cpu_s();
	t0 = now_s();
	if (o->write && !o->random) {
		n = sluice_write_from_gpu(b->eng, b->names[0], b->mem, b->total, &r->rep);
	} else if (o->write) {
		n = sluice_write_batch(b->eng, b->ranges, b->nranges, &r->rep);
		if (n >= 0 && (sync = sluice_file_sync(b->files[0])) != 0)
			n = sync;
	} else {
		n = sluice_read_batch(b->eng, b->ranges, b->nranges, &r->rep);
	}
	r->seconds = now_s() - t0;
	r->cpu = cpu_s() - c0;
	return n;
}

/* Every byte compared with what the kernel returns through the page cache; 0, or 1 at the first mismatch. */
static int bench_verify(struct bench *b)
{
	size_t blk = 64u << 20;
	char *x = malloc(blk), *y = malloc(blk);
	int bad = !x || !y;

	if (bad)
		cli_failed(CMD, 1, -ENOMEM, "--verify: out of memory");
	for (uint64_t i = 0; i < b->nranges && !bad; i++) {
		struct sluice_range *r = &b->ranges[i];
		int fd = -1;

		for (unsigned k = 0; k < b->nfiles; k++)
			if (b->files[k] == r->file)
				fd = open(b->names[k], O_RDONLY);
		/* A check that could not run is a failed check, never a silent pass. */
		if (fd < 0) {
			bad = cli_failed(CMD, 1, -errno, "--verify: cannot reopen the file of I/O %llu: %s", (unsigned long long)i,
					 strerror(errno));
			break;
		}
		for (size_t done = 0; done < r->len && !bad;) {
			size_t n = r->len - done < blk ? r->len - done : blk;

			bad = pread(fd, x, n, (off_t)(r->offset + done)) != (ssize_t)n ||
			      sluice_gpu_copy(b->eng, y, (char *)r->buf + done, n) || memcmp(x, y, n);
			done += n;
		}
		close(fd);
		if (bad)
			cli_failed(CMD, 1, SLUICE_EVERIFY, "--verify: mismatch in I/O %llu (offset %llu, %zu bytes)",
				   (unsigned long long)i, (unsigned long long)r->offset, r->len);
	}
	free(x);
	free(y);
	return bad;
}

/* The median pass, as JSON or as lines. */
static void bench_report(struct bench *b)
{
	const struct opts *o = &b->o;
	const struct sluice_engine_info *in = &b->info;
	struct sluice_stats st = SLUICE_STATS_INIT;
	struct run *med = &b->runs[0];
	double *secs = calloc(b->nruns, sizeof(double)), gb = (double)b->total / 1e9;

	for (unsigned i = 0; secs && i < b->nruns; i++)
		secs[i] = b->runs[i].seconds;
	if (secs)
		qsort(secs, b->nruns, sizeof(double), cmp_double);
	for (unsigned i = 0; secs && i < b->nruns; i++)
		if (b->runs[i].seconds == secs[b->nruns / 2])
			med = &b->runs[i];
	free(secs);
	if (sluice_engine_stats(b->eng, &st)) /* of the last pass */
		fprintf(stderr, "sluice %s: no latency figures: %s\n", CMD, sluice_last_error_detail());
	if (o->json) {
		printf("{\"rw\":\"%s\",\"target\":\"%s\",\"files\":%u,\"bytes\":%llu,\"io_size\":%llu,"
		       "\"threads\":%u,\"queue_depth\":%u,\"backend\":\"%s\",\"path\":",
		       o->rw, b->gpu ? "gpu" : "host", b->nfiles, (unsigned long long)b->total,
		       (unsigned long long)o->io_size, in->threads, in->queue_depth, in->backend);
		cli_json_str(med->rep.path);
		if (o->cold) {
			printf(",\"page_cache_why\":");
			cli_json_str(b->cold_why);
		}
		printf(",\"cold\":%d,\"page_cache_dropped\":%d,\"passes\":%u,\"seconds\":%.6f,"
		       "\"gb_s\":%.3f,\"gib_s\":%.3f,\"iops\":%.1f,\"cpu_s_per_gb\":%.4f,"
		       "\"lat_us\":{\"avg\":%.1f,\"p50\":%.1f,\"p99\":%.1f,\"p999\":%.1f,\"max\":%.1f},"
		       "\"verified\":%s,\"gb_s_passes\":[",
		       o->cold, b->dropped, b->nruns, med->seconds, gb / med->seconds,
		       (double)b->total / (1u << 30) / med->seconds, (double)b->nranges / med->seconds,
		       med->cpu / gb, st.lat_avg_us, st.lat_p50_us, st.lat_p99_us, st.lat_p999_us,
		       st.lat_max_us, o->verify ? "true" : "false");
		for (unsigned i = 0; i < b->nruns; i++)
			printf("%s%.3f", i ? "," : "", gb / b->runs[i].seconds);
		printf("]}\n");
		return;
	}
	printf("sluice bench: %s %s, %u file(s), %.3f GB in %llu I/Os of %llu bytes, %u thread(s) x qd %u\n",
	       o->rw, b->gpu ? "-> GPU" : "-> host", b->nfiles, gb, (unsigned long long)b->nranges,
	       (unsigned long long)o->io_size, in->threads, in->queue_depth);
	printf("  path       %s (backend %s%s)\n", med->rep.path, in->backend, in->gds ? ", GDS" : "");
	printf("  throughput %.3f GB/s  %.3f GiB/s  (median of %u pass%s)\n", gb / med->seconds,
	       (double)b->total / (1u << 30) / med->seconds, b->nruns, b->nruns == 1 ? "" : "es");
	printf("  IOPS       %.1f\n", (double)b->nranges / med->seconds);
	printf("  latency    avg %.1f us  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n", st.lat_avg_us,
	       st.lat_p50_us, st.lat_p99_us, st.lat_p999_us, st.lat_max_us);
	printf("  CPU        %.4f s per GB\n", med->cpu / gb);
	if (o->cold)
		printf("  cold       O_DIRECT; %s%s\n", b->dropped ? "the files evicted from the page cache" :
			"NOT all evicted from the page cache: ", b->dropped ? "" : b->cold_why);
	if (o->verify)
		printf("  verify     every byte matches\n");
}

static void bench_free(struct bench *b)
{
	if (b->mem && b->eng && sluice_is_gpu_ptr(b->eng, b->mem))
		sluice_gpu_free(b->eng, b->mem);
	else
		free(b->mem);
	free(b->host);
	free(b->ranges);
	free(b->runs);
	for (unsigned i = 0; i < b->nf_open; i++)
		sluice_file_close(b->files[i]);
	sluice_engine_close(b->eng);
	sluice_config_free(b->cfg);
	for (unsigned i = 0; b->names && i < b->nfiles; i++)
		free(b->names[i]);
	free(b->names);
}

int cmd_bench(int argc, char **argv)
{
	struct bench b = { .seed = 0x5eed };
	double t_start;
	int rc = parse(argc, argv, &b.o);

	if (rc)
		return rc < 0 ? 0 : rc;
	if (!(rc = list_files(&b.o, &b.names, &b.nfiles)) && !(rc = bench_open(&b)) && !(rc = bench_plan(&b))) {
		t_start = now_s();
		do {
			ssize_t n = bench_pass(&b, &b.runs[b.nruns]);

			if (n < 0)
				rc = cli_error(CMD, b.o.write ? "write failed" : "read failed", (long)n);
			b.nruns += n >= 0;
		} while (!rc && b.nruns < b.o.repeat + 1023 &&
			 (b.nruns < b.o.repeat || (b.o.duration && now_s() - t_start < b.o.duration)));
	}
	if (!rc && b.o.verify)
		rc = bench_verify(&b);
	if (!rc)
		bench_report(&b);
	bench_free(&b);
	return rc;
}
