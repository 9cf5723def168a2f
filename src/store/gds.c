/*
 * gds store: cuFileRead/cuFileWrite straight between a local file and GPU
 * memory, synchronous on the worker thread (parallelism from workers).
 * A file it opens is a local file (store/local.c) whose O_DIRECT
 * descriptor is also registered with cuFile; segments that are not one
 * piece of GPU memory are routed to the engine's store of local files.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"
#include "store/store.h"

struct sl_gds_file {
	struct sl__local l; /* first: the handle is also a local file's */
	void *cufh;         /* sl_CUfileHandle_t, NULL where registration failed */
};

static int sl_gds_probe(const struct sluice_config *cfg, char *why, size_t n)
{
	const char *cwhy = "cuFile not loaded";
	const struct sl__cufile_api *cf = sl__cufile(&cwhy);

	if (!cf) {
		snprintf(why, n, "gds unusable: %s", cwhy);
		return SLUICE_EBACKEND;
	}
	if (!cf->gds && cfg->backend != SLUICE_BACKEND_GDS) {
		snprintf(why, n, "gds unused: nvidia-fs absent (nvfs version 0.0), cuFile would run in "
			 "compat mode through host bounce buffers; set SLUICE_BACKEND=gds to force it");
		return SLUICE_EBACKEND;
	}
	return 0;
}

static int sl_gds_open(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env)
{
	int rc = sl__local_open_as(sf, path, flags, sizeof(struct sl_gds_file));
	struct sl_gds_file *g = sf->handle;
	sl_CUfileDescr_t d;
	sl_CUfileError_t e;

	(void)env;
	if (rc || g->l.dfd < 0)
		return rc;
	memset(&d, 0, sizeof(d));
	d.type = SL_CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = g->l.dfd;
	e = sl__cufile(NULL)->HandleRegister(&g->cufh, &d);
	if (e.err != SL_CU_FILE_SUCCESS) {
		g->cufh = NULL;
		sl__warn("io", "%s: cuFileHandleRegister failed (cuFile error %d); GPU transfers of this file use bounce buffers",
			 path, e.err);
	}
	return 0;
}

int sl__gds_registered(const struct sl__sfile *sf)
{
	const struct sl_gds_file *g = sf->handle;

	return sf->ops == &sl__store_gds && g && g->cufh;
}

static void sl_gds_close(struct sl__sfile *sf)
{
	struct sl_gds_file *g = sf->handle;

	if (g && g->cufh)
		sl__cufile(NULL)->HandleDeregister(g->cufh);
	sl__local_close(sf);
}

/* One piece of GPU memory: straight there; anything else as the engine's store of local files moves it. */
static void sl_gds_route(const struct sl__sfile *sf, const struct sl__route_ask *a, struct sl__route *r)
{
	const struct sl_gds_file *g = sf->handle;

	if (a->gpu_whole && g->cufh) {
		r->store = sf->ops;
		r->handle = g->cufh;
		r->direct = 1;
		r->gpu = 1;
		return;
	}
	sl__local_route(sf, a, r);
	r->store = a->local;
}

static int sl_gds_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	const struct sl__cufile_api *cf = sl__cufile(NULL);
	size_t got = 0;

	/* cuFile may return short counts; errors are -1/errno or -(5000+). */
	while (got < io->len) {
		ssize_t r = io->op == SL_IO_READ
				    ? cf->Read(io->handle, io->buf, io->len - got, (off_t)(io->offset + got), (off_t)got)
				    : cf->Write(io->handle, io->buf, io->len - got, (off_t)(io->offset + got), (off_t)got);

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

/* GPU memory registered with cuFile once, so its transfers skip registering it each time. */
static int sl_gds_register_mem(void *ptr, size_t len)
{
	const struct sl__cufile_api *cf = sl__cufile(NULL);
	sl_CUfileError_t e;

	if (!cf || !cf->BufRegister)
		return sl__err(-EOPNOTSUPP, "cuFileBufRegister is not in this libcufile");
	e = cf->BufRegister(ptr, len, 0);
	return e.err ? sl__err(SLUICE_ECUFILE, "cuFileBufRegister of %zu bytes: error %d", len, e.err) : 0;
}

static void sl_gds_deregister_mem(void *ptr)
{
	const struct sl__cufile_api *cf = sl__cufile(NULL);

	if (cf && cf->BufDeregister)
		cf->BufDeregister(ptr);
}

const struct sl__store sl__store_gds = {
	.name = "gds",
	.id = SL_STORE_ID_gds,
	.caps = SL_STORE_GPU_MEM | SL_STORE_LOCAL,
	.probe = sl_gds_probe,
	.open = sl_gds_open,
	.close = sl_gds_close,
	.stat = sl__local_stat,
	.truncate = sl__local_truncate,
	.sync = sl__local_sync,
	.route = sl_gds_route,
	.info = sl__local_info,
	.list = sl__local_list,
	.remove = sl__local_remove,
	.fetch = sl__local_fetch,
	.register_mem = sl_gds_register_mem,
	.deregister_mem = sl_gds_deregister_mem,
	.init = sl__sync_init,
	.submit = sl_gds_submit,
	.reap = sl__sync_reap,
	.fini = sl__sync_fini,
};
