/*
 * Configuration: defaults and setters.  sluice_config_new (settings.c)
 * applies the SLUICE_* settings through these setters, so both refuse the
 * same values.
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
	/*
	 * A thread a CPU, up to 16: warm reads are CPU copies out of the page
	 * cache, and on the 16-core H100 machine 16 threads into plain memory
	 * kept level with 16 plain preads (12: 0.85x); cold reads gained too.
	 */
	cfg->threads = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
	cfg->queue_depth = 4;
	cfg->max_transfer_size = 4u << 20;
	cfg->read_gap = 64u << 10;
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

int sluice_config_set_read_gap(struct sluice_config *cfg, size_t n)
{
	if (n > (64u << 20))
		return sl__err(SLUICE_EINVAL_CONFIG, "read_gap %zu is outside 0..64 MiB", n);
	cfg->read_gap = n;
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

void sluice_config_free(struct sluice_config *cfg)
{
	free(cfg);
}
