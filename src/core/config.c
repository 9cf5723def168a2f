/*
 * Configuration: defaults, SLUICE_* settings (environment, then the settings file), setters.
 * Every setter validates, and the environment goes through the setters so
 * both reject the same values.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

int sluice_parse_size(const char *s, uint64_t *out)
{
	uint64_t v = 0, mul = 1;
	const char *p = s;

	if (!s || *s < '0' || *s > '9')
		return SLUICE_EINVAL_CONFIG;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (UINT64_MAX - 9) / 10)
			return SLUICE_EINVAL_CONFIG;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	switch (*p) {
	case 'k': case 'K': mul = 1ull << 10; p++; break;
	case 'm': case 'M': mul = 1ull << 20; p++; break;
	case 'g': case 'G': mul = 1ull << 30; p++; break;
	case 't': case 'T': mul = 1ull << 40; p++; break;
	default: break;
	}
	if (mul > 1 && *p == 'i')
		p++;
	if (*p == 'B' || *p == 'b')
		p++;
	if (*p)
		return SLUICE_EINVAL_CONFIG;
	if (v && mul > UINT64_MAX / v)
		return SLUICE_EINVAL_CONFIG;
	*out = v * mul;
	return 0;
}

void sl__config_defaults(struct sluice_config *cfg)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	memset(cfg, 0, sizeof(*cfg));
	cfg->backend = SLUICE_BACKEND_AUTO;
	cfg->direct = SLUICE_DIRECT_AUTO;
	cfg->staging = SLUICE_STAGING_PINNED;
	cfg->threads = cpus < 1 ? 1 : cpus > 12 ? 12 : (unsigned)cpus;
	cfg->queue_depth = 4;
	cfg->max_transfer_size = 4u << 20;
	cfg->gpu = 1;
	cfg->ndevices = 1;
	cfg->enable_p2p = 1;
}

int sluice_config_set_backend(struct sluice_config *cfg, enum sluice_backend b)
{
	if (b < SLUICE_BACKEND_AUTO || b > SLUICE_BACKEND_GDS)
		return sl__err(SLUICE_EINVAL_CONFIG, "backend %d is not one of auto, uring, psync, gds", b);
	cfg->backend = b;
	return 0;
}

int sluice_config_set_direct(struct sluice_config *cfg, enum sluice_direct d)
{
	if (d < SLUICE_DIRECT_AUTO || d > SLUICE_DIRECT_NEVER)
		return sl__err(SLUICE_EINVAL_CONFIG, "direct policy %d is not one of auto, always, never", d);
	cfg->direct = d;
	return 0;
}

int sluice_config_set_staging(struct sluice_config *cfg, enum sluice_staging s)
{
	if (s < SLUICE_STAGING_PINNED || s > SLUICE_STAGING_PAGEABLE)
		return sl__err(SLUICE_EINVAL_CONFIG, "staging %d is not one of pinned, pageable", s);
	cfg->staging = s;
	return 0;
}

int sluice_config_set_threads(struct sluice_config *cfg, unsigned n)
{
	if (n < 1 || n > 256)
		return sl__err(SLUICE_EINVAL_CONFIG, "threads %u is outside 1..256", n);
	cfg->threads = n;
	return 0;
}

int sluice_config_set_queue_depth(struct sluice_config *cfg, unsigned n)
{
	if (n < 1 || n > 256)
		return sl__err(SLUICE_EINVAL_CONFIG, "queue_depth %u is outside 1..256", n);
	cfg->queue_depth = n;
	return 0;
}

int sluice_config_set_max_transfer_size(struct sluice_config *cfg, size_t n)
{
	if (n < SL_ALIGN || n > (1u << 30) || n % SL_ALIGN)
		return sl__err(SLUICE_EINVAL_CONFIG,
			       "max_transfer_size %zu is not a multiple of 4 KiB in 4 KiB..1 GiB", n);
	cfg->max_transfer_size = n;
	return 0;
}

int sluice_config_set_buffer_pool_size(struct sluice_config *cfg, size_t n)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

	/* The pool is pinned host memory: more than the machine has cannot be meant. */
	if (pages > 0 && page > 0 && n > (uint64_t)pages * (uint64_t)page)
		return sl__err(SLUICE_EINVAL_CONFIG, "buffer_pool_size %zu bytes is more than this machine's memory (%llu)", n,
			       (unsigned long long)pages * (unsigned long long)page);
	cfg->buffer_pool_size = n;
	return 0;
}

int sluice_config_set_device(struct sluice_config *cfg, int gpu)
{
	return sluice_config_set_device_ids(cfg, &gpu, 1);
}

