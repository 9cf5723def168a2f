/*
 * The object checksums S3 keeps that a reader checks in one pass over the
 * whole object, in order (remote.h): CRC64NVME (core's sl__crc64nvme),
 * SHA-1 and SHA-256 (libcrypto).  The engine folds its pieces' CRCs into
 * an object's CRC32C, CRC32 or CRC64NVME instead (core's crc.c); these
 * serve the whole-object paths that read in order (a download, the cache,
 * get_object) and the SHAs everywhere.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote/remote.h"

/* An object's one-pass checksum in progress. */
struct sl_osum {
	int kind;
	uint64_t crc;
	EVP_MD_CTX *md;
};

static int sl_osum_begin(struct sl_osum *d, int kind)
{
	*d = (struct sl_osum){ .kind = kind };
	if (kind == SL_OSUM_CRC64NVME)
		return 0;
	if (!(d->md = EVP_MD_CTX_new()) ||
	    !EVP_DigestInit_ex(d->md, kind == SL_OSUM_SHA1 ? EVP_sha1() : EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(d->md);
		return -ENOMEM;
	}
	return 0;
}

static void sl_osum_add(struct sl_osum *d, const void *p, size_t n)
{
	if (d->kind == SL_OSUM_CRC64NVME)
		d->crc = sl__crc64nvme(d->crc, p, n);
	else
		EVP_DigestUpdate(d->md, p, n);
}

/* The checksum as S3 gives it (big-endian bytes) into out; its length. */
static unsigned sl_osum_end(struct sl_osum *d, unsigned char out[32])
{
	unsigned len = 0;

	if (d->kind == SL_OSUM_CRC64NVME) {
		for (int i = 0; i < 8; i++)
			out[i] = (unsigned char)(d->crc >> (56 - 8 * i));
		return 8;
	}
	EVP_DigestFinal_ex(d->md, out, &len);
	EVP_MD_CTX_free(d->md);
	return len;
}

unsigned sl__osum_len(int kind)
{
	return kind == SL_OSUM_CRC64NVME ? 8 : kind == SL_OSUM_SHA1 ? 20 : kind == SL_OSUM_SHA256 ? 32 : 0;
}

/* 1 where the bytes' checksum d matches m's, else SLUICE_EVERIFY naming what (name) and both values. */
static int sl_osum_match(struct sl_osum *d, const struct sl__s3_meta *m, const char *name)
{
	unsigned char got[32];
	char want_hex[65], got_hex[65];
	unsigned len = sl_osum_end(d, got);

	if (len == sl__osum_len(m->osum_kind) && !memcmp(got, m->osum, len))
		return 1;
	for (unsigned i = 0; i < len && i < 32; i++) {
		snprintf(want_hex + 2 * i, 3, "%02x", m->osum[i]);
		snprintf(got_hex + 2 * i, 3, "%02x", got[i]);
	}
	return sl__err(SLUICE_EVERIFY, "%s: its %s is %.*s, the bytes read give %.*s", name, m->sum_name, (int)len * 2,
		       want_hex, (int)len * 2, got_hex);
}

int sl__osum_check(const struct sl__s3_meta *m, const void *p, size_t n, const char *name)
{
	struct sl_osum d;

	if (!m->osum_kind)
		return 0;
	if (sl_osum_begin(&d, m->osum_kind))
		return -ENOMEM;
	sl_osum_add(&d, p, n);
	return sl_osum_match(&d, m, name);
}

int sl__osum_check_copy(const struct sl__s3_meta *m, uint64_t n,
			int (*copy)(void *ctx, void *dst, uint64_t off, size_t len), void *ctx, const char *name)
{
	enum { CHUNK = 4 << 20 };
	char *buf;
	struct sl_osum d;
	int rc = 0;

	if (!m->osum_kind)
		return 0;
	if (!(buf = malloc(CHUNK)) || sl_osum_begin(&d, m->osum_kind)) {
		free(buf);
		return -ENOMEM;
	}
	for (uint64_t off = 0, len; off < n && !rc; off += len) {
		len = n - off < CHUNK ? n - off : CHUNK;
		if ((rc = copy(ctx, buf, off, (size_t)len)))
			rc = sl__err(rc, "%s: reading it back to check its %s: %s", name, m->sum_name,
				     sluice_last_error_detail());
		else
			sl_osum_add(&d, buf, (size_t)len);
	}
	free(buf);
	if (rc) {
		unsigned char skip[32];

		sl_osum_end(&d, skip); /* frees the context */
		return rc;
	}
	return sl_osum_match(&d, m, name);
}

/* sl__osum_check_copy's copy from a file (ctx: its descriptor): exactly len bytes at off. */
static int sl_pread_all(void *ctx, void *dst, uint64_t off, size_t len)
{
	const int fd = *(const int *)ctx;

	for (size_t got = 0; got < len;) {
		ssize_t k = pread(fd, (char *)dst + got, len - got, (off_t)(off + got));

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k ? sl__err(-errno, "its copy: %s", strerror(errno))
				 : sl__err(SLUICE_ESHORT, "its copy is shorter than the object");
		got += (size_t)k;
	}
	return 0;
}

int sl__osum_check_fd(const struct sl__s3_meta *m, int fd, const char *name)
{
	return sl__osum_check_copy(m, m->size, sl_pread_all, &fd, name);
}
