/*
 * gpu: the CUDA driver and cuFile, loaded at run time.
 *
 * sl__cuda() fills a table of function pointers once (pthread_once) from
 * libcuda.so.1; NULL means no driver.  Every sl_CUresult is converted here
 * into SLUICE_ECUDA with the raw code and its name in the error detail.
 * Depends on core.
 */
#ifndef SL_GPU_H
#define SL_GPU_H

#include <sched.h>

#include "core/core.h"
#include "gpu/cuda_decls.h"

struct sl__cuda_api {
	sl_CUresult (*Init)(unsigned flags);
	sl_CUresult (*DeviceGetCount)(int *n);
	sl_CUresult (*DeviceGet)(sl_CUdevice *d, int ordinal);
	sl_CUresult (*DeviceGetName)(char *name, int len, sl_CUdevice d);
	sl_CUresult (*DevicePrimaryCtxRetain)(sl_CUcontext *ctx, sl_CUdevice d);
	sl_CUresult (*DevicePrimaryCtxRelease)(sl_CUdevice d);
	sl_CUresult (*CtxSetCurrent)(sl_CUcontext ctx);
	sl_CUresult (*StreamCreate)(sl_CUstream *s, unsigned flags);
	sl_CUresult (*StreamCreateWithPriority)(sl_CUstream *s, unsigned flags, int priority);
	sl_CUresult (*CtxGetStreamPriorityRange)(int *least, int *greatest);
	sl_CUresult (*StreamDestroy)(sl_CUstream s);
	sl_CUresult (*StreamSynchronize)(sl_CUstream s);
	sl_CUresult (*StreamWaitEvent)(sl_CUstream s, sl_CUevent e, unsigned flags);
	sl_CUresult (*EventCreate)(sl_CUevent *e, unsigned flags);
	sl_CUresult (*EventDestroy)(sl_CUevent e);
	sl_CUresult (*EventRecord)(sl_CUevent e, sl_CUstream s);
	sl_CUresult (*EventQuery)(sl_CUevent e);
	sl_CUresult (*EventSynchronize)(sl_CUevent e);
	sl_CUresult (*MemAlloc)(sl_CUdeviceptr *p, size_t n);
	sl_CUresult (*MemFree)(sl_CUdeviceptr p);
	sl_CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);
	sl_CUresult (*MemHostUnregister)(void *p);
	sl_CUresult (*MemcpyHtoDAsync)(sl_CUdeviceptr dst, const void *src, size_t n, sl_CUstream s);
	sl_CUresult (*MemcpyDtoHAsync)(void *dst, sl_CUdeviceptr src, size_t n, sl_CUstream s);
	sl_CUresult (*MemcpyHtoD)(sl_CUdeviceptr dst, const void *src, size_t n);
	sl_CUresult (*MemcpyDtoH)(void *dst, sl_CUdeviceptr src, size_t n);
	sl_CUresult (*Memcpy)(sl_CUdeviceptr dst, sl_CUdeviceptr src, size_t n);
	sl_CUresult (*PointerGetAttribute)(void *data, int attr, sl_CUdeviceptr p);
	sl_CUresult (*LaunchHostFunc)(sl_CUstream s, sl_CUhostFn fn, void *user);
	sl_CUresult (*MemHostGetDevicePointer)(sl_CUdeviceptr *d, void *p, unsigned flags);
	sl_CUresult (*StreamWaitValue32)(sl_CUstream s, sl_CUdeviceptr addr, uint32_t value, unsigned flags);
	sl_CUresult (*GetErrorName)(sl_CUresult r, const char **name);
	/* Kernels (image/gpu.c): modules NVRTC compiled. */
	sl_CUresult (*DeviceGetAttribute)(int *v, int attr, sl_CUdevice d);
	sl_CUresult (*ModuleLoadData)(sl_CUmodule *m, const void *image);
	sl_CUresult (*ModuleUnload)(sl_CUmodule m);
	sl_CUresult (*ModuleGetFunction)(sl_CUfunction *f, sl_CUmodule m, const char *name);
	sl_CUresult (*LaunchKernel)(sl_CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				    unsigned bz, unsigned shared, sl_CUstream s, void **params, void **extra);
	/*
	 * Optional (NULL when the driver lacks them, before r550): the process
	 * checkpoint functions, each args struct 64 bytes of which only the lock's
	 * first word (timeoutMs) is used; the rest MUST be zero.
	 */
	sl_CUresult (*CheckpointProcessLock)(int pid, void *args);
	sl_CUresult (*CheckpointProcessCheckpoint)(int pid, void *args);
	sl_CUresult (*CheckpointProcessRestore)(int pid, void *args);
	sl_CUresult (*CheckpointProcessUnlock)(int pid, void *args);
	sl_CUresult (*CheckpointProcessGetState)(int pid, int *state);
	/* Optional: peer-to-peer copies between GPUs (sluice_read_broadcast). */
	sl_CUresult (*MemcpyAsync)(sl_CUdeviceptr dst, sl_CUdeviceptr src, size_t n, sl_CUstream s);
	sl_CUresult (*DeviceCanAccessPeer)(int *can, sl_CUdevice d, sl_CUdevice peer);
	sl_CUresult (*CtxEnablePeerAccess)(sl_CUcontext peer, unsigned flags);
	sl_CUresult (*DeviceGetPCIBusId)(char *id, int len, sl_CUdevice d);
};

