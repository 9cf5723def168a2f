/*
 * The settings registry (core.h): every SLUICE_* setting in one table, its
 * type, range, default, scope and help, and where its value comes from.
 * Every variable and settings-file key is read through it and checked by
 * it, with the variable's name and origin in the error.  The environment
 * wins over the settings file; the file over the defaults.
 *
 * SLUICE_CONFIG names the file ("" for none); else it is
 * $XDG_CONFIG_HOME/sluice/sluice.conf or ~/.config/sluice/sluice.conf.
 * One section, [sluice], of keys named as the variables without SLUICE_,
 * in lower case:
 *
 *     [sluice]
 *     threads = 8
 *     max_transfer_size = 4M
 *
 * The file is read once per process, at the first setting asked for; a
 * file that does not parse sets nothing, and its error (file and what is
 * wrong) comes back from every sluice_config_new().
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

/* The engine's settings go through the typed setters, so both refuse the same values. */
#define SL_APPLY(fn, setter, type)                                                \
	static int fn(struct sluice_config *c, uint64_t u, const char *v)         \
	{                                                                         \
		(void)v;                                                          \
		return setter(c, (type)u);                                        \
	}
SL_APPLY(sl_set_backend, sluice_config_set_backend, enum sluice_backend)
SL_APPLY(sl_set_direct, sluice_config_set_direct, enum sluice_direct)
SL_APPLY(sl_set_staging, sluice_config_set_staging, enum sluice_staging)
SL_APPLY(sl_set_threads, sluice_config_set_threads, unsigned)
SL_APPLY(sl_set_qd, sluice_config_set_queue_depth, unsigned)
SL_APPLY(sl_set_mts, sluice_config_set_max_transfer_size, size_t)
SL_APPLY(sl_set_gap, sluice_config_set_read_gap, size_t)
SL_APPLY(sl_set_pool, sluice_config_set_buffer_pool_size, size_t)
SL_APPLY(sl_set_sqpoll, sluice_config_set_sqpoll, int)
SL_APPLY(sl_set_gpu, sluice_config_set_gpu, int)
SL_APPLY(sl_set_p2p, sluice_config_set_enable_p2p, int)
#undef SL_APPLY

/* "0" or "0,1,3": GPU ordinals, each once. */
static int sl_set_devices(struct sluice_config *c, uint64_t u, const char *v)
{
	int ids[SLUICE_MAX_DEVICES];
	unsigned n = 0;

	(void)u;
	for (const char *p = v;;) {
		char *end;
		long id = strtol(p, &end, 10);

		if (*p < '0' || *p > '9' || id > 1023 || n == SLUICE_MAX_DEVICES || (*end && *end != ','))
			return sl__err(SLUICE_EINVAL_CONFIG, "not a list of GPU ordinals such as 0 or 0,1 (at most %d)",
				       SLUICE_MAX_DEVICES);
		ids[n++] = (int)id;
		if (!*end)
			break;
		p = end + 1;
	}
	return sluice_config_set_device_ids(c, ids, n);
}

/* Files are made there later: the directory must be there now, and writable. */
static int sl_check_trace(const char *v)
{
	char dir[4096];
	const char *slash = strrchr(v, '/');

	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - v) + (slash == v) : 1, slash ? v : ".");
	if (access(dir, W_OK) < 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "cannot write in %s: %s", dir, strerror(errno));
	return 0;
}

static int sl_check_absolute(const char *v)
{
	return v[0] == '/' ? 0 : sl__err(SLUICE_EINVAL_CONFIG, "want an absolute path");
}

/*
 * A directory sluice makes files in (and makes, with its parents, where
 * missing): it is one now, or its nearest existing parent is a directory
 * sluice can make it in.  "~/" is the home directory.
 */
