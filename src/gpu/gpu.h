/*
 * gpu: the CUDA driver and cuFile, loaded at run time.
 *
 * sl__cuda() fills a table of function pointers once (pthread_once) from
 * libcuda.so.1; NULL means no driver.  Every CUresult is converted here
 * into SLUICE_ECUDA with the raw code and its name in the error detail.
 */
#ifndef SL_GPU_H
#define SL_GPU_H

#include "core/core.h"
#include "gpu/cuda_decls.h"

struct sl__cuda_api {
	CUresult (*Init)(unsigned flags);
	CUresult (*DeviceGetCount)(int *n);
	CUresult (*DeviceGet)(CUdevice *d, int ordinal);
	CUresult (*DeviceGetName)(char *name, int len, CUdevice d);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice d);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice d);
	CUresult (*CtxSetCurrent)(CUcontext ctx);
	CUresult (*StreamCreate)(CUstream *s, unsigned flags);
	CUresult (*StreamDestroy)(CUstream s);
	CUresult (*StreamSynchronize)(CUstream s);
	CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
	CUresult (*EventCreate)(CUevent *e, unsigned flags);
	CUresult (*EventDestroy)(CUevent e);
	CUresult (*EventRecord)(CUevent e, CUstream s);
	CUresult (*EventQuery)(CUevent e);
	CUresult (*EventSynchronize)(CUevent e);
	CUresult (*MemAlloc)(CUdeviceptr *p, size_t n);
	CUresult (*MemFree)(CUdeviceptr p);
	CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);
	CUresult (*MemHostUnregister)(void *p);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s);
	CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);
	CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);
	CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);
	CUresult (*Memcpy)(CUdeviceptr dst, CUdeviceptr src, size_t n);
	CUresult (*PointerGetAttribute)(void *data, int attr, CUdeviceptr p);
	CUresult (*LaunchHostFunc)(CUstream s, CUhostFn fn, void *user);
	CUresult (*GetErrorName)(CUresult r, const char **name);
};

/*
 * The loaded driver table, or NULL (with the reason in *why when non-NULL)
 * if libcuda.so.1 is missing or cuInit failed.  Thread-safe.
 */
SL_HIDDEN const struct sl__cuda_api *sl__cuda(const char **why);

/* Converts r into SLUICE_ECUDA with "what: CUDA_ERROR_X (n)" as detail. */
SL_HIDDEN int sl__cuda_err(CUresult r, const char *what);
#define SL_CU(call, what)                                              \
	({                                                             \
		CUresult r_ = (call);                                  \
		r_ == SL_CUDA_SUCCESS ? 0 : sl__cuda_err(r_, what);    \
	})

/* A GPU a worker or engine talks to: its primary context. */
struct sl__gpu {
	const struct sl__cuda_api *cu;
	CUdevice dev;
	CUcontext ctx;
	int ordinal;
	char name[96];
};
SL_HIDDEN int sl__gpu_open(struct sl__gpu *g, int ordinal);
SL_HIDDEN void sl__gpu_close(struct sl__gpu *g);
/* Makes g's context current on the calling thread. */
SL_HIDDEN int sl__gpu_bind(const struct sl__gpu *g);
/* 1 if p is device memory (of any GPU), 0 otherwise (or without CUDA). */
SL_HIDDEN int sl__gpu_is_device_ptr(const struct sl__gpu *g, const void *p);

/*
 * Pinned host memory: page-aligned anonymous memory, registered with the
 * driver (so the same bytes serve O_DIRECT and DMA).  If registration is
 * refused the memory is kept unpinned and *pinned is 0.
 */
SL_HIDDEN int sl__host_alloc(const struct sl__gpu *g, size_t n, void **out, int *pinned);
SL_HIDDEN void sl__host_free(const struct sl__gpu *g, void *p, size_t n, int pinned);

/* cuFile, loaded from libcufile.so.0. */
struct sl__cufile_api {
	CUfileError_t (*DriverOpen)(void);
	CUfileError_t (*DriverClose)(void);
	CUfileError_t (*DriverGetProperties)(sl_CUfileDrvProps_t *props);
	CUfileError_t (*HandleRegister)(CUfileHandle_t *fh, CUfileDescr_t *descr);
	void (*HandleDeregister)(CUfileHandle_t fh);
	ssize_t (*Read)(CUfileHandle_t fh, void *buf, size_t n, off_t foff, off_t boff);
	ssize_t (*Write)(CUfileHandle_t fh, const void *buf, size_t n, off_t foff, off_t boff);
	int gds; /* 1 when nvidia-fs is present (nvfs version != 0.0) */
};
/*
 * Loads and opens cuFile once.  NULL with the reason in *why when it is
 * unavailable.  A table with gds == 0 means compat mode only.
 */
SL_HIDDEN const struct sl__cufile_api *sl__cufile(const char **why);

#endif
