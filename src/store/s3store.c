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

#include "remote/remote.h"
#include "store/store.h"

static int sl_s3s_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	(void)cfg, (void)why, (void)n;
	return 0;
}

/* The engine's client (env->shared), made by its first s3:// open from the AWS_* environment and files. */
static int sl_s3s_client(const struct sl__open_env *env, struct sl__s3 **out)
{
	int rc = 0;

	if (env->arg) {
		*out = env->arg;
		return 0;
	}
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
};
