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
	/* A control byte (a name from a file, an index, a server) as \xHH: no escape sequence reaches a terminal. */
	n = 0;
	for (const char *p = tmp; *p && n + 1 < sizeof(sl_detail); p++) {
		unsigned char c = (unsigned char)*p;

		if (c >= 0x20 && c != 0x7f)
			sl_detail[n++] = (char)c;
		else if (n + 4 < sizeof(sl_detail))
			n += (size_t)snprintf(sl_detail + n, sizeof(sl_detail) - n, "\\x%02x", c);
		else
			break;
	}
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
	[SLUICE_EBASE - SLUICE_ERESOLVE] = "host name does not resolve",
};

#define SL_NAME(x) [SLUICE_EBASE - x] = #x
static const char *const sl_own_names[] = {
	SL_NAME(SLUICE_EBASE),	   SL_NAME(SLUICE_EINVAL_CONFIG), SL_NAME(SLUICE_ENOGPU),   SL_NAME(SLUICE_ECUDA),
	SL_NAME(SLUICE_ECUFILE),   SL_NAME(SLUICE_EBACKEND),	  SL_NAME(SLUICE_ERANGE),   SL_NAME(SLUICE_ESHORT),
	SL_NAME(SLUICE_EVERIFY),   SL_NAME(SLUICE_ENOTGPU),	  SL_NAME(SLUICE_ECANCELED), SL_NAME(SLUICE_EFORMAT),
	SL_NAME(SLUICE_ECRC),	   SL_NAME(SLUICE_ERESOLVE),
};
#undef SL_NAME

/* strerrorname_np() is glibc 2.32's; the wheel runs on 2.28, so the errno values sluice returns are named here. */
#define SL_E(x) { x, #x }
static const struct {
	int e;
	const char *name;
} sl_errno_names[] = {
	SL_E(EPERM),	    SL_E(ENOENT),	SL_E(ESRCH),	    SL_E(EINTR),       SL_E(EIO),
	SL_E(ENXIO),	    SL_E(E2BIG),	SL_E(EBADF),	    SL_E(EAGAIN),      SL_E(ENOMEM),
	SL_E(EACCES),	    SL_E(EFAULT),	SL_E(EBUSY),	    SL_E(EEXIST),      SL_E(EXDEV),
	SL_E(ENODEV),	    SL_E(ENOTDIR),	SL_E(EISDIR),	    SL_E(EINVAL),      SL_E(ENFILE),
	SL_E(EMFILE),	    SL_E(ENOTTY),	SL_E(EFBIG),	    SL_E(ENOSPC),      SL_E(ESPIPE),
	SL_E(EROFS),	    SL_E(EPIPE),	SL_E(ERANGE),	    SL_E(EDEADLK),     SL_E(ENAMETOOLONG),
	SL_E(ENOSYS),	    SL_E(ENOTEMPTY),	SL_E(ELOOP),	    SL_E(ENODATA),     SL_E(EPROTO),
	SL_E(EBADMSG),	    SL_E(EOVERFLOW),	SL_E(EILSEQ),	    SL_E(EOPNOTSUPP),  SL_E(EADDRINUSE),
	SL_E(ENETDOWN),	    SL_E(ENETUNREACH),	SL_E(ECONNABORTED), SL_E(ECONNRESET),  SL_E(ENOBUFS),
	SL_E(ENOTCONN),	    SL_E(ETIMEDOUT),	SL_E(ECONNREFUSED), SL_E(EHOSTUNREACH), SL_E(ESTALE),
	SL_E(EDQUOT),	    SL_E(ECANCELED),	SL_E(EKEYREJECTED),
};
#undef SL_E

const char *sluice_error_name(int code)
{
	if (code <= SLUICE_EBASE && code > SLUICE_ELAST) {
		const char *s = sl_own_names[SLUICE_EBASE - code];

		return s ? s : "";
	}
	for (size_t i = 0; i < sizeof(sl_errno_names) / sizeof(sl_errno_names[0]); i++)
		if (-sl_errno_names[i].e == code)
			return sl_errno_names[i].name;
	return "";
}

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
