/*
 * NumPy .npy headers, for `sluice pack --from-tokens`: magic "\x93NUMPY",
 * major, minor, header length (u16 in version 1, u32 in 2 and 3), then a
 * Python dict literal such as {'descr': '<u2', 'fortran_order': False,
 * 'shape': (1000,), }.  sluice reads one-dimensional little-endian
 * integer and float arrays; anything else is refused by name.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"

/* The value text after 'key': in the dict, or NULL. */
static const char *sl_npy_val(const char *h, const char *key)
{
	char k[32];
	const char *p;

	snprintf(k, sizeof(k), "'%s'", key);
	p = strstr(h, k);
	if (!p)
		return NULL;
	p += strlen(k);
	while (*p == ' ' || *p == ':')
		p++;
	return p;
}

int sl__npy_parse(const unsigned char *p, size_t len, enum sluice_dtype *dtype, uint64_t *count,
		  uint64_t *data_off)
{
	static const struct {
		const char *descr;
		enum sluice_dtype d;
	} types[] = {
		{ "'|u1'", SLUICE_DTYPE_U8 }, { "'<u2'", SLUICE_DTYPE_U16 }, { "'<u4'", SLUICE_DTYPE_U32 },
		{ "'<i4'", SLUICE_DTYPE_I32 }, { "'<i8'", SLUICE_DTYPE_I64 }, { "'|i1'", SLUICE_DTYPE_I8 },
		{ "'<i2'", SLUICE_DTYPE_I16 }, { "'<f2'", SLUICE_DTYPE_F16 }, { "'<f4'", SLUICE_DTYPE_F32 },
		{ "'<f8'", SLUICE_DTYPE_F64 },
	};
	char h[4096];
	size_t hl, start;
	const char *v;
	char *end;
	unsigned long long n;
	size_t t;

	if (len < 10 || memcmp(p, "\x93NUMPY", 6))
		return sl__err(SLUICE_EFORMAT, "not a .npy file (bad magic)");
	if (p[6] == 1) {
		hl = p[8] | (size_t)p[9] << 8;
		start = 10;
	} else if (p[6] == 2 || p[6] == 3) {
		if (len < 12)
			return sl__err(SLUICE_EFORMAT, ".npy header truncated");
		hl = sl__le32(p + 8);
		start = 12;
	} else {
		return sl__err(SLUICE_EFORMAT, ".npy version %u unknown", p[6]);
	}
	if (hl >= sizeof(h) || hl > len - start)
		return sl__err(SLUICE_EFORMAT, ".npy header of %zu bytes does not fit", hl);
	memcpy(h, p + start, hl);
	h[hl] = '\0';
	if (strlen(h) != hl)
		return sl__err(SLUICE_EFORMAT, ".npy header holds a NUL byte");
	v = sl_npy_val(h, "descr");
	for (t = 0; v && t < sizeof(types) / sizeof(types[0]); t++)
		if (!strncmp(v, types[t].descr, strlen(types[t].descr)))
			break;
	if (!v || t == sizeof(types) / sizeof(types[0]))
		return sl__err(SLUICE_EFORMAT, ".npy dtype %.*s is not a little-endian number type sluice reads",
			       v ? (int)strcspn(v, ",}") : 1, v ? v : "?");
	v = sl_npy_val(h, "fortran_order");
	if (!v || strncmp(v, "False", 5))
		return sl__err(SLUICE_EFORMAT, ".npy array is not in C order");
	v = sl_npy_val(h, "shape");
	if (!v || *v != '(' || v[1] < '0' || v[1] > '9')
		return sl__err(SLUICE_EFORMAT, ".npy shape is not one-dimensional");
	errno = 0;
	n = strtoull(v + 1, &end, 10);
	if (errno || *end != ',' || (end[1] != ')' && (end[1] != ' ' || end[2] != ')')))
		return sl__err(SLUICE_EFORMAT, ".npy shape is not one-dimensional");
	*dtype = types[t].d;
	*count = n;
	*data_off = start + hl;
	return 0;
}

int sl__npy_header(const char *path, enum sluice_dtype *dtype, uint64_t *count, uint64_t *data_offset)
{
	unsigned char buf[4096 + 12];
	struct stat st;
	ssize_t got;
	int fd = sl__open_file(path, O_RDONLY, 0), rc;
	uint64_t room;

	if (fd < 0)
		return fd;
	got = fstat(fd, &st) < 0 ? -1 : pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (got < 0)
		return sl__err(-errno, "%s: %s", path, strerror(errno));
	rc = sl__npy_parse(buf, (size_t)got, dtype, count, data_offset);
	if (rc)
		return sl__err(rc, "%s: %s", path, sluice_last_error_detail());
	/*
	 * The shape MUST be held by the file: its callers size buffers by the
	 * count (count * itemsize wrapped to a few bytes for 2^61 values, and
	 * the values read past them), and numpy refuses such a file too.
	 */
	room = (uint64_t)st.st_size > *data_offset ? (uint64_t)st.st_size - *data_offset : 0;
	if (*count > room / sluice_dtype_size(*dtype))
		return sl__err(SLUICE_EFORMAT, "%s: its header's shape is (%llu,) of %s, but its %lld bytes hold %llu of "
			       "them (a file cut short, or a shape that lies)", path, (unsigned long long)*count,
			       sluice_dtype_name(*dtype), (long long)st.st_size,
			       (unsigned long long)(room / sluice_dtype_size(*dtype)));
	return 0;
}
