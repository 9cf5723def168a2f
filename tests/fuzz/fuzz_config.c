/*
 * libFuzzer target: byte sizes and SLUICE_* configuration values.
 * Input: a size string, then NUL-separated values for the registry's
 * settings in order (fed through a lookup table, not the process
 * environment).  Properties:
 * no crash, no sanitizer report, and a value is either rejected with
 * SLUICE_EINVAL_CONFIG or lands in range.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define NVARS 64 /* more than the registry holds: every setting gets a value */

/* The registry's settings, in its order (settings.c), take the values in turn. */
static const char *lookup(const char *name, void *ctx)
{
	const char *const *vals = ctx;

	for (int i = 0; i < NVARS && sl__settings[i].name; i++)
		if (!strcmp(name, sl__settings[i].name))
			return vals[i];
	return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 1), *p, *end;
	const char *vals[NVARS] = { 0 };
	struct sluice_config cfg;
	uint64_t v;
	int rc;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	buf[size] = '\0';
	end = buf + size;
	rc = sluice_parse_size(buf, &v);
	if (rc != 0 && rc != SLUICE_EINVAL_CONFIG)
		abort();
	p = buf + strlen(buf) + 1;
	for (int i = 0; i < NVARS && p < end; i++) {
		vals[i] = p;
		p += strlen(p) + 1;
	}
	sl__config_defaults(&cfg);
	rc = sl__settings_apply(&cfg, &(struct sl__env){ lookup, vals, NULL });
	if (rc == 0) {
		if (cfg.threads < 1 || cfg.threads > 256 || cfg.queue_depth < 1 || cfg.queue_depth > 256 ||
		    cfg.max_transfer_size % 4096 || cfg.max_transfer_size > (1u << 30) ||
		    cfg.backend > SLUICE_BACKEND_GDS || cfg.direct > SLUICE_DIRECT_NEVER)
			abort();
	} else if (rc != SLUICE_EINVAL_CONFIG) {
		abort();
	}
	free(buf);
	return 0;
}
