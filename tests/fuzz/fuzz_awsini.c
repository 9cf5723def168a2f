/*
 * libFuzzer target: AWS shared config and credentials files
 * (remote/s3conf.c, sl__ini_parse).  Properties: no crash, no sanitizer
 * report; every setting handed out has a non-empty section and key, and a
 * failure is SLUICE_EINVAL_CONFIG whose detail names the file and a line
 * but holds none of the input's bytes beyond that.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"

static int check(const char *section, const char *key, const char *value, void *ctx)
{
	(void)value;
	(void)ctx;
	if (!*section || !*key)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int rc = sl__ini_parse((const char *)data, size, "fuzz.ini", check, NULL);

	if (rc && (rc != SLUICE_EINVAL_CONFIG || strncmp(sluice_last_error_detail(), "fuzz.ini:", 9)))
		abort();
	return 0;
}