/*
 * The NUMA node of the PCI device pci ("0000:17:00.0") and its CPUs, from
 * sysfs under SLUICE_SYSROOT (default /): 0 with *node >= 0 and cpus set;
 * *node = -1 when the device reports no node (one-socket machines, most
 * virtual machines) or sysfs cannot tell.
 */
SL_HIDDEN void sl__numa_of_pci(const char *pci, int *node, cpu_set_t *cpus);

/* A library loaded at run time: each symbol's slot and name. */
struct sl__sym {
	void **slot;
	const char *name;
};
/*
 * dlopen(lib) and every symbol of syms[0..n).  Returns the handle, or NULL
 * with why (cap bytes) saying "LIB not loadable: ... (missing)" or "LIB
 * lacks NAME (old)"; missing and old (may be NULL) tell the user what to do.
 */
SL_HIDDEN void *sl__dl_load(const char *lib, const struct sl__sym *syms, size_t n, const char *missing,
			    const char *old, char *why, size_t cap);

/*
 * sl__dl_load of a CUDA toolkit library: the file the setting names when
 * set, else soname as the dynamic loader finds it, else under $CUDA_HOME,
 * $CUDA_PATH and /usr/local/cuda (lib64/), where the toolkit keeps it off
 * the loader's path.
 */
SL_HIDDEN void *sl__dl_load_cuda(const char *setting, const char *soname, const struct sl__sym *syms, size_t n,
				 const char *missing, const char *old, char *why, size_t cap);

/* nvJPEG (nvjpeg.c): batched decode, the hardware engines' backend included.  Our declarations of nvjpeg.h's. */
typedef struct sl_nvjpeg_handle *sl_nvjpegHandle_t;
typedef struct sl_nvjpeg_state *sl_nvjpegJpegState_t;
typedef struct sl_nvjpeg_stream *sl_nvjpegJpegStream_t;
struct sl_nvjpegImage {
	unsigned char *channel[4];
	size_t pitch[4];
};
#define SL_NVJPEG_BACKEND_DEFAULT 0
#define SL_NVJPEG_BACKEND_HARDWARE 3
#define SL_NVJPEG_OUTPUT_UNCHANGED 0
#define SL_NVJPEG_OUTPUT_RGBI 5
#define SL_NVJPEG_CSS_444 0
#define SL_NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION 32
#define SL_NVJPEG_STATUS_ARCH_MISMATCH 7
struct sl__nvjpeg_api {
	int (*CreateEx)(int backend, void *dev_alloc, void *pinned_alloc, unsigned flags, sl_nvjpegHandle_t *h);
	int (*Destroy)(sl_nvjpegHandle_t h);
	int (*JpegStateCreate)(sl_nvjpegHandle_t h, sl_nvjpegJpegState_t *st);
	int (*JpegStateDestroy)(sl_nvjpegJpegState_t st);
	int (*DecodeBatchedInitialize)(sl_nvjpegHandle_t h, sl_nvjpegJpegState_t st, int batch, int max_cpu_threads,
				       int output_format);
	int (*DecodeBatched)(sl_nvjpegHandle_t h, sl_nvjpegJpegState_t st, const unsigned char *const *data,
			     const size_t *lengths, struct sl_nvjpegImage *dest, sl_CUstream s);
	int (*JpegStreamCreate)(sl_nvjpegHandle_t h, sl_nvjpegJpegStream_t *js);
	int (*JpegStreamDestroy)(sl_nvjpegJpegStream_t js);
	int (*JpegStreamParseHeader)(sl_nvjpegHandle_t h, const unsigned char *data, size_t len, sl_nvjpegJpegStream_t js);
	int (*DecodeBatchedSupported)(sl_nvjpegHandle_t h, sl_nvjpegJpegStream_t js, int *unsupported);
	/* What the stream's last parsed header says: its components, and each one's size */
	int (*JpegStreamGetComponentsNum)(sl_nvjpegJpegStream_t js, unsigned *ncomp);
	int (*JpegStreamGetComponentDimensions)(sl_nvjpegJpegStream_t js, unsigned c, unsigned *w, unsigned *h);
	/* NULL where nvJPEG lacks it (before CUDA 11.x's): the hardware backend's memory made ahead for a batch */
	int (*DecodeBatchedPreAllocate)(sl_nvjpegHandle_t h, sl_nvjpegJpegState_t st, int batch, int width, int height,
					int chroma_subsampling, int output_format);
};
/* The loaded table, or NULL with the reason in *why. */
SL_HIDDEN const struct sl__nvjpeg_api *sl__nvjpeg(const char **why);