static int sl_check_dir(const char *v)
{
	const char *home = getenv("HOME");
	char p[4096];
	struct stat st;
	int n = v[0] == '~' && v[1] == '/' && home ? snprintf(p, sizeof(p), "%s%s", home, v + 1)
						   : snprintf(p, sizeof(p), "%s", v);

	if (n < 0 || (size_t)n >= sizeof(p))
		return sl__err(SLUICE_EINVAL_CONFIG, "a path of at most %zu bytes", sizeof(p) - 1);
	if (!stat(p, &st))
		return S_ISDIR(st.st_mode) ? 0 : sl__err(SLUICE_EINVAL_CONFIG, "%s is not a directory", p);
	for (char *slash;;) {
		if ((slash = strrchr(p, '/')))
			*(slash == p ? slash + 1 : slash) = 0;
		else
			snprintf(p, sizeof(p), "."); /* a relative path's first name: made in the working directory */
		if (!stat(p, &st)) {
			if (!S_ISDIR(st.st_mode))
				return sl__err(SLUICE_EINVAL_CONFIG, "cannot be made: %s is not a directory", p);
			return access(p, W_OK | X_OK) ? sl__err(SLUICE_EINVAL_CONFIG, "cannot be made in %s: %s", p,
								strerror(errno))
						      : 0;
		}
		if (!slash || slash == p)
			break;
	}
	return sl__err(SLUICE_EINVAL_CONFIG, "cannot be made: no parent of it exists");
}

static int sl_check_run_dir(const char *v)
{
	int rc = sl_check_absolute(v);

	return rc ? rc : sl_check_dir(v);
}

/* A metrics port below 1024 is a system service's: 0 (any free port) or 1024-65535. */
static int sl_check_port(const char *v)
{
	uint64_t p = strtoull(v, NULL, 10);

	return p && p < 1024 ? sl__err(SLUICE_EINVAL_CONFIG, "want 0 (a free port) or 1024 to 65535") : 0;
}

#define E SL_SCOPE_ENGINE
#define P SL_SCOPE_PROCESS
#define V SL_SCOPE_ENV
#define KiB(n) ((uint64_t)(n) << 10)
#define MiB(n) ((uint64_t)(n) << 20)
#define GiB(n) ((uint64_t)(n) << 30)

