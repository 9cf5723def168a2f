/* sluice load: a model checkpoint's tensors into GPU (or host) memory; with --bench, beside a plain read of its bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#define CMD "load"
#define REPS_MAX 100

static const char usage[] =
	"usage: sluice load [--json] [--list] [--host] [--bench [--reps N] [--cold]] CHECKPOINT\n"
	"  CHECKPOINT: a .safetensors file, a directory (its index, else its *.safetensors; or a checkpoint\n"
	"  sluice.dcp wrote), an index, or an s3:// or http(s):// file or index\n"
	"  --list    each tensor: name, dtype, shape, file, bytes\n"
	"  --host    into host memory (default: GPU memory where a GPU is usable)\n"
	"  --bench   N loads (--reps, default 3) each beside a plain read of the same files' tensor bytes,\n"
	"            interleaved; medians and their ratio\n"
	"  --cold    the checkpoint's files evicted from the page cache before each pass (those files\n"
	"            alone, no root needed; where they stay, as on tmpfs, the passes are warm and say why)\n";

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), by_value);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * The plain read: each file's tensor bytes, first to last, as one range into buf, back to back (the same bytes,
 * no plan); with buf NULL, only their total into *total.
 */
static struct sluice_range *plain_ranges(struct sluice_engine *eng, struct sluice_ckpt *ck, void *buf, size_t *n,
					 uint64_t *total)
{
	unsigned nf = sluice_ckpt_files(ck);
	struct sluice_range *r = calloc(nf ? nf : 1, sizeof(*r));
	uint64_t *lo = calloc(nf ? nf : 1, sizeof(*lo)), *hi = calloc(nf ? nf : 1, sizeof(*hi)), at = 0;

	if (!r || !lo || !hi) {
		free(r);
		r = NULL;
	}
	for (unsigned f = 0; r && f < nf; f++)
		lo[f] = UINT64_MAX;
	for (size_t i = 0; r && i < sluice_ckpt_count(ck); i++) {
		const struct sluice_ckpt_tensor *t = sluice_ckpt_tensor(ck, i);

		lo[t->file] = t->offset < lo[t->file] ? t->offset : lo[t->file];
		hi[t->file] = t->offset + t->bytes > hi[t->file] ? t->offset + t->bytes : hi[t->file];
	}
	*n = 0;
	for (unsigned f = 0; r && f < nf; f++) {
		struct sluice_file *fh;

		if (lo[f] >= hi[f])
			continue;
		/* The checkpoint's own open of the file: its handle is not public, so open it again. */
		if (buf && sluice_file_open(&fh, eng, sluice_ckpt_file(ck, f), 0)) {
			free(r);
			r = NULL;
			break;
		}
		if (buf)
			r[(*n)++] = (struct sluice_range){ fh, lo[f], hi[f] - lo[f], (char *)buf + at };
		at += hi[f] - lo[f];
	}
	*total = at;
	free(lo);
	free(hi);
	return r;
}

/* A name from the file, for the terminal: control characters shown as '?'. */
static const char *shown_name(const char *n)
{
	static char out[512];
	size_t i;

	for (i = 0; n[i] && i + 1 < sizeof(out); i++)
		out[i] = (unsigned char)n[i] < 32 || n[i] == 127 ? '?' : n[i];
	out[i] = 0;
	return out;
}

struct opts {
	int json, list, host, bench, cold, reps_given;
	unsigned reps;
	const char *path;
};

/* The options into o: 0, -1 after --help, or the exit code of a usage error. */
static int parse(int argc, char **argv, struct opts *o)
{
	int rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage, stdout);
			return -1;
		} else if (!strcmp(a, "--json")) {
			o->json = 1;
		} else if (!strcmp(a, "--list")) {
			o->list = 1;
		} else if (!strcmp(a, "--host")) {
			o->host = 1;
		} else if (!strcmp(a, "--bench")) {
			o->bench = 1;
		} else if (!strcmp(a, "--cold")) {
			o->cold = 1;
		} else if (!strcmp(a, "--reps")) {
			if (i + 1 >= argc)
				return cli_fail(CMD, "--reps needs a value");
			if ((rc = cli_uint(CMD, "--reps", argv[++i], 1, REPS_MAX, &o->reps)))
				return rc;
			o->reps_given = 1;
		} else if (a[0] == '-' && a[1]) {
			return cli_fail(CMD, "unknown option '%s' (see --help)", a);
		} else if (o->path) {
			return cli_fail(CMD, "one checkpoint, not '%s' and '%s'", cli_shown(o->path), cli_shown(a));
		} else {
			o->path = a;
		}
	}
	if (!o->path)
		return cli_fail(CMD, "no checkpoint given (see --help)");
	if (!o->bench && (o->cold || o->reps_given))
		return cli_fail(CMD, "--reps and --cold go with --bench");
	return 0;
}