struct sl__gpu;
/* NVRTC (nvrtc.c): a CUDA C++ source compiled for g's architecture, once a process and source, into *fn. */
SL_HIDDEN int sl__nvrtc_kernel(const struct sl__gpu *g, const char *src, const char *name, sl_CUfunction *fn);
/* src compiled by NVRTC for sm_<major><minor> into a cubin (*out, malloc'ed, *n bytes); no GPU needed. */
SL_HIDDEN int sl__nvrtc_compile(const char *src, const char *name, int major, int minor, char **out, size_t *n);

/* nvCOMP (nvcomp.c): the batched zstd decoder of libnvcomp.so.6. */
struct sl__nvcomp_opts {
	int backend;        /* nvcompDecompressBackend_t: 0 default */
	char reserved[60];  /* zero */
};
struct sl__nvcomp_align {
	size_t input, output, temp;
};
struct sl__nvcomp_api {
	int (*ZstdGetRequiredAlignments)(struct sl__nvcomp_opts opts, struct sl__nvcomp_align *a);
	int (*ZstdGetTempSize)(size_t nchunks, size_t max_chunk, struct sl__nvcomp_opts opts, size_t *temp,
			       size_t max_total, sl_CUstream s);
	int (*ZstdDecompressAsync)(const void *const *in, const size_t *in_bytes, const size_t *out_cap,
				   size_t *out_bytes, size_t nchunks, void *temp, size_t temp_bytes, void *const *out,
				   struct sl__nvcomp_opts opts, int *statuses, sl_CUstream s);
};
/* The loaded table, or NULL with the reason in *why. */
SL_HIDDEN const struct sl__nvcomp_api *sl__nvcomp(const char **why);

/*
 * The loaded driver table, or NULL (with the reason in *why when non-NULL)
 * if libcuda.so.1 is missing or cuInit failed.  Thread-safe.
 */
SL_HIDDEN const struct sl__cuda_api *sl__cuda(const char **why);

/* Converts r into SLUICE_ECUDA with "what: CUDA_ERROR_X (n)" as detail. */
SL_HIDDEN int sl__cuda_err(sl_CUresult r, const char *what);
/*
 * The driver calls this thread has made through SL_CU and SL_CU_RAW: the
 * loader reads it around a batch to count its producers' and its
 * consumer's calls (stats: cuda_calls_*), as the CUDA calls of other
 * threads hold up a training thread's launches (docs/guides/images.md).
 */
SL_HIDDEN extern _Thread_local uint64_t sl__cu_ncalls;
#define SL_CU_RAW(call) (sl__cu_ncalls++, (call))
#define SL_CU(call, what)                                              \
	({                                                             \
		sl_CUresult r_ = SL_CU_RAW(call);                         \
		r_ == SL_CUDA_SUCCESS ? 0 : sl__cuda_err(r_, what);    \
	})