const struct sl__setting_def sl__settings[] = {
	/* The engine (struct sluice_config, each with a typed setter). */
	{ "SLUICE_BACKEND", SL_SET_WORD, E, 0, 0, 0, "auto|uring|psync|gds", "auto",
	  "the store of local files: io_uring, pread/pwrite, or cuFile forced", sl_set_backend, NULL },
	{ "SLUICE_DIRECT", SL_SET_WORD, E, 0, 0, 0, "auto|always|never", "auto",
	  "O_DIRECT or the page cache, per request (auto: by a mincore sample)", sl_set_direct, NULL },
	{ "SLUICE_STAGING", SL_SET_WORD, E, 0, 0, 0, "pinned|pageable", "pinned",
	  "how bytes cross between host and GPU", sl_set_staging, NULL },
	{ "SLUICE_THREADS", SL_SET_UINT, E, 1, 256, 0, NULL, "",
	  "worker threads (default: the CPUs, at most 16)", sl_set_threads, NULL },
	{ "SLUICE_QUEUE_DEPTH", SL_SET_UINT, E, 1, 256, 0, NULL, "4", "bounce slots per worker", sl_set_qd, NULL },
	{ "SLUICE_MAX_TRANSFER_SIZE", SL_SET_SIZE, E, KiB(4), GiB(1), KiB(4), NULL, "4M",
	  "bytes of one storage I/O, and of a bounce slot", sl_set_mts, NULL },
	{ "SLUICE_READ_GAP", SL_SET_SIZE, E, 0, MiB(64), 0, NULL, "64K",
	  "ranges this close are one I/O through the gap, off the page cache (0: only their bytes)", sl_set_gap, NULL },
	{ "SLUICE_BUFFER_POOL_SIZE", SL_SET_SIZE, E, 0, UINT64_MAX, 0, NULL, "",
	  "bytes of all bounce slots (default: threads x queue_depth slots)", sl_set_pool, NULL },
	{ "SLUICE_DEVICE_IDS", SL_SET_LIST, E, 0, 0, 0, NULL, "0", "the GPUs an engine serves, as 0 or 0,1,3",
	  sl_set_devices, NULL },
	{ "SLUICE_SQPOLL", SL_SET_BOOL, E, 0, 1, 0, NULL, "0", "io_uring's kernel submission thread", sl_set_sqpoll,
	  NULL },
	{ "SLUICE_GPU", SL_SET_BOOL, E, 0, 1, 0, NULL, "1", "load CUDA (0: host memory only)", sl_set_gpu, NULL },
	{ "SLUICE_ENABLE_P2P", SL_SET_BOOL, E, 0, 1, 0, NULL, "1", "GPU to GPU copies peer to peer", sl_set_p2p,
	  NULL },
	/* Read where they are used, checked at the first sluice_config_new(). */
	{ "SLUICE_LOG", SL_SET_WORD, P, 0, 0, 0, "error|warn|info|debug", "warn", "what sluice logs to stderr", NULL,
	  NULL },
	{ "SLUICE_PAGECACHE_DMA_MIN", SL_SET_SIZE, P, KiB(4), GiB(1), 0, NULL, "1M",
	  "GPU reads of cached file bytes this long or longer copy by DMA from the page cache itself", NULL, NULL },
	{ "SLUICE_PAGECACHE_DMA_MAX", SL_SET_SIZE, P, 0, GiB(1), 0, NULL, "0",
	  "and this long or shorter (0: never, the default: it measured slower than the bounce slots)", NULL, NULL },
	{ "SLUICE_S3_RETRIES", SL_SET_UINT, P, 0, 20, 0, NULL, "4", "more attempts of a failed S3 request", NULL, NULL },
	{ "SLUICE_S3_PART_SIZE", SL_SET_SIZE, P, MiB(5), GiB(5), 0, NULL, "8M",
	  "bytes of an upload's part, and of a download's chunk", NULL, NULL },
	{ "SLUICE_S3_CONCURRENCY", SL_SET_UINT, P, 1, 256, 0, NULL, "8", "an upload's or download's parts in flight",
	  NULL, NULL },
	{ "SLUICE_HTTP_RECV_MIN", SL_SET_SIZE, P, 0, GiB(1), 0, NULL, "1M",
	  "http(s) and S3 ranged GETs this long are received straight into their destination (0: through curl's buffer)",
	  NULL, NULL },
	{ "SLUICE_HTTP_RETRIES", SL_SET_UINT, P, 0, 20, 0, NULL, "4", "more attempts of a failed http(s) request",
	  NULL, NULL },
	{ "SLUICE_HTTP_LIST_DIRS", SL_SET_UINT, P, 1, UINT32_MAX, 0, NULL, "65536",
	  "directories a recursive listing of an http(s) directory reads at most (its server makes them up)", NULL, NULL },
	{ "SLUICE_HTTP_STALL_TIME", SL_SET_UINT, P, 1, 3600, 0, NULL, "30",
	  "seconds under 1 KiB/s after which an http(s) or S3 transfer is a stall (a timeout, tried again)", NULL, NULL },
	{ "SLUICE_CACHE_DIR", SL_SET_PATH, P, 0, 0, 0, NULL, "~/.cache/sluice",
	  "where s3:// datasets' files are cached", NULL, sl_check_dir },
	{ "SLUICE_CACHE_LIMIT", SL_SET_SIZE, P, 1, UINT64_MAX, 0, NULL, "",
	  "bytes the cache may hold (default: half its file system)", NULL, NULL },
	{ "SLUICE_STATS", SL_SET_SECONDS, P, 0, 86400, 0, NULL, "", "seconds between a loader's log lines (unset: none)",
	  NULL, NULL },
	{ "SLUICE_TRACE", SL_SET_PATH, P, 0, 0, 0, NULL, "", "a loader's Chrome trace file (unset: none)", NULL,
	  sl_check_trace },
	{ "SLUICE_METRICS_PORT", SL_SET_UINT, P, 0, 65535, 0, NULL, "",
	  "serve /metrics for Prometheus on this port from the first engine (0: a free one; unset: none)", NULL,
	  sl_check_port },
	{ "SLUICE_RUN_DIR", SL_SET_PATH, P, 0, 0, 0, NULL, "/dev/shm",
	  "where loaders publish their figures for sluice top", NULL, sl_check_run_dir },
	{ "SLUICE_DECODE", SL_SET_WORD, P, 0, 0, 0, "auto|gpu|cpu", "auto",
	  "where zstd blocks are decoded: whole shards, and a GPU loader's windows", NULL,
	  NULL },
	{ "SLUICE_NVCOMP_LIB", SL_SET_PATH, P, 0, 0, 0, NULL, "libnvcomp.so.6", "the nvCOMP library loaded", NULL,
	  NULL },
	{ "SLUICE_NVJPEG_LIB", SL_SET_PATH, P, 0, 0, 0, NULL, "libnvjpeg.so.13",
	  "the nvJPEG library a GPU loader decodes images with (else the CUDA toolkit's, under CUDA_HOME or /usr/local/cuda)",
	  NULL, NULL },
	{ "SLUICE_NVRTC_LIB", SL_SET_PATH, P, 0, 0, 0, NULL, "libnvrtc.so.13",
	  "the NVRTC library that compiles a GPU loader's image kernels (else the CUDA toolkit's)", NULL, NULL },
	{ "SLUICE_IMAGE_PRODUCERS", SL_SET_UINT, P, 1, 8, 0, NULL, "4",
	  "batches a GPU loader decodes images into at once (each its own stream)", NULL, NULL },
	{ "SLUICE_IMAGE_DECODERS", SL_SET_UINT, P, 1, 8, 0, NULL, "1",
	  "nvJPEG hardware decoders a GPU loader's producers take turns on (more: faster alone, slower training steps)",
	  NULL, NULL },
	{ "SLUICE_MAX_IMAGE_PIXELS", SL_SET_UINT, P, 1, UINT64_MAX, 0, NULL, "89478485",
	  "the most pixels a loader decodes of one image (PIL's bound); a larger one is a corrupt record", NULL, NULL },
	{ "SLUICE_PYTHON", SL_SET_PATH, P, 0, 0, 0, NULL, "python3", "the Python that sluice journey runs", NULL, NULL },
	{ "SLUICE_MAX_RECORD", SL_SET_SIZE, P, KiB(1), GiB(2), 0, NULL, "64M",
	  "the longest record an importer holds whole: a JSON line (sluice pack --from-jsonl)", NULL, NULL },
	/* The environment's only. */
	{ "SLUICE_CONFIG", SL_SET_PATH, V, 0, 0, 0, NULL, "~/.config/sluice/sluice.conf",
	  "the settings file (\"\": none)", NULL, NULL },
	{ "SLUICE_SYSROOT", SL_SET_PATH, V, 0, 0, 0, NULL, "/", "the root /proc and /sys are read under (tests)", NULL,
	  sl_check_absolute },
	{ "SLUICE_LIB", SL_SET_PATH, V, 0, 0, 0, NULL, "", "the libsluice.so the Python package loads", NULL, NULL },
	{ "SLUICE_BIN", SL_SET_PATH, V, 0, 0, 0, NULL, "", "the sluice command the Python package runs", NULL, NULL },
	/* What sluice diagnose tells the script it runs (sluice/diagnose.py). */
	{ "SLUICE_DIAGNOSE_OUT", SL_SET_PATH, V, 0, 0, 0, NULL, "", "sluice diagnose: where the script's report goes",
	  NULL, NULL },
	{ "SLUICE_DIAGNOSE_WORKERS", SL_SET_UINT, V, 0, 1024, 0, NULL, "",
	  "sluice diagnose --sweep-workers: the DataLoaders' worker count for this run", NULL, NULL },
	{ "SLUICE_DIAGNOSE_STEPS", SL_SET_UINT, V, 0, UINT64_MAX, 0, NULL, "",
	  "sluice diagnose --sweep-workers: batches the script takes before it stops", NULL, NULL },
	{ 0 },
};
#define SL_NSETTINGS (sizeof(sl__settings) / sizeof(sl__settings[0]) - 1)

