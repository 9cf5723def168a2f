/*
 * The engine's I/O backend for s3:// objects (remote.h).  A segment's
 * storage read is one ranged GET into the worker's slot (or straight into
 * host memory), pinned to the ETag seen at open with If-Match; the rest of
 * the pipeline (the copy to the GPU, CRCs) is the one files take.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "io/io.h"
#include "remote/remote.h"

/* Each worker thread's connection, kept alive across its requests and closed when the thread ends. */
static pthread_key_t sl_conn_key;
static pthread_once_t sl_conn_once = PTHREAD_ONCE_INIT;

static void sl_conn_free(void *c)
{
	sl__s3_conn_close(c);
}

static void sl_conn_key_init(void)
{
	(void)pthread_key_create(&sl_conn_key, sl_conn_free);
}

static struct sl__s3_conn *sl_conn(void)
{
	struct sl__s3_conn *c;

	pthread_once(&sl_conn_once, sl_conn_key_init);
	c = pthread_getspecific(sl_conn_key);
	if (!c && sl__s3_conn_open(&c) == 0 && pthread_setspecific(sl_conn_key, c) != 0) {
		sl__s3_conn_close(c);
		c = NULL;
	}
	return c;
}

static int sl_s3io_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	(void)cfg, (void)why, (void)n;
	return 0;
}

static int sl_s3io_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	struct sl__s3_obj *o = io->handle;
	struct sl__s3_conn *c = sl_conn();

	if (io->op != SL_IO_READ)
		io->res = sl__err(-EROFS, "s3://%s/%s: objects are written by upload, not by ranges", o->bucket,
				  o->key);
	else if (!c)
		io->res = sl__err(-ENOMEM, "s3://%s/%s: no connection", o->bucket, o->key);
	else
		io->res = sl__s3_get(o->s3, c, o->bucket, o->key, io->offset, io->len, io->buf, o->etag);
	return sl__sync_complete(ctx, io);
}

const struct sl__io_ops sl__io_s3_ops = {
	.name = "s3",
	.caps = 0,
	.probe = sl_s3io_probe,
	.init = sl__sync_init,
	.submit = sl_s3io_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
};