/* What the passes measured: each load's and each plain read's seconds; whether the files left the page cache. */
struct passes {
	double load[REPS_MAX], plain[REPS_MAX];
	unsigned n;
	int dropped;     /* --cold: 1 evicted, 2 not all of them */
	char why[512];   /* 2: which stayed, how much, why */
};

/* --cold: the checkpoint's files out of the page cache; 1 when all went, else 2 with r->why. */
static int evict(struct sluice_ckpt *ck, struct passes *r)
{
	unsigned n = sluice_ckpt_files(ck);
	const char **paths = calloc(n ? n : 1, sizeof(*paths));
	int cold;

	for (unsigned i = 0; paths && i < n; i++)
		paths[i] = sluice_ckpt_file(ck, i);
	if (!paths)
		snprintf(r->why, sizeof(r->why), "out of memory");
	cold = paths && cli_evict(paths, n, r->why, sizeof(r->why));
	free(paths);
	return cold ? 1 : 2;
}

/* The loads (with --bench each beside a plain read of plain's ranges), timed into r; 0 or an error. */
static int run(const struct opts *o, struct sluice_engine *eng, struct sluice_ckpt *ck, void *buf, uint64_t size,
	       const struct sluice_range *plain, size_t nplain, struct passes *r)
{
	int rc = 0;

	r->n = o->bench ? o->reps : 1;
	for (unsigned k = 0; !rc && k < r->n; k++) {
		double t0;

		if (o->cold)
			r->dropped = evict(ck, r);
		t0 = now_s();
		rc = sluice_ckpt_load(ck, buf, size, NULL);
		r->load[k] = now_s() - t0;
		if (!rc && o->bench) {
			ssize_t got;

			if (o->cold)
				evict(ck, r);
			t0 = now_s();
			got = sluice_read_batch(eng, plain, nplain, NULL);
			r->plain[k] = now_s() - t0;
			rc = got < 0 ? (int)got : 0;
		}
	}
	return rc;
}