int sluice_config_set_device_ids(struct sluice_config *cfg, const int *ids, unsigned n)
{
	if (n < 1 || n > SLUICE_MAX_DEVICES)
		return sl__err(SLUICE_EINVAL_CONFIG, "%u device ids: want 1 to %d", n, SLUICE_MAX_DEVICES);
	for (unsigned i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] > 1023)
			return sl__err(SLUICE_EINVAL_CONFIG, "device id %d is outside 0..1023", ids[i]);
		for (unsigned j = 0; j < i; j++)
			if (ids[j] == ids[i])
				return sl__err(SLUICE_EINVAL_CONFIG, "device id %d is listed twice", ids[i]);
	}
	memcpy(cfg->devices, ids, n * sizeof(*ids));
	cfg->ndevices = n;
	cfg->device = ids[0];
	return 0;
}


int sluice_config_set_enable_p2p(struct sluice_config *cfg, int on)
{
	cfg->enable_p2p = !!on;
	return 0;
}

int sluice_config_set_sqpoll(struct sluice_config *cfg, int on)
{
	cfg->sqpoll = !!on;
	return 0;
}

int sluice_config_set_gpu(struct sluice_config *cfg, int on)
{
	cfg->gpu = !!on;
	return 0;
}

/* Looks name up in a NULL-terminated word list; -1 if absent. */
static int sl_word(const char *v, const char *const *words)
{
	for (int i = 0; words[i]; i++)
		if (!strcmp(v, words[i]))
			return i;
	return -1;
}

static const char *sl_getenv(const char *name, void *ctx)
{
	(void)ctx;
	return sl__setting(name);
}

/* Where a value came from, for errors: the environment, the settings file, or a test's table. */
static const char *sl_from(const struct sl__env *env, const char *name)
{
	return env->get == sl_getenv ? sl__setting_from(name) : "the table";
}

static int sl_env_uint(const struct sl__env *env, const char *name, uint64_t max, uint64_t *out)
{
	const char *v = env->get(name, env->ctx);

	if (!v)
		return 1;
	if (sluice_parse_size(v, out) || *out > max)
		return sl__err(SLUICE_EINVAL_CONFIG, "%s=\"%s\" (%s) is not a valid number", name, v, sl_from(env, name));
	return 0;
}

static int sl_env_word(const struct sl__env *env, const char *name, const char *const *words, int *out)
{
	const char *v = env->get(name, env->ctx);

	if (!v)
		return 1;
	*out = sl_word(v, words);
	if (*out < 0) {
		char list[256] = "";

		for (int i = 0; words[i]; i++)
			snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "", words[i]);
		return sl__err(SLUICE_EINVAL_CONFIG, "%s=\"%s\" (%s): want one of %s", name, v, sl_from(env, name), list);
	}
	return 0;
}

/* SLUICE_DEVICE_IDS: "0" or "0,1,3"; 1 when unset. */
static int sl_env_devices(const struct sl__env *env, struct sluice_config *cfg)
{
	const char *v = env->get("SLUICE_DEVICE_IDS", env->ctx), *p;
	int ids[SLUICE_MAX_DEVICES];
	unsigned n = 0;

	if (!v)
		return 1;
	for (p = v;;) {
		char *end;
		long id = strtol(p, &end, 10);

		if (end == p || id < 0 || id > 1023 || n == SLUICE_MAX_DEVICES || (*end && *end != ','))
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_DEVICE_IDS=\"%s\" (%s) is not a list of GPU ordinals "
				       "such as 0 or 0,1 (at most %d)", v, sl_from(env, "SLUICE_DEVICE_IDS"),
				       SLUICE_MAX_DEVICES);
		ids[n++] = (int)id;
		if (!*end)
			break;
		p = end + 1;
	}
	if (sluice_config_set_device_ids(cfg, ids, n))
		return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_DEVICE_IDS=\"%s\" (%s): %s", v, sl_from(env, "SLUICE_DEVICE_IDS"),
			       sluice_last_error_detail());
	return 0;
}

/*
 * The settings read where they are used (not the engine's): checked here
 * too, so that a bad one is named at the first sluice_config_new() rather
 * than taken silently (SLUICE_LOG=bogus) or met late.
 */
