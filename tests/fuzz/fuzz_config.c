/*
 * libFuzzer target: byte sizes and SLUICE_* configuration from the
 * environment.  Input: a size string, then NUL-separated values for the
 * variables below.  Properties: no crash, no sanitizer report, a value is
 * either rejected with SLUICE_EINVAL_CONFIG or lands in range.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static const char *const vars[] = { "SLUICE_BACKEND", "SLUICE_DIRECT", "SLUICE_STAGING",
				    "SLUICE_THREADS", "SLUICE_QUEUE_DEPTH", "SLUICE_MAX_TRANSFER_SIZE",
				    "SLUICE_BUFFER_POOL_SIZE", "SLUICE_DEVICE_IDS", "SLUICE_SQPOLL",
				    "SLUICE_GPU" };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 1), *p, *end;
	struct sluice_config *cfg;
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
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		if (p < end) {
			setenv(vars[i], p, 1);
			p += strlen(p) + 1;
		} else {
			unsetenv(vars[i]);
		}
	}
	rc = sluice_config_new(&cfg);
	if (rc == 0) {
		if (cfg->threads < 1 || cfg->threads > 256 || cfg->queue_depth < 1 || cfg->queue_depth > 256 ||
		    cfg->max_transfer_size % 4096 || cfg->backend > SLUICE_BACKEND_GDS)
			abort();
		sluice_config_free(cfg);
	} else if (rc != SLUICE_EINVAL_CONFIG) {
		abort();
	}
	free(buf);
	return 0;
}