static pthread_once_t sl_once = PTHREAD_ONCE_INIT;
static char sl_path[4096];
static char *sl_vals[SL_NSETTINGS];
static int sl_rc;
static char sl_detail[1024];

/* By its variable's name, or by the settings file's key for it ("threads"). */
static int sl_index(const char *name)
{
	const char *key = strncasecmp(name, "SLUICE_", 7) ? name : name + 7;

	for (unsigned i = 0; i < SL_NSETTINGS; i++)
		if (!strcasecmp(key, sl__settings[i].name + 7))
			return (int)i;
	return -1;
}

const struct sl__setting_def *sl__setting_def(const char *name)
{
	int i = sl_index(name);

	return i < 0 ? NULL : &sl__settings[i];
}

int sluice_settings_path(char *buf, size_t cap)
{
	const char *e = getenv("SLUICE_CONFIG"), *base;
	int n;

	if (e)
		n = *e ? snprintf(buf, cap, "%s", e) : -1;
	else if ((base = getenv("XDG_CONFIG_HOME")) && *base)
		n = snprintf(buf, cap, "%s/sluice/sluice.conf", base);
	else if ((base = getenv("HOME")) && *base)
		n = snprintf(buf, cap, "%s/.config/sluice/sluice.conf", base);
	else
		n = -1;
	if (n < 0)
		return -ENOENT;
	return (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

static int sl_take(const char *section, const char *key, const char *value, void *ctx)
{
	int i = sl_index(key);

	(void)ctx;
	if (strcmp(section, "sluice"))
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: section [%s]: the file has one section, [sluice]", sl_path,
			       section);
	if (i < 0 || sl__settings[i].scope == SL_SCOPE_ENV || !strncasecmp(key, "SLUICE_", 7))
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: '%s' is not a setting of the file (a SLUICE_* variable's name "
			       "without SLUICE_, as threads; sluice info --settings lists them)", sl_path, key);
	free(sl_vals[i]);
	sl_vals[i] = strdup(value);
	return sl_vals[i] ? 0 : -ENOMEM;
}

static void sl_load(void)
{
	if (sluice_settings_path(sl_path, sizeof(sl_path))) {
		sl_path[0] = 0;
		return;
	}
	sl_rc = sl__ini_file(sl_path, sl_take, NULL);
	if (!sl_rc)
		return;
	snprintf(sl_detail, sizeof(sl_detail), "%s", sluice_last_error_detail());
	for (unsigned i = 0; i < SL_NSETTINGS; i++) {
		free(sl_vals[i]);
		sl_vals[i] = NULL;
	}
}

const char *sl__setting(const char *name)
{
	const char *v = getenv(name);
	int i;

	if (v || strncmp(name, "SLUICE_", 7))
		return v;
	pthread_once(&sl_once, sl_load);
	i = sl_index(name);
	return i < 0 ? NULL : sl_vals[i];
}

const char *sl__setting_from(const char *name)
{
	if (getenv(name))
		return "the environment";
	pthread_once(&sl_once, sl_load);
	return sl__setting(name) ? sl_path : "the default";
}

int sl__settings_check(void)
{
	pthread_once(&sl_once, sl_load);
	return sl_rc ? sl__err(sl_rc, "%s", sl_detail) : 0;
}

/* What d takes, for errors: "1 to 256", "one of auto, uring", ... */
static void sl_want(const struct sl__setting_def *d, char *out, size_t cap)
{
	switch (d->type) {
	case SL_SET_WORD:
		snprintf(out, cap, "one of %s", d->words);
		for (char *s = out; (s = strchr(s, '|'));)
			*s = ',';
		break;
	case SL_SET_BOOL:
		snprintf(out, cap, "0 or 1");
		break;
	case SL_SET_UINT:
		snprintf(out, cap, "a whole number in decimal, %llu to %llu", (unsigned long long)d->min,
			 (unsigned long long)d->max);
		break;
	case SL_SET_SIZE:
		if (d->max == UINT64_MAX)
			snprintf(out, cap, "a size such as 64M or 200G%s", d->min ? ", not 0" : "");
		else
			snprintf(out, cap, "a size from %lluK to %lluM%s", (unsigned long long)(d->min >> 10),
				 (unsigned long long)(d->max >> 20), d->step ? ", a multiple of 4K" : "");
		break;
	case SL_SET_SECONDS:
		snprintf(out, cap, "decimal seconds such as 5 or 0.5, 0.001 to %llu", (unsigned long long)d->max);
		break;
	default:
		snprintf(out, cap, "%s", d->help);
	}
}

/* The number v says for d (a word's index, 0/1, a size, a count): 0, or -1 if it is not one d takes. */
static int sl_number(const struct sl__setting_def *d, const char *v, uint64_t *u)
{
	double secs;
	char *end;

	switch (d->type) {
	case SL_SET_WORD:
		for (const char *w = d->words, *bar; w; w = bar ? bar + 1 : NULL) {
			bar = strchr(w, '|');
			if (strlen(v) == (bar ? (size_t)(bar - w) : strlen(w)) && !strncmp(v, w, strlen(v)))
				return 0;
			++*u;
		}
		return -1;
	case SL_SET_UINT:
	case SL_SET_BOOL:
		if (!*v || strspn(v, "0123456789") != strlen(v) || strlen(v) > 19)
			return -1;
		*u = strtoull(v, NULL, 10);
		return *u < d->min || *u > d->max ? -1 : 0;
	case SL_SET_SIZE:
		return sluice_parse_size(v, u) || *u < d->min || *u > d->max || (d->step && *u % d->step) ? -1 : 0;
	case SL_SET_SECONDS:
		/*
		 * Decimal, as every number of the table: digits with one optional fraction ("30", "0.5", ".5").  strtod
		 * alone also took hex ("0x10" was 16 s), exponents, "inf", a sign and leading white space.
		 */
		if (strspn(v, "0123456789.") != strlen(v) || strchr(v, '.') != strrchr(v, '.') || !strpbrk(v, "0123456789"))
			return -1;
		secs = strtod(v, &end);
		if (!*v || *end || !(secs >= 1e-3) || secs > (double)d->max) /* NaN fails too, before any cast */
			return -1;
		*u = (uint64_t)(secs * 1e9);
		return 0;
	default:
		return 0;
	}
}

int sl__setting_parse(const struct sl__setting_def *d, const char *v, const char *from, uint64_t *u)
{
	char want[160], shown[256];

	int ok;

	*u = 0;
	ok = sl_number(d, v, u) == 0;
	if (ok && (!d->check || d->check(v) == 0))
		return 0;
	sl__printable(v, shown, sizeof(shown));
	if (ok) /* the check said why */
		return sl__err(SLUICE_EINVAL_CONFIG, "%s=\"%s\" (%s): %s", d->name, shown, from, sluice_last_error_detail());
	sl_want(d, want, sizeof(want));
	return sl__err(SLUICE_EINVAL_CONFIG, "%s=\"%s\" (%s): want %s", d->name, shown, from, want);
}

int sl__setting_num(const char *name, const char *v, const char *from, uint64_t *out)
{
	const struct sl__setting_def *d = sl__setting_def(name);

	if (!v || !*v) {
		v = d->def;
		from = "the default";
	}
	if (!*v) {
		*out = 0;
		return 1; /* unset, and no default: the caller's to choose */
	}
	return sl__setting_parse(d, v, from, out);
}

int sl__setting_u64(const char *name, uint64_t *out)
{
	return sl__setting_num(name, sl__setting(name), sl__setting_from(name), out);
}

int sl__settings_apply(struct sluice_config *cfg, const struct sl__env *env)
{
	for (unsigned i = 0; i < SL_NSETTINGS; i++) {
		const struct sl__setting_def *d = &sl__settings[i];
		const char *v = env->get(d->name, env->ctx);
		const char *from = env->from ? env->from(d->name, env->ctx) : "the table";
		uint64_t u;
		int rc;

		/* An empty value means unset, but for the engine's own, where "" is no value at all. */
		if (!v || (!*v && d->scope != SL_SCOPE_ENGINE))
			continue;
		if ((rc = sl__setting_parse(d, v, from, &u)))
			return rc;
		if (d->apply && (rc = d->apply(cfg, u, v)))
			return sl__err(rc, "%s=\"%s\" (%s): %s", d->name, v, from, sluice_last_error_detail());
	}
	return 0;
}

static const char *sl_getenv(const char *name, void *ctx)
{
	(void)ctx;
	return sl__setting(name);
}

static const char *sl_from(const char *name, void *ctx)
{
	(void)ctx;
	return sl__setting_from(name);
}

extern char **environ;

/*
 * Once a process, at its first configuration: what would otherwise be
 * dropped without a word.  A SLUICE_* variable the registry does not know
 * (a typo, SLUICE_THREAD=4) is named, but for those of sluice's own tests,
 * benchmarks and scripts; a settings file SLUICE_CONFIG names that is not
 * there reads as none (sluice tune makes it), so that is said too.
 */
static void sl_warn_unread(void)
{
	static const char *const tools[] = { "SLUICE_TEST_", "SLUICE_BENCH_", "SLUICE_DEMO_", "SLUICE_WHEEL",
					     "SLUICE_BUILD_" };
	const char *conf = getenv("SLUICE_CONFIG");

	for (char **e = environ; e && *e; e++) {
		char name[128];
		int known = 0;

		if (strncmp(*e, "SLUICE_", 7))
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)strcspn(*e, "="), *e);
		for (size_t t = 0; t < sizeof(tools) / sizeof(tools[0]); t++)
			known |= !strncmp(*e, tools[t], strlen(tools[t]));
		if (!known && sl_index(name) < 0)
			sl__warn("config", "%s is not a setting of sluice (sluice info --settings lists them): ignored",
				 name);
	}
	if (conf && *conf && access(conf, F_OK) < 0 && errno == ENOENT)
		sl__warn("config", "SLUICE_CONFIG names %s, which is not there: no settings file read", conf);
}