static void print_json(const struct opts *o, struct sluice_ckpt *ck, int gpu, double s, double p, const char *mode,
		       const struct passes *r)
{
	double gb = (double)sluice_ckpt_bytes(ck) / 1e9;

	printf("{\"path\":");
	cli_json_str(cli_shown(o->path));
	printf(",\"format\":\"%s\",\"files\":%u,\"tensors\":%zu,\"bytes\":%llu,\"memory\":\"%s\",\"seconds\":%.6f,"
	       "\"gb_s\":%.3f", sluice_ckpt_format(ck), sluice_ckpt_files(ck), sluice_ckpt_count(ck),
	       (unsigned long long)sluice_ckpt_bytes(ck), gpu ? "gpu" : "host", s, gb / s);
	if (o->bench)
		printf(",\"bench\":{\"reps\":%u,\"pages\":\"%s\",\"plain_seconds\":%.6f,\"plain_gb_s\":%.3f,"
		       "\"ratio\":%.3f", o->reps, mode, p, gb / p, p / s);
	if (o->bench && o->cold) {
		printf(",\"pages_why\":");
		cli_json_str(r->why);
	}
	if (o->bench)
		printf("}");
	if (o->list) {
		printf(",\"list\":[");
		for (size_t i = 0; i < sluice_ckpt_count(ck); i++) {
			const struct sluice_ckpt_tensor *t = sluice_ckpt_tensor(ck, i);

			printf("%s{\"name\":", i ? "," : "");
			cli_json_str(t->name);
			printf(",\"dtype\":\"%s\",\"shape\":[", t->dtype);
			for (unsigned d = 0; d < t->ndim; d++)
				printf("%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
			printf("],\"file\":%u,\"offset\":%llu,\"bytes\":%llu}", t->file, (unsigned long long)t->offset,
			       (unsigned long long)t->bytes);
		}
		printf("]");
	}
	printf("}\n");
}

static void print_text(const struct opts *o, struct sluice_ckpt *ck, int gpu, double s, double p, const char *mode,
		       const struct passes *r)
{
	double gb = (double)sluice_ckpt_bytes(ck) / 1e9;

	for (size_t i = 0; o->list && i < sluice_ckpt_count(ck); i++) {
		const struct sluice_ckpt_tensor *t = sluice_ckpt_tensor(ck, i);

		printf("%-48s %-8s [", shown_name(t->name), t->dtype);
		for (unsigned d = 0; d < t->ndim; d++)
			printf("%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
		printf("]  file %u, %llu bytes\n", t->file, (unsigned long long)t->bytes);
	}
	printf("%s: %s, %zu tensors in %u files, %.2f GB into %s memory in %.3f s (%.2f GB/s%s%s)\n", cli_shown(o->path),
	       sluice_ckpt_format(ck), sluice_ckpt_count(ck), sluice_ckpt_files(ck), gb, gpu ? "GPU" : "host", s, gb / s,
	       o->bench ? ", median, " : "", mode);
	if (o->bench)
		printf("plain read of the same bytes: %.3f s (%.2f GB/s); the load at %.2fx its speed%s%s%s\n", p, gb / p,
		       p / s, r->dropped == 2 ? " (warm: not evicted from the page cache: " : "", r->dropped == 2 ? r->why : "",
		       r->dropped == 2 ? ")" : "");
}

int cmd_load(int argc, char **argv)
{
	struct opts o = { .reps = 3 };
	struct sluice_engine *eng = NULL;
	struct sluice_ckpt *ck = NULL;
	struct sluice_engine_info info;
	struct sluice_range *plain = NULL;
	struct passes r = { .n = 0 };
	size_t nplain = 0;
	void *buf = NULL;
	uint64_t size;
	int rc = parse(argc, argv, &o), gpu;

	if (rc)
		return rc < 0 ? 0 : rc;
	memset(&info, 0, sizeof(info));
	info.size = sizeof(info);
	if ((rc = sluice_engine_open(&eng, NULL)) || (rc = sluice_engine_get_info(eng, &info))) {
		sluice_engine_close(eng);
		return cli_error(CMD, "cannot open engine", rc);
	}
	if ((rc = sluice_ckpt_open(&ck, eng, o.path))) {
		sluice_engine_close(eng);
		return cli_error(CMD, o.path, rc);
	}
	size = sluice_ckpt_load_size(ck);
	if (o.bench) {
		uint64_t total;

		free(plain_ranges(eng, ck, NULL, &nplain, &total));
		size = total > size ? total : size;
	}
	gpu = !o.host && info.gpu >= 0;
	rc = gpu ? sluice_gpu_alloc(eng, size ? size : 1, &buf)
		 : ((buf = aligned_alloc(4096, (size + 4095) / 4096 * 4096 + 4096)) ? 0 : -ENOMEM);
	if (rc) {
		sluice_ckpt_close(ck);
		sluice_engine_close(eng);
		return cli_error(CMD, gpu ? "GPU memory for the load" : "host memory for the load", rc);
	}
	if (o.bench && !(plain = plain_ranges(eng, ck, buf, &nplain, &(uint64_t){ 0 })))
		rc = -ENOMEM;
	if (!rc)
		rc = run(&o, eng, ck, buf, size, plain, nplain, &r);
	if (rc) {
		cli_error(CMD, o.path, rc);
	} else {
		double s = median(r.load, r.n), p = o.bench ? median(r.plain, r.n) : 0;
		const char *mode = !o.bench ? "" : r.dropped == 1 ? "cold" : "warm";

		if (o.json)
			print_json(&o, ck, gpu, s, p, mode, &r);
		else
			print_text(&o, ck, gpu, s, p, mode, &r);
	}
	for (size_t i = 0; i < nplain; i++)
		sluice_file_close(plain[i].file);
	free(plain);
	if (gpu)
		sluice_gpu_free(eng, buf);
	else
		free(buf);
	sluice_ckpt_close(ck);
	sluice_engine_close(eng);
	return rc ? 1 : 0;
}
