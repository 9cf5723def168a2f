/*
 * Read once, deliver to several buffers (sluice.h): the engine reads each
 * chunk from storage into the first buffer, and while it reads the next,
 * the chunk is copied from there to every other buffer on a stream of its
 * own: peer to peer between GPUs (peer access enabled where the devices
 * allow it; through host memory otherwise, the driver's choice), or a
 * memcpy between host buffers.
 */
#include <errno.h>
#include <string.h>

#include "xfer/xfer.h"

#define SL_BCAST_CHUNK (64ull << 20)

/* Lets the engine's context reach the GPU holding p directly; best effort (the copy works without). */
static void sl_peer(struct sluice_engine *eng, const void *p)
{
	const struct sl__cuda_api *cu = sl__eng_gpu(eng)->cu;
	int ord = -1, can = 0;
	sl_CUdevice d;
	sl_CUcontext ctx;

	if (!cu->DeviceCanAccessPeer || !cu->CtxEnablePeerAccess ||
	    cu->PointerGetAttribute(&ord, 9 /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */, (sl_CUdeviceptr)(uintptr_t)p) ||
	    ord == sl__eng_gpu(eng)->ordinal || cu->DeviceGet(&d, ord) || cu->DeviceCanAccessPeer(&can, sl__eng_gpu(eng)->dev, d) || !can ||
	    cu->DevicePrimaryCtxRetain(&ctx, d))
		return;
	cu->CtxEnablePeerAccess(ctx, 0); /* CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED is fine too */
	cu->DevicePrimaryCtxRelease(d);
}

ssize_t sluice_read_broadcast(struct sluice_engine *eng, const char *path, uint64_t offset, size_t len,
			      void *const *dsts, unsigned n, struct sluice_xfer_report *rep)
{
	const struct sl__cuda_api *cu = sl__eng_gpu(eng)->cu;
	int gpu = 0;
	sl_CUstream st = NULL;
	struct sluice_file *f;
	ssize_t rc;

	if ((rc = SL_REPORT_IN(rep, xfer_report)))
		return rc;
	if (!n || !dsts)
		return sl__err(-EINVAL, "%s: a broadcast needs at least one buffer", path);
	for (unsigned j = 0; j < n; j++) {
		if (!dsts[j])
			return sl__err(-EINVAL, "%s: broadcast buffer %u is NULL", path, j);
		gpu |= sluice_is_gpu_ptr(eng, dsts[j]);
	}
	if (gpu && (!cu || !cu->MemcpyAsync))
		return sl__err(SLUICE_ENOGPU, "%s: GPU buffers, but the driver has no cuMemcpyAsync", path);
	if ((rc = sluice_file_open(&f, eng, path, SLUICE_RDONLY)))
		return rc;
	if (gpu) {
		if ((rc = sl__gpu_bind(sl__eng_gpu(eng))) || (rc = SL_CU(cu->StreamCreate(&st, 1), "cuStreamCreate")))
			goto out;
		for (unsigned j = 1; sl__eng_cfg(eng)->enable_p2p && j < n; j++)
			if (sluice_is_gpu_ptr(eng, dsts[j]))
				sl_peer(eng, dsts[j]);
	}
	for (size_t done = 0; done < len;) {
		size_t c = len - done < SL_BCAST_CHUNK ? len - done : SL_BCAST_CHUNK;
		struct sluice_xfer_report r = SLUICE_XFER_REPORT_INIT;

		rc = sluice_file_read(f, offset + done, c, (char *)dsts[0] + done, rep ? &r : NULL);
		if (rc < 0)
			goto out;
		if (rep) {
			rep->bytes += r.bytes, rep->bytes_direct += r.bytes_direct, rep->bytes_buffered += r.bytes_buffered;
			rep->ios += r.ios, rep->seconds += r.seconds;
			if (SL_COVERS(rep, bytes_storage))
				rep->bytes_storage += r.bytes_storage;
			memcpy(rep->path, r.path, sizeof(rep->path));
		}
		for (unsigned j = 1; j < n; j++) {
			char *to = (char *)dsts[j] + done, *from = (char *)dsts[0] + done;

			if (!gpu)
				memcpy(to, from, c);
			else if ((rc = SL_CU(cu->MemcpyAsync((sl_CUdeviceptr)(uintptr_t)to, (sl_CUdeviceptr)(uintptr_t)from,
							     c, st), "cuMemcpyAsync (broadcast)")))
				goto out;
		}
		done += c;
	}
	rc = st ? SL_CU(cu->StreamSynchronize(st), "cuStreamSynchronize (broadcast)") : 0;
	if (!rc)
		rc = (ssize_t)len;
out:
	if (st)
		cu->StreamDestroy(st);
	sluice_file_close(f);
	return rc;
}