/* A GPU a worker or engine talks to: its primary context. */
struct sl__gpu {
	const struct sl__cuda_api *cu;
	sl_CUdevice dev;
	sl_CUcontext ctx;
	int ordinal;
	char name[96];
	char pci[32];     /* "0000:17:00.0" (lower case, as sysfs names it); "" if the driver did not say */
};
SL_HIDDEN int sl__gpu_open(struct sl__gpu *g, int ordinal);
SL_HIDDEN void sl__gpu_close(struct sl__gpu *g);
/* Device memory on g (its context bound); 0, SLUICE_ENOGPU or SLUICE_ECUDA.  Free with sl__gpu_free. */
SL_HIDDEN int sl__gpu_alloc(const struct sl__gpu *g, size_t n, void **out);
SL_HIDDEN void sl__gpu_free(const struct sl__gpu *g, void *p);
/* A buffer grown as work needs: GPU memory (dev) or pinned host memory. */
struct sl__gbuf {
	void *p;
	size_t cap;
	int pinned, dev;
};
/* Room for n bytes in b (its kind set at first use), grown by a quarter: the old contents go.  0, or an error naming what. */
SL_HIDDEN int sl__gbuf_room(const struct sl__gpu *g, struct sl__gbuf *b, size_t n, int dev, const char *what);
SL_HIDDEN void sl__gbuf_free(const struct sl__gpu *g, struct sl__gbuf *b);
/* Makes g's context current on the calling thread. */
SL_HIDDEN int sl__gpu_bind(const struct sl__gpu *g);
/* 1 if p is device memory (of any GPU), 0 otherwise (or without CUDA). */
SL_HIDDEN int sl__gpu_is_device_ptr(const struct sl__gpu *g, const void *p);
/* Where the device allocation holding p starts (p itself if the driver cannot say). */
SL_HIDDEN char *sl__gpu_alloc_start(const struct sl__gpu *g, const void *p);

/*
 * Pinned host memory: page-aligned anonymous memory, registered with the
 * driver (so the same bytes serve O_DIRECT and DMA).  If registration is
 * refused the memory is kept unpinned and *pinned is 0.
 */
SL_HIDDEN int sl__host_alloc(const struct sl__gpu *g, size_t n, void **out, int *pinned);
SL_HIDDEN void sl__host_free(const struct sl__gpu *g, void *p, size_t n, int pinned);
/*
 * Registers [p, p + n) of mapped memory with g's driver: 1 if pinned, 0 if
 * refused (warned) or without CUDA.  Pinning faults the pages in, so
 * threads pinning disjoint parts of one mapping run in parallel.
 */
SL_HIDDEN int sl__host_pin(const struct sl__gpu *g, void *p, size_t n);
SL_HIDDEN void sl__host_unpin(const struct sl__gpu *g, void *p);

/* cuFile, loaded from libcufile.so.0. */
struct sl__cufile_api {
	sl_CUfileError_t (*DriverOpen)(void);
	sl_CUfileError_t (*DriverClose)(void);
	sl_CUfileError_t (*DriverGetProperties)(sl_CUfileDrvProps_t *props);
	sl_CUfileError_t (*HandleRegister)(sl_CUfileHandle_t *fh, sl_CUfileDescr_t *descr);
	void (*HandleDeregister)(sl_CUfileHandle_t fh);
	/* Optional (NULL where the library lacks them): a GPU buffer registered for cuFile's transfers. */
	sl_CUfileError_t (*BufRegister)(const void *ptr, size_t len, int flags);
	sl_CUfileError_t (*BufDeregister)(const void *ptr);
	ssize_t (*Read)(sl_CUfileHandle_t fh, void *buf, size_t n, off_t foff, off_t boff);
	ssize_t (*Write)(sl_CUfileHandle_t fh, const void *buf, size_t n, off_t foff, off_t boff);
	int gds; /* 1 when nvidia-fs is present (nvfs version != 0.0) */
};
/*
 * Loads and opens cuFile once.  NULL with the reason in *why when it is
 * unavailable.  A table with gds == 0 means compat mode only.
 */
SL_HIDDEN const struct sl__cufile_api *sl__cufile(const char **why);

#endif
