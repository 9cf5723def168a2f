/* Error codes, their names and the thread-local detail. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

static _Thread_local char sl_detail[512];

int sl__err(int code, const char *fmt, ...)
{
	char tmp[4096];
	va_list ap;
	size_t n;

	/*
	 * Format apart first: callers often wrap the previous detail.  Whole,
	 * then redacted, then cut to the detail's size: cut first, a URL's
	 * password could lose the '@' that marks it as one.
	 */
	va_start(ap, fmt);
	vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	sl__redact_urls(tmp, sizeof(tmp));
	n = strnlen(tmp, sizeof(sl_detail) - 1); /* cut to the detail's size */
	memcpy(sl_detail, tmp, n);
	sl_detail[n] = '\0';
	sl__debug("core", "error %d (%s): %s", code, sluice_strerror(code), sl_detail);
	return code;
}

void sl__err_clear(void)
{
	sl_detail[0] = '\0';
}

const char *sluice_last_error_detail(void)
{
	return sl_detail;
}

static const char *const sl_own[] = {
	[SLUICE_EBASE - SLUICE_EINVAL_CONFIG] = "invalid configuration value",
	[SLUICE_EBASE - SLUICE_ENOGPU] = "no usable GPU (CUDA driver or device missing)",
	[SLUICE_EBASE - SLUICE_ECUDA] = "CUDA driver call failed",
	[SLUICE_EBASE - SLUICE_ECUFILE] = "cuFile call failed",
	[SLUICE_EBASE - SLUICE_EBACKEND] = "requested I/O backend is unusable",
	[SLUICE_EBASE - SLUICE_ERANGE] = "range extends beyond the end of the file",
	[SLUICE_EBASE - SLUICE_ESHORT] = "file shrank during the transfer",
	[SLUICE_EBASE - SLUICE_EVERIFY] = "data verification failed",
	[SLUICE_EBASE - SLUICE_ENOTGPU] = "pointer is not GPU memory",
	[SLUICE_EBASE - SLUICE_ECANCELED] = "transfer abandoned after an earlier error",
	[SLUICE_EBASE - SLUICE_EFORMAT] = "malformed or inconsistent data file",
	[SLUICE_EBASE - SLUICE_ECRC] = "checksum mismatch (a record, a block or a file)",
};

const char *sluice_strerror(int code)
{
	if (code >= 0)
		return "success";
	if (code < SLUICE_EBASE && code > SLUICE_ELAST) {
		const char *s = sl_own[SLUICE_EBASE - code];

		return s ? s : "unknown sluice error";
	}
	if (code > -4096)
		return strerror(-code);
	return "unknown error";
}

const char *sluice_version(void)
{
	return SLUICE_VERSION_STRING;
}
