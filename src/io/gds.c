/*
 * gds backend: cuFileRead/cuFileWrite straight between a file and GPU
 * memory, synchronous on the worker thread (parallelism from workers).
 * io->handle is the file's sl_CUfileHandle_t, registered by the transfer
 * layer at file open; io->buf is device memory.
 *
 * The io layer may not depend on gpu/, so the cuFile entry points come
 * through sl__gds_bind(), which the engine calls with the loaded table.
 */
#include <errno.h>
#include <stdio.h>

#include "io/io.h"

static ssize_t (*sl_gds_read)(void *fh, void *buf, size_t n, off_t foff, off_t boff);
static ssize_t (*sl_gds_write)(void *fh, const void *buf, size_t n, off_t foff, off_t boff);
static const char *sl_gds_why = "cuFile not loaded";
static int sl_gds_real;

void sl__gds_bind(ssize_t (*rd)(void *, void *, size_t, off_t, off_t),
		  ssize_t (*wr)(void *, const void *, size_t, off_t, off_t), int real_gds,
		  const char *why)
{
	sl_gds_read = rd;
	sl_gds_write = wr;
	sl_gds_real = real_gds;
	sl_gds_why = why;
}

static int sl_gds_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	if (!sl_gds_read) {
		snprintf(why, n, "gds unusable: %s", sl_gds_why);
		return SLUICE_EBACKEND;
	}
	if (!sl_gds_real && cfg->backend != SLUICE_BACKEND_GDS) {
		snprintf(why, n, "gds unused: nvidia-fs absent (nvfs version 0.0), cuFile would run in "
			 "compat mode through host bounce buffers; set SLUICE_BACKEND=gds to force it");
		return SLUICE_EBACKEND;
	}
	return 0;
}

static int sl_gds_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	size_t got = 0;

	/* cuFile may return short counts; errors are -1/errno or -(5000+). */
	while (got < io->len) {
		ssize_t r = io->op == SL_IO_READ
				    ? sl_gds_read(io->handle, io->buf, io->len - got,
						  (off_t)(io->offset + got), (off_t)got)
				    : sl_gds_write(io->handle, io->buf, io->len - got,
						   (off_t)(io->offset + got), (off_t)got);

		if (r == 0)
			break;
		if (r < 0) {
			got = 0;
			io->res = r == -1 ? -(errno ? errno : EIO)
					  : sl__err(SLUICE_ECUFILE, "cuFile %s at offset %llu: error %zd",
						    io->op == SL_IO_READ ? "read" : "write",
						    (unsigned long long)io->offset, -r);
			return sl__sync_complete(ctx, io);
		}
		got += (size_t)r;
	}
	io->res = (ssize_t)got;
	return sl__sync_complete(ctx, io);
}

const struct sl__io_ops sl__io_gds_ops = {
	.name = "gds",
	.caps = SL_IO_CAP_GPU_MEM,
	.probe = sl_gds_probe,
	.init = sl__sync_init,
	.submit = sl_gds_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
};
