/*
 * The engine's I/O backend for s3:// objects (remote.h).  A segment's
 * storage read is one ranged GET into the worker's slot (or straight into
 * host memory), pinned to the ETag seen at open with If-Match; the rest of
 * the pipeline (the copy to the GPU, CRCs) is the one files take, and the
 * worker starts copying a slot's bytes on while the GET still receives the
 * rest (io->progress).
 */
#include <errno.h>
#include <stdio.h>

#include "io/io.h"
#include "remote/remote.h"

static int sl_s3io_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	(void)cfg, (void)why, (void)n;
	return 0;
}

static void sl_s3io_progress(void *arg, size_t bytes)
{
	struct sl__io *io = arg;

	io->progress(io, bytes);
}

static int sl_s3io_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	struct sl__s3_obj *o = io->handle;
	struct sl__s3_conn *c = sl__s3_thread_conn();

	if (io->op != SL_IO_READ)
		io->res = sl__err(-EROFS, "s3://%s/%s: objects are written by upload, not by ranges", o->bucket,
				  o->key);
	else if (!c)
		io->res = sl__err(-ENOMEM, "s3://%s/%s: no connection", o->bucket, o->key);
	else
		io->res = sl__s3_get_progress(o->s3, c, o->bucket, o->key, io->offset, io->len, io->buf, o->meta.etag,
					      io->progress ? sl_s3io_progress : NULL, io, io->sum_kind, &io->sum);
	/* The request ran on this thread: its error's detail is this thread's last one. */
	snprintf(io->detail, sizeof(io->detail), "%s", io->res < 0 ? sluice_last_error_detail() : "");
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