int sluice_config_new(struct sluice_config **out)
{
	static pthread_once_t warned = PTHREAD_ONCE_INIT;

	struct sluice_config *cfg = malloc(sizeof(*cfg));
	int rc;

	*out = NULL;
	if (!cfg)
		return -ENOMEM;
	sl__config_defaults(cfg);
	pthread_once(&warned, sl_warn_unread);
	rc = sl__settings_check();
	if (!rc)
		rc = sl__settings_apply(cfg, &(struct sl__env){ sl_getenv, NULL, sl_from });
	/* The settings file's SLUICE_LOG (the environment's was taken as the library loaded). */
	if (!rc && !getenv("SLUICE_LOG") && sl__setting("SLUICE_LOG")) {
		uint64_t level;

		if (sl__setting_u64("SLUICE_LOG", &level) == 0)
			sl__log_level = (int)level;
	}
	if (rc) {
		free(cfg);
		return rc;
	}
	*out = cfg;
	return 0;
}

int sluice_config_set(struct sluice_config *cfg, const char *name, const char *value)
{
	const struct sl__setting_def *d = name ? sl__setting_def(name) : NULL;
	uint64_t u;
	int rc;

	if (!d)
		return sl__err(SLUICE_EINVAL_CONFIG, "'%s' is not a setting (sluice info --settings lists them)",
			       name ? name : "(null)");
	if (!d->apply)
		return sl__err(SLUICE_EINVAL_CONFIG, "%s is not an engine's setting: it is read from the environment or "
			       "the settings file where it is used", d->name);
	if (!value || (rc = sl__setting_parse(d, value, "sluice_config_set", &u)))
		return value ? rc : sl__err(SLUICE_EINVAL_CONFIG, "%s: no value", d->name);
	if ((rc = d->apply(cfg, u, value)))
		return sl__err(rc, "%s=\"%s\" (sluice_config_set): %s", d->name, value, sluice_last_error_detail());
	return 0;
}

