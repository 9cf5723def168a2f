/*
 * S3 transfers, over s3.c's object operations: an upload (one PUT, or a
 * multipart upload whose parts go in parallel, each with its CRC32C, the
 * whole object's combined at completion, aborted on any failure) and a
 * download into a file by parallel ranged GETs, matched against the
 * object's checksum.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote/remote.h"

/* ---- Uploads: one PUT, or a multipart upload whose parts go in parallel ---- */

struct sl_upload {
	struct sl__s3 *s;
	const char *bucket, *key;
	const char *src;
	size_t len;
	int (*copy)(void *ctx, void *dst, const void *src, size_t n);
	void *copy_ctx;
	char query_id[512];         /* "uploadId=..." encoded */
	unsigned nparts;
	_Atomic unsigned next;
	char (*etag)[128];          /* each part's ETag, by part */
	uint32_t *crc;              /* each part's CRC32C, by part */
	struct sl__first_err fail;
};

/* Part by part, on this thread's connection: the source copied (GPU memory: by u->copy) into a buffer, then sent. */
static void *sl_upload_parts(void *arg)
{
	struct sl_upload *u = arg;
	const size_t ps = sl__s3_part_size(u->s);
	struct sl__http_conn *c = NULL;
	char *buf = malloc(ps);
	int rc = buf ? sl__http_conn_open(&c) : -ENOMEM;

	sl__first_err_keep(&u->fail, rc);
	for (unsigned i; !rc && (i = atomic_fetch_add(&u->next, 1)) < u->nparts;) {
		size_t off = (size_t)i * ps, n = u->len - off < ps ? u->len - off : ps;

		if (atomic_load(&u->fail.err))
			break; /* another part failed: the upload is aborted, sending more is waste */
		rc = u->copy ? u->copy(u->copy_ctx, buf, u->src + off, n) : (memcpy(buf, u->src + off, n), 0);
		if (!rc) {
			u->crc[i] = sluice_crc32c(0, buf, n);
			rc = sl__s3_mpu_part(u->s, c, u->bucket, u->key, u->query_id, i + 1, buf, n, u->crc[i], u->etag[i]);
		}
		sl__first_err_keep(&u->fail, rc);
	}
	sl__http_conn_close(c);
	free(buf);
	return NULL;
}

/* One request: the object appears whole when it succeeds, or not at all. */
static int sl_upload_one(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key, const void *src,
			 size_t len, int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx)
{
	char *buf = copy ? malloc(len ? len : 1) : (char *)src;
	int rc = buf ? 0 : -ENOMEM;

	if (!rc && copy && len)
		rc = copy(copy_ctx, buf, src, len);
	if (!rc)
		rc = sl__s3_put(s, c, bucket, key, buf, len);
	if (copy)
		free(buf);
	return rc;
}

int sl__s3_upload(struct sl__s3 *s, const char *bucket, const char *key, const void *src, size_t len,
		  int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx)
{
	const size_t ps = sl__s3_part_size(s);
	struct sl_upload u = { .s = s, .bucket = bucket, .key = key, .src = src, .len = len, .copy = copy,
			       .copy_ctx = copy_ctx, .nparts = (unsigned)((len + ps - 1) / ps) };
	struct sl__http_conn *c = sl__http_thread_conn();
	uint32_t whole;
	int rc;

	if (!c)
		return sl__err(-ENOMEM, "s3://%s/%s: no connection", bucket, key);
	if (len <= ps)
		return sl_upload_one(s, c, bucket, key, src, len, copy, copy_ctx);
	if (len / ps >= 10000)
		return sl__err(SLUICE_EINVAL_CONFIG, "s3://%s/%s: %zu bytes take over 10000 parts of %zu: raise SLUICE_S3_PART_SIZE",
			       bucket, key, len, ps);
	if ((rc = sl__s3_mpu_create(s, c, bucket, key, u.query_id, sizeof(u.query_id))))
		return rc;
	u.etag = calloc(u.nparts, sizeof(*u.etag));
	u.crc = calloc(u.nparts, sizeof(*u.crc));
	rc = u.etag && u.crc ? 0 : -ENOMEM;
	if (!rc) {
		sl__first_err_init(&u.fail);
		sl__fanout(u.nparts < sl__s3_concurrency(s) ? u.nparts : sl__s3_concurrency(s), sl_upload_parts, &u);
		sl__first_err_fini(&u.fail);
		if (u.fail.err)
			rc = sl__err(u.fail.err, "%s; the upload was aborted, s3://%s/%s is as it was", u.fail.detail, bucket,
				     key);
	}
	if (!rc) {
		whole = u.crc[0];
		for (unsigned i = 1; i < u.nparts; i++)
			whole = sl__crc32c_combine(whole, u.crc[i], i + 1 < u.nparts ? ps : len - (size_t)i * ps);
		rc = sl__s3_mpu_complete(s, c, bucket, key, u.query_id, u.nparts, u.etag, u.crc, whole);
	}
	if (rc) {
		/* Nothing half-made stays behind: the parts sent are dropped with the upload. */
		char why[512];

		snprintf(why, sizeof(why), "%s", sluice_last_error_detail());
		sl__s3_mpu_abort(s, c, bucket, key, u.query_id);
		sl__err(rc, "%s", why);
	}
	free(u.etag);
	free(u.crc);
	return rc;
}

/* ---- Downloads: an object into a file by parallel ranged GETs ---- */

