/*
 * The s3 store: s3:// objects (remote.h).  Opening one is a HEAD (its size,
 * ETag and checksum); a segment's storage read is one ranged GET into the
 * worker's slot (or straight into host memory), pinned to the ETag seen at
 * open with If-Match, on the worker thread's kept-alive connection.  The
 * rest of the pipeline (the copy to the GPU, CRCs) is the one files take,
 * and the worker copies a slot's bytes on while the GET still receives the
 * rest (io->progress).  Objects are written whole, by upload.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"
#include "store/store.h"

static int sl_s3s_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	(void)cfg, (void)why, (void)n;
	return 0;
}

/*
 * The caller's client (env->arg), else the engine's (env->shared), made by
 * its first s3:// open from the AWS_* environment and files, else (no env,
 * or no engine) the process's.
 */
static int sl_s3s_client(const struct sl__open_env *env, struct sl__s3 **out)
{
	int rc = 0;

	if (env && env->arg) {
		*out = env->arg;
		return 0;
	}
	if (!env || !env->shared) /* no engine: the process's */
		return sl__s3_default(out);
	env->lock(env->lock_arg);
	if (!*env->shared)
		rc = sl__s3_open((struct sl__s3 **)env->shared, NULL, NULL, NULL);
	*out = *env->shared;
	env->unlock(env->lock_arg);
	return rc;
}

static int sl_s3s_open(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env)
{
	struct sl__s3_obj *o = NULL;
	struct sl__s3 *s3 = NULL;
	uint64_t size = 0;
	int rc;

	if (flags & SLUICE_RDWR)
		return sl__err(-EROFS, "%s: s3:// objects open read-only; they are written whole, by upload", path);
	rc = sl_s3s_client(env, &s3);
	if (!rc)
		rc = sl__s3_obj_open(&o, s3, path, &size);
	if (rc)
		return rc;
	sf->handle = o;
	atomic_store(&sf->size, size);
	sf->sum_kind = o->meta.sum_kind;
	sf->sum = o->meta.sum;
	if (o->meta.osum_kind == SL_OSUM_CRC64NVME) {
		/* A CRC the engine folds from its pieces' CRCs, as it does a CRC32C: into GPU memory too. */
		sf->sum_kind = SL_CRC64NVME;
		sf->sum = 0;
		for (int i = 0; i < 8; i++)
			sf->sum = sf->sum << 8 | o->meta.osum[i]; /* S3 gives it big-endian */
	}
	snprintf(sf->sum_name, sizeof(sf->sum_name), "%s", o->meta.sum_name[0] ? o->meta.sum_name : "none (no checksum)");
	return 0;
}

/* A whole read against the object's SHA-1 or SHA-256 (sum.c): in host memory, or brought there by copy. */
static int sl_s3s_verify(const struct sl__sfile *sf, const void *buf, size_t n,
			 int (*copy)(void *ctx, void *dst, uint64_t off, size_t len), void *ctx)
{
	const struct sl__s3_obj *o = sf->handle;
	char name[1200];

	snprintf(name, sizeof(name), "s3://%s/%s", o->bucket, o->key);
	return buf ? sl__osum_check(&o->meta, buf, n, name) : sl__osum_check_copy(&o->meta, n, copy, ctx, name);
}

static int sl_s3s_put(const char *path, const void *src, size_t len,
		      int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx,
		      const struct sl__open_env *env)
{
	char bucket[64], key[1025];
	struct sl__s3 *s3 = NULL;
	int rc = sl__s3_parse_url(path, bucket, sizeof(bucket), key, sizeof(key));

	if (!rc && !key[0])
		rc = sl__err(-EISDIR, "%s: names a bucket or prefix, not an object", path);
	if (!rc)
		rc = sl_s3s_client(env, &s3);
	return rc ? rc : sl__s3_upload(s3, bucket, key, src, len, copy, copy_ctx);
}

static void sl_s3s_close(struct sl__sfile *sf)
{
	sl__s3_obj_close(sf->handle);
	sf->handle = NULL;
}

static void sl_s3s_release(void *shared)
{
	sl__s3_close(shared);
}

static void sl_s3s_progress(void *arg, size_t bytes)
{
	struct sl__io *io = arg;

	io->progress(io, bytes);
}

static int sl_s3s_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	struct sl__s3_obj *o = io->handle;
	struct sl__http_conn *c = sl__http_thread_conn();

	if (io->op != SL_IO_READ)
		io->res = sl__err(-EROFS, "s3://%s/%s: objects are written by upload, not by ranges", o->bucket,
				  o->key);
	else if (!c)
		io->res = sl__err(-ENOMEM, "s3://%s/%s: no connection", o->bucket, o->key);
	else
		io->res = sl__s3_get_progress(o->s3, c, o->bucket, o->key, io->offset, io->len, io->buf, &o->meta,
					      io->progress ? sl_s3s_progress : NULL, io, io->sum_kind, &io->sum);
	/* The request ran on this thread: its error's detail is this thread's last one. */
	snprintf(io->detail, sizeof(io->detail), "%s", io->res < 0 ? sluice_last_error_detail() : "");
	return sl__sync_complete(ctx, io);
}

/* ---- Names, through the process's client ---- */

/* bucket and key of url, the client and the thread's connection. */
static int sl_s3s_name(const char *url, char bucket[64], char key[1025], struct sl__s3 **s3, struct sl__http_conn **c)
{
	int rc = sl__s3_parse_url(url, bucket, 64, key, 1025);

	if (!rc)
		rc = sl__s3_default(s3);
	if (!rc && !(*c = sl__http_thread_conn()))
		rc = -ENOMEM;
	return rc;
}