int sluice_setting_get(unsigned i, struct sluice_setting *out)
{
	static const char *const types[] = { "word", "uint", "size", "bool", "seconds", "path", "list" };
	static const char *const scopes[] = { "engine", "process", "environment" };
	const struct sl__setting_def *d;

	if (i >= SL_NSETTINGS)
		return -ENOENT;
	d = &sl__settings[i];
	memset(out, 0, sizeof(*out));
	out->name = d->name;
	out->type = types[d->type];
	out->scope = scopes[d->scope];
	out->words = d->words;
	out->def = d->def;
	out->help = d->help;
	out->value = d->scope == SL_SCOPE_ENV ? getenv(d->name) : sl__setting(d->name);
	out->origin = out->value ? sl__setting_from(d->name) : "the default";
	return 0;
}

const char *sluice_setting(const char *name)
{
	return sl__setting(name);
}

int sluice_settings_write(const char *file, const char *const *names, const char *const *values, unsigned n,
			  const char *note)
{
	char path[4096], keys[16][64], tag[64], dir[4096];
	const char *kp[16];
	size_t tl;
	int rc;

	if (n > 16)
		return sl__err(-EINVAL, "sluice_settings_write: at most 16 settings at once");
	if (file)
		snprintf(path, sizeof(path), "%s", file);
	else if ((rc = sluice_settings_path(path, sizeof(path))))
		return sl__err(rc, "no settings file to write (SLUICE_CONFIG is \"\", or there is no HOME)");
	for (unsigned i = 0; i < n; i++) {
		const struct sl__setting_def *d = sl__setting_def(names[i]);
		uint64_t u;

		if (!d || d->scope == SL_SCOPE_ENV)
			return sl__err(SLUICE_EINVAL_CONFIG, "'%s' is not a setting of the file", names[i]);
		if ((rc = sl__setting_parse(d, values[i], "to be written", &u)))
			return rc;
		snprintf(keys[i], sizeof(keys[i]), "%s", d->name + 7);
		for (char *k = keys[i]; *k; k++)
			*k = (char)(*k >= 'A' && *k <= 'Z' ? *k - 'A' + 'a' : *k);
		kp[i] = keys[i];
	}
	/* Notes of the same writer (the note's first two words) go with the values they described. */
	tl = strcspn(note, " ");
	tl += note[tl] ? 1 + strcspn(note + tl + 1, " ") : 0;
	snprintf(tag, sizeof(tag), "%.*s", (int)tl, note);
	snprintf(dir, sizeof(dir), "%s", path);
	if (strrchr(dir, '/') && strrchr(dir, '/') != dir) {
		*strrchr(dir, '/') = 0;
		if ((rc = sl__mkdirs(dir)))
			return sl__err(rc, "%s: %s", dir, strerror(-rc));
	}
	return sl__ini_update(path, "sluice", kp, values, n, note, tag);
}