struct sl_download {
	struct sl__s3 *s;
	const char *bucket, *key;
	const struct sl__s3_meta *m; /* the object as its HEAD said: every GET is pinned to it */
	uint64_t size;
	int fd;
	int sum_kind;               /* the object's checksum's kind, SL_CRC_NONE: none to check */
	uint64_t *crc;              /* each chunk's CRC of that kind, by chunk */
	const _Atomic int *cancel;
	_Atomic uint64_t next;      /* chunk */
	struct sl__first_err fail;
};

static void *sl_download_chunks(void *arg)
{
	struct sl_download *d = arg;
	const size_t chunk = sl__s3_part_size(d->s);
	const uint64_t nchunks = (d->size + chunk - 1) / chunk;
	struct sl__http_conn *c = NULL;
	char *buf = malloc(chunk);
	int rc = buf ? sl__http_conn_open(&c) : -ENOMEM;

	for (uint64_t i; !rc && (i = atomic_fetch_add(&d->next, 1)) < nchunks && !atomic_load(&d->fail.err);) {
		uint64_t off = i * chunk;
		size_t n = d->size - off < chunk ? (size_t)(d->size - off) : chunk;
		ssize_t got;

		if (d->cancel && atomic_load(d->cancel)) {
			rc = sl__err(-ECANCELED, "s3://%s/%s: download cancelled", d->bucket, d->key);
			break;
		}
		got = sl__s3_get_progress(d->s, c, d->bucket, d->key, off, n, buf, d->m, NULL, NULL, d->sum_kind,
					  d->sum_kind ? &d->crc[i] : NULL);
		if (got >= 0 && (size_t)got != n)
			got = sl__err(-EIO, "s3://%s/%s: %zd bytes at offset %llu, %zu expected (the object is shorter)",
				      d->bucket, d->key, got, (unsigned long long)off, n);
		rc = got < 0 ? (int)got : 0;
		for (size_t w = 0; !rc && w < n;) {
			ssize_t r = pwrite(d->fd, buf + w, n - w, (off_t)(off + w));

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				rc = sl__err(-errno, "s3://%s/%s: writing its copy: %s", d->bucket, d->key, strerror(errno));
			else
				w += (size_t)r;
		}
	}
	if (rc)
		sl__first_err_keep(&d->fail, rc);
	sl__http_conn_close(c);
	free(buf);
	return NULL;
}

/* One pass of a download (sl__s3_download); with d->sum_kind, d->crc holds the chunks' CRCs after. */
static int sl_download_once(struct sl_download *d)
{
	struct sl__s3 *s = d->s;
	const uint64_t nchunks = (d->size + sl__s3_part_size(s) - 1) / sl__s3_part_size(s);
	int rc;

	atomic_store(&d->next, 0);
	sl__first_err_init(&d->fail);
	if (nchunks)
		sl__fanout(nchunks < sl__s3_concurrency(s) ? (unsigned)nchunks : sl__s3_concurrency(s), sl_download_chunks, d);
	rc = sl__first_err_raise(&d->fail);
	sl__first_err_fini(&d->fail);
	return rc;
}

int sl__s3_download(struct sl__s3 *s, const char *bucket, const char *key, const struct sl__s3_meta *m, int fd,
		    const _Atomic int *cancel, int *verified)
{
	struct sl_download d = { .s = s, .bucket = bucket, .key = key, .m = m, .size = m->size, .fd = fd,
				 .sum_kind = m->sum_kind, .cancel = cancel };
	const uint64_t nchunks = (m->size + sl__s3_part_size(s) - 1) / sl__s3_part_size(s);
	uint32_t sum = 0;
	int rc = 0;

	if (verified)
		*verified = 0;
	if (ftruncate(fd, (off_t)m->size) < 0)
		return sl__err(-errno, "s3://%s/%s: sizing its copy to %llu bytes: %s", bucket, key,
			       (unsigned long long)m->size, strerror(errno));
	if (d.sum_kind && !(d.crc = calloc(nchunks ? nchunks : 1, sizeof(*d.crc))))
		return -ENOMEM;
	/* A mismatch is downloaded once more (a byte flipped on the way), then is an error. */
	for (int pass = 0; pass < 2; pass++) {
		if ((rc = sl_download_once(&d)))
			break;
		if (m->osum_kind) {
			/* A one-pass checksum (sum.c): the copy read back in order, from the page cache mostly. */
			char name[1200];

			snprintf(name, sizeof(name), "s3://%s/%s", bucket, key);
			if ((rc = sl__osum_check_fd(m, fd, name)) != SLUICE_EVERIFY)
				break;
			sl__err(rc, "%s%s", sluice_last_error_detail(), pass ? " (downloaded twice)" : "");
			sl__warn("s3", "%s", sluice_last_error_detail());
			continue;
		}
		if (!d.sum_kind)
			break;
		sum = nchunks ? d.crc[0] : 0;
		for (uint64_t i = 1; i < nchunks; i++)
			sum = sl__crc_combine(d.sum_kind, sum, d.crc[i],
					      i + 1 < nchunks ? sl__s3_part_size(s) : m->size - i * sl__s3_part_size(s));
		if (sum == m->sum)
			break;
		rc = sl__err(SLUICE_EVERIFY, "s3://%s/%s: the %s of the %llu bytes received is %08x, the object's is %08x%s",
			     bucket, key, m->sum_name, (unsigned long long)m->size, sum, m->sum,
			     pass ? " (downloaded twice)" : "");
		sl__warn("s3", "%s", sluice_last_error_detail());
	}
	free(d.crc);
	if (rc > 0)
		rc = 0; /* sl__osum_check_fd's "matched" */
	if (!rc && verified)
		*verified = d.sum_kind != SL_CRC_NONE || m->osum_kind;
	return rc;
}