/* An object (its size and ETag), else a prefix with keys below it. */
static int sl_s3s_info(const char *path, struct sl__entry *e)
{
	char bucket[64], key[1025], dir[1100];
	struct sl__s3 *s3;
	struct sl__http_conn *c;
	struct sl__s3_list l = { 0 };
	struct sl__s3_meta m;
	int rc;

	memset(e, 0, sizeof(*e));
	if ((rc = sl_s3s_name(path, bucket, key, &s3, &c)))
		return rc;
	if (key[0] && key[strlen(key) - 1] != '/') {
		rc = sl__s3_head(s3, c, bucket, key, &m);
		if (!rc) {
			e->kind = SL_KIND_FILE;
			e->size = m.size;
			snprintf(e->tag, sizeof(e->tag), "%s", m.etag);
			return 0;
		}
		if (rc != -ENOENT)
			return rc;
	}
	snprintf(dir, sizeof(dir), "%s%s", key, key[0] && key[strlen(key) - 1] != '/' ? "/" : "");
	rc = sl__s3_list(s3, c, bucket, dir, "/", 1, &l); /* one entry says it is a directory */
	if (!rc && !l.n)
		rc = sl__err(-ENOENT, "%s: no such object or prefix", path);
	if (!rc)
		e->kind = SL_KIND_DIR;
	sl__s3_list_free(&l);
	return rc;
}

/* The objects below the prefix dir names: not the prefixes, nor "directory" markers (keys ending in '/'). */
static int sl_s3s_list(const char *dir, int recursive, int (*add)(void *arg, const char *name), void *arg)
{
	char bucket[64], key[1025], *name = NULL;
	struct sl__s3 *s3;
	struct sl__http_conn *c;
	struct sl__s3_list l = { 0 };
	size_t kl;
	int rc;

	if ((rc = sl_s3s_name(dir, bucket, key, &s3, &c)))
		return rc;
	kl = strlen(key);
	if (kl && key[kl - 1] != '/' && kl + 1 < sizeof(key))
		key[kl++] = '/', key[kl] = 0;
	rc = sl__s3_list(s3, c, bucket, key, recursive ? NULL : "/", 0, &l);
	for (size_t i = 0; !rc && i < l.n; i++) {
		const char *k = l.e[i].key;

		if (l.e[i].is_prefix || strlen(k) <= kl || k[strlen(k) - 1] == '/')
			continue;
		if (asprintf(&name, "%s%s%s", dir, dir[strlen(dir) - 1] != '/' ? "/" : "", k + kl) < 0)
			rc = -ENOMEM;
		else
			rc = add(arg, name);
		free(name);
	}
	sl__s3_list_free(&l);
	return rc;
}

static int sl_s3s_remove(const char *path)
{
	char bucket[64], key[1025];
	struct sl__s3 *s3;
	struct sl__http_conn *c;
	int rc = sl_s3s_name(path, bucket, key, &s3, &c);

	return rc ? rc : sl__s3_delete(s3, c, bucket, key);
}

/* The object as of its ETag tag: parallel ranged GETs pinned to it, checked against its checksum. */
static int sl_s3s_fetch(const char *path, const char *tag, int fd, const _Atomic int *cancel, int *verified,
			char sum_name[48])
{
	char bucket[64], key[1025];
	struct sl__s3 *s3;
	struct sl__http_conn *c;
	struct sl__s3_meta m;
	int rc = sl_s3s_name(path, bucket, key, &s3, &c);

	if (!rc && (!key[0] || key[strlen(key) - 1] == '/'))
		rc = sl__err(-EISDIR, "%s: names a bucket or prefix, not an object", path);
	if (!rc)
		rc = sl__s3_head(s3, c, bucket, key, &m);
	if (!rc && tag && strcmp(tag, m.etag))
		rc = sl__err(-ESTALE, "%s: changed since it was listed (ETag %s, then %s)", path, tag, m.etag);
	if (!rc && sum_name)
		snprintf(sum_name, 48, "%s", m.sum_name[0] ? m.sum_name : "none (no checksum)");
	return rc ? rc : sl__s3_download(s3, bucket, key, &m, fd, cancel, verified);
}

static void sl_s3s_where(char *out, size_t cap)
{
	struct sl__s3 *s3;

	snprintf(out, cap, "%s", sl__s3_default(&s3) ? "" : sl__s3_conf(s3)->endpoint);
}

static const char *const sl_s3s_settings[] = { "SLUICE_S3_RETRIES", "SLUICE_S3_PART_SIZE", "SLUICE_S3_CONCURRENCY",
					       NULL };

const struct sl__store sl__store_s3 = {
	.name = "s3",
	.id = SL_STORE_ID_s3,
	.caps = SL_STORE_STREAM | SL_STORE_SUMS | SL_STORE_READONLY,
	.match = sl__is_s3_url,
	.probe = sl_s3s_probe,
	.open = sl_s3s_open,
	.close = sl_s3s_close,
	.put = sl_s3s_put,
	.release = sl_s3s_release,
	.init = sl__sync_init,
	.submit = sl_s3s_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
	.settings = sl_s3s_settings,
	.verify = sl_s3s_verify,
	.info = sl_s3s_info,
	.list = sl_s3s_list,
	.remove = sl_s3s_remove,
	.fetch = sl_s3s_fetch,
	.where = sl_s3s_where,
	.put_sum = "crc32c (checked by the server)",
};