static int sl_env_others(const struct sl__env *env)
{
	static const char *const levels[] = { "error", "warn", "info", "debug", NULL };
	static const char *const decoders[] = { "auto", "gpu", "cpu", NULL };
	const char *v;
	char *end = NULL;
	uint64_t u;
	int w, r;

	if ((r = sl_env_word(env, "SLUICE_LOG", levels, &w)) < 0 || (r = sl_env_word(env, "SLUICE_DECODE", decoders, &w)) < 0)
		return r;
	if ((v = env->get("SLUICE_STATS", env->ctx)) && *v) {
		double secs = strtod(v, &end);

		if (*end || !(secs > 0) || secs > 86400)
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_STATS=\"%s\" (%s): want seconds between loader log lines, "
				       "0.001 to 86400", v, sl_from(env, "SLUICE_STATS"));
	}
	/* A metrics port below 1024 is a system service's: 0 (any free port) or 1024-65535. */
	if ((v = env->get("SLUICE_METRICS_PORT", env->ctx)) && *v &&
	    (sluice_parse_size(v, &u) || (u && u < 1024) || u > 65535 || strspn(v, "0123456789") != strlen(v)))
		return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_METRICS_PORT=\"%s\" (%s): want 0 (a free port) or 1024 to 65535",
			       v, sl_from(env, "SLUICE_METRICS_PORT"));
	if ((v = env->get("SLUICE_CACHE_LIMIT", env->ctx)) && *v && (sluice_parse_size(v, &u) || !u))
		return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_CACHE_LIMIT=\"%s\" (%s): want a size such as 200G", v,
			       sl_from(env, "SLUICE_CACHE_LIMIT"));
	/* Files are made there later: the directory must be there now, and writable. */
	if ((v = env->get("SLUICE_TRACE", env->ctx)) && *v) {
		char dir[4096];
		const char *slash = strrchr(v, '/');

		snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - v) + (slash == v) : 1, slash ? v : ".");
		if (access(dir, W_OK) < 0)
			return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_TRACE=\"%s\" (%s): cannot write in %s: %s", v,
				       sl_from(env, "SLUICE_TRACE"), dir, strerror(errno));
	}
	if ((v = env->get("SLUICE_RUN_DIR", env->ctx)) && *v && v[0] != '/')
		return sl__err(SLUICE_EINVAL_CONFIG, "SLUICE_RUN_DIR=\"%s\" (%s): want an absolute path", v,
			       sl_from(env, "SLUICE_RUN_DIR"));
	return 0;
}

int sl__config_apply_env(struct sluice_config *cfg, const struct sl__env *env)
{
	static const char *const backends[] = { "auto", "uring", "psync", "gds", NULL };
	static const char *const directs[] = { "auto", "always", "never", NULL };
	static const char *const stagings[] = { "pinned", "pageable", NULL };
	uint64_t u;
	int w, r;

#define SL_APPLY(call)                                                  \
	do {                                                            \
		int rc_ = (call);                                       \
		if (rc_)                                                \
			return rc_;                                     \
	} while (0)
#define SL_ENV_UINT(name, max, setter)                                  \
	do {                                                            \
		r = sl_env_uint(env, name, max, &u);                    \
		if (r < 0)                                              \
			return r;                                       \
		if (r == 0 && setter(cfg, u))                           \
			return sl__err(SLUICE_EINVAL_CONFIG, "%s=%s (%s): %s", name, env->get(name, env->ctx), sl_from(env, name), \
				       sluice_last_error_detail());             \
	} while (0)

	r = sl_env_word(env, "SLUICE_BACKEND", backends, &w);
	if (r < 0)
		return r;
	if (!r)
		SL_APPLY(sluice_config_set_backend(cfg, (enum sluice_backend)w));
	r = sl_env_word(env, "SLUICE_DIRECT", directs, &w);
	if (r < 0)
		return r;
	if (!r)
		SL_APPLY(sluice_config_set_direct(cfg, (enum sluice_direct)w));
	r = sl_env_word(env, "SLUICE_STAGING", stagings, &w);
	if (r < 0)
		return r;
	if (!r)
		SL_APPLY(sluice_config_set_staging(cfg, (enum sluice_staging)w));
	SL_ENV_UINT("SLUICE_THREADS", 1u << 20, sluice_config_set_threads);
	SL_ENV_UINT("SLUICE_QUEUE_DEPTH", 1u << 20, sluice_config_set_queue_depth);
	SL_ENV_UINT("SLUICE_MAX_TRANSFER_SIZE", 1ull << 40, sluice_config_set_max_transfer_size);
	SL_ENV_UINT("SLUICE_BUFFER_POOL_SIZE", 1ull << 50, sluice_config_set_buffer_pool_size);
	r = sl_env_devices(env, cfg);
	if (r < 0)
		return r;
	SL_ENV_UINT("SLUICE_SQPOLL", 1, sluice_config_set_sqpoll);
	SL_ENV_UINT("SLUICE_ENABLE_P2P", 1, sluice_config_set_enable_p2p);
	SL_ENV_UINT("SLUICE_GPU", 1, sluice_config_set_gpu);
#undef SL_ENV_UINT
#undef SL_APPLY
	return sl_env_others(env);
}

int sluice_config_new(struct sluice_config **out)
{
	struct sluice_config *cfg = malloc(sizeof(*cfg));
	int rc;

	*out = NULL;
	if (!cfg)
		return -ENOMEM;
	sl__config_defaults(cfg);
	rc = sl__settings_check();
	if (!rc)
		rc = sl__config_apply_env(cfg, &(struct sl__env){ sl_getenv, NULL });
	if (rc) {
		free(cfg);
		return rc;
	}
	*out = cfg;
	return 0;
}

void sluice_config_free(struct sluice_config *cfg)
{
	free(cfg);
}
