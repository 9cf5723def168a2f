/*
 * The CUDA driver API shim (libcuda.so.1) and pinned host memory.
 * Symbols are looked up by their versioned names, the ones cuda.h's macros
 * map the plain names to.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu/gpu.h"

_Thread_local uint64_t sl__cu_ncalls;
static struct sl__cuda_api sl_cu;
static const struct sl__cuda_api *sl_cu_ok;
static const char *sl_cu_why = "CUDA not loaded";
static char sl_cu_why_buf[256];
static pthread_once_t sl_cu_once = PTHREAD_ONCE_INIT;

void *sl__dl_load(const char *lib, const struct sl__sym *syms, size_t n, const char *missing, const char *old,
		  char *why, size_t cap)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		snprintf(why, cap, "%s not loadable: %s%s%s%s", lib, dlerror(), missing ? " (" : "", missing ? missing : "",
			 missing ? ")" : "");
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		*syms[i].slot = dlsym(h, syms[i].name);
		if (!*syms[i].slot) {
			snprintf(why, cap, "%s lacks %s%s%s%s", lib, syms[i].name, old ? " (" : "", old ? old : "",
				 old ? ")" : "");
			return NULL; /* h stays open: harmless, and dlclose races other users */
		}
	}
	return h;
}

void *sl__dl_load_cuda(const char *setting, const char *soname, const struct sl__sym *syms, size_t n, const char *missing,
		       const char *old, char *why, size_t cap)
{
	const char *named = sl__setting(setting), *roots[] = { getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda" };
	char path[4096];
	void *h;

	if (named && *named && strcmp(named, soname))
		return sl__dl_load(named, syms, n, missing, old, why, cap);
	if ((h = sl__dl_load(soname, syms, n, missing, old, why, cap)))
		return h;
	for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
		char other[512];

		if (!roots[i] || !*roots[i] || snprintf(path, sizeof(path), "%s/lib64/%s", roots[i], soname) >= (int)sizeof(path))
			continue;
		if ((h = sl__dl_load(path, syms, n, missing, old, other, sizeof(other))))
			return h;
	}
	return NULL; /* why: the loader's own answer for soname */
}

static void sl_cuda_load(void)
{
	void *h;
	const struct sl__sym syms[] = {
		{ (void **)&sl_cu.Init, "cuInit" },
		{ (void **)&sl_cu.DeviceGetCount, "cuDeviceGetCount" },
		{ (void **)&sl_cu.DeviceGet, "cuDeviceGet" },
		{ (void **)&sl_cu.DeviceGetName, "cuDeviceGetName" },
		{ (void **)&sl_cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain" },
		{ (void **)&sl_cu.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2" },
		{ (void **)&sl_cu.CtxSetCurrent, "cuCtxSetCurrent" },
		{ (void **)&sl_cu.StreamCreate, "cuStreamCreate" },
		{ (void **)&sl_cu.StreamCreateWithPriority, "cuStreamCreateWithPriority" },
		{ (void **)&sl_cu.CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange" },
		{ (void **)&sl_cu.StreamDestroy, "cuStreamDestroy_v2" },
		{ (void **)&sl_cu.StreamSynchronize, "cuStreamSynchronize" },
		{ (void **)&sl_cu.StreamWaitEvent, "cuStreamWaitEvent" },
		{ (void **)&sl_cu.EventCreate, "cuEventCreate" },
		{ (void **)&sl_cu.EventDestroy, "cuEventDestroy_v2" },
		{ (void **)&sl_cu.EventRecord, "cuEventRecord" },
		{ (void **)&sl_cu.EventQuery, "cuEventQuery" },
		{ (void **)&sl_cu.EventSynchronize, "cuEventSynchronize" },
		{ (void **)&sl_cu.MemAlloc, "cuMemAlloc_v2" },
		{ (void **)&sl_cu.MemFree, "cuMemFree_v2" },
		{ (void **)&sl_cu.MemHostRegister, "cuMemHostRegister_v2" },
		{ (void **)&sl_cu.MemHostUnregister, "cuMemHostUnregister" },
		{ (void **)&sl_cu.MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2" },
		{ (void **)&sl_cu.MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2" },
		{ (void **)&sl_cu.MemcpyHtoD, "cuMemcpyHtoD_v2" },
		{ (void **)&sl_cu.MemcpyDtoH, "cuMemcpyDtoH_v2" },
		{ (void **)&sl_cu.Memcpy, "cuMemcpy" },
		{ (void **)&sl_cu.PointerGetAttribute, "cuPointerGetAttribute" },
		{ (void **)&sl_cu.LaunchHostFunc, "cuLaunchHostFunc" },
		{ (void **)&sl_cu.MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2" },
		{ (void **)&sl_cu.StreamWaitValue32, "cuStreamWaitValue32_v2" },
		{ (void **)&sl_cu.GetErrorName, "cuGetErrorName" },
		{ (void **)&sl_cu.DeviceGetAttribute, "cuDeviceGetAttribute" },
		{ (void **)&sl_cu.ModuleLoadData, "cuModuleLoadData" },
		{ (void **)&sl_cu.ModuleUnload, "cuModuleUnload" },
		{ (void **)&sl_cu.ModuleGetFunction, "cuModuleGetFunction" },
		{ (void **)&sl_cu.LaunchKernel, "cuLaunchKernel" },
	};
	sl_CUresult r;

	h = sl__dl_load("libcuda.so.1", syms, sizeof(syms) / sizeof(syms[0]), NULL, "driver too old", sl_cu_why_buf,
			sizeof(sl_cu_why_buf));
	if (!h) {
		sl_cu_why = sl_cu_why_buf;
		return;
	}
	sl_cu.CheckpointProcessLock = dlsym(h, "cuCheckpointProcessLock");
	sl_cu.CheckpointProcessCheckpoint = dlsym(h, "cuCheckpointProcessCheckpoint");
	sl_cu.CheckpointProcessRestore = dlsym(h, "cuCheckpointProcessRestore");
	sl_cu.CheckpointProcessUnlock = dlsym(h, "cuCheckpointProcessUnlock");
	sl_cu.CheckpointProcessGetState = dlsym(h, "cuCheckpointProcessGetState");
	sl_cu.MemcpyAsync = dlsym(h, "cuMemcpyAsync");
	sl_cu.DeviceCanAccessPeer = dlsym(h, "cuDeviceCanAccessPeer");
	sl_cu.CtxEnablePeerAccess = dlsym(h, "cuCtxEnablePeerAccess");
	sl_cu.DeviceGetPCIBusId = dlsym(h, "cuDeviceGetPCIBusId");
	r = sl_cu.Init(0);
	if (r != SL_CUDA_SUCCESS) {
		const char *name = "?";

		sl_cu.GetErrorName(r, &name);
		snprintf(sl_cu_why_buf, sizeof(sl_cu_why_buf), "cuInit failed: %s (%d)", name, r);
		sl_cu_why = sl_cu_why_buf;
		return;
	}
	sl_cu_ok = &sl_cu;
}

const struct sl__cuda_api *sl__cuda(const char **why)
{
	pthread_once(&sl_cu_once, sl_cuda_load);
	if (!sl_cu_ok && why)
		*why = sl_cu_why;
	return sl_cu_ok;
}

int sl__cuda_err(sl_CUresult r, const char *what)
{
	const char *name = "?";

	if (sl_cu.GetErrorName)
		sl_cu.GetErrorName(r, &name);
	if (r == 2 /* CUDA_ERROR_OUT_OF_MEMORY */)
		return sl__err(SLUICE_ECUDA, "%s: %s (%d): GPU out of memory", what, name, r);
	return sl__err(SLUICE_ECUDA, "%s: %s (%d)", what, name, r);
}

int sl__gpu_open(struct sl__gpu *g, int ordinal)
{
	const char *why = NULL;
	int n = 0, rc;

	memset(g, 0, sizeof(*g));
	g->ordinal = -1;
	g->cu = sl__cuda(&why);
	if (!g->cu)
		return sl__err(SLUICE_ENOGPU, "%s", why);
	rc = SL_CU(g->cu->DeviceGetCount(&n), "cuDeviceGetCount");
	if (rc)
		return rc;
	if (ordinal >= n)
		return sl__err(SLUICE_ENOGPU, "GPU %d requested but %d CUDA device(s) present", ordinal, n);
	rc = SL_CU(g->cu->DeviceGet(&g->dev, ordinal), "cuDeviceGet");
	if (rc)
		return rc;
	rc = SL_CU(g->cu->DevicePrimaryCtxRetain(&g->ctx, g->dev), "cuDevicePrimaryCtxRetain");
	if (rc)
		return rc;
	g->cu->DeviceGetName(g->name, (int)sizeof(g->name), g->dev);
	if (g->cu->DeviceGetPCIBusId && g->cu->DeviceGetPCIBusId(g->pci, (int)sizeof(g->pci), g->dev) == SL_CUDA_SUCCESS)
		for (char *p = g->pci; *p; p++)
			*p = (char)tolower((unsigned char)*p);
	else
		g->pci[0] = 0;
	g->ordinal = ordinal;
	return sl__gpu_bind(g);
}

void sl__gpu_close(struct sl__gpu *g)
{
	if (g->ctx)
		g->cu->DevicePrimaryCtxRelease(g->dev);
	g->ctx = NULL;
}

int sl__gpu_bind(const struct sl__gpu *g)
{
	if (!g->ctx)
		return 0;
	return SL_CU(g->cu->CtxSetCurrent(g->ctx), "cuCtxSetCurrent");
}

int sl__gpu_is_device_ptr(const struct sl__gpu *g, const void *p)
{
	unsigned type = 0;

	if (!g->ctx || !p)
		return 0;
	/*
	 * Unified addressing: host pointers the driver does not know return
	 * CUDA_ERROR_INVALID_VALUE, which simply means "host".
	 */
	if (g->cu->PointerGetAttribute(&type, SL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				       (sl_CUdeviceptr)(uintptr_t)p) != SL_CUDA_SUCCESS)
		return 0;
	return type == SL_CU_MEMORYTYPE_DEVICE;
}

char *sl__gpu_alloc_start(const struct sl__gpu *g, const void *p)
{
	sl_CUdeviceptr start = 0;

	if (g->cu->PointerGetAttribute(&start, SL_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
				       (sl_CUdeviceptr)(uintptr_t)p) != SL_CUDA_SUCCESS || !start)
		return (char *)p;
	return (char *)(uintptr_t)start;
}

int sl__host_pin(const struct sl__gpu *g, void *p, size_t n)
{
	/* The calling thread may have no context current (a loader's thread, a Python caller's). */
	sl_CUresult r;

	if (!g || !g->ctx)
		return 0;
	r = sl__gpu_bind(g) ? SL_CUDA_ERROR_INVALID_CONTEXT
			    : g->cu->MemHostRegister(p, n, SL_CU_MEMHOSTREGISTER_PORTABLE);
	if (r == SL_CUDA_SUCCESS)
		return 1;
	sl__warn("gpu", "cuMemHostRegister of %zu bytes failed (%d): the buffer stays pageable, host-GPU copies will be slower",
		 n, r);
	return 0;
}

void sl__host_unpin(const struct sl__gpu *g, void *p)
{
	if (sl__gpu_bind(g) == 0)
		g->cu->MemHostUnregister(p);
}

int sl__host_alloc(const struct sl__gpu *g, size_t n, void **out, int *pinned)
{
	void *p;

	*pinned = 0;
	/* mmap gives page alignment for O_DIRECT and zeroed pages. */
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return sl__err(-errno, "mmap of %zu bytes for the buffer pool failed", n);
	/*
	 * Huge pages where the kernel allows them: copies into these buffers
	 * walk them a record at a time, and in a VM each TLB miss on 4 KiB
	 * pages walks two page tables.
	 */
	if (n >= (2u << 20))
		(void)madvise(p, n, MADV_HUGEPAGE);
	*pinned = sl__host_pin(g, p, n);
	*out = p;
	return 0;
}

void sl__host_free(const struct sl__gpu *g, void *p, size_t n, int pinned)
{
	if (!p)
		return;
	if (pinned)
		sl__host_unpin(g, p);
	munmap(p, n);
}

int sl__gpu_alloc(const struct sl__gpu *g, size_t n, void **out)
{
	sl_CUdeviceptr p = 0;
	int rc;

	*out = NULL;
	if (!g->ctx)
		return sl__err(SLUICE_ENOGPU, "engine has no GPU");
	rc = sl__gpu_bind(g);
	if (!rc)
		rc = SL_CU(g->cu->MemAlloc(&p, n), "cuMemAlloc");
	if (!rc)
		*out = (void *)(uintptr_t)p;
	return rc;
}

void sl__gpu_free(const struct sl__gpu *g, void *p)
{
	if (p && g->ctx && sl__gpu_bind(g) == 0)
		g->cu->MemFree((sl_CUdeviceptr)(uintptr_t)p);
}

void sl__gbuf_free(const struct sl__gpu *g, struct sl__gbuf *b)
{
	if (b->dev)
		sl__gpu_free(g, b->p);
	else
		sl__host_free(g, b->p, b->cap, b->pinned);
	*b = (struct sl__gbuf){ .dev = b->dev };
}

int sl__gbuf_room(const struct sl__gpu *g, struct sl__gbuf *b, size_t n, int dev, const char *what)
{
	size_t c;
	int rc;

	if (n <= b->cap)
		return 0;
	c = sl__align_up(n + n / 4, 1u << 21);
	sl__gbuf_free(g, b);
	b->dev = dev;
	rc = dev ? sl__gpu_alloc(g, c, &b->p) : sl__host_alloc(g, c, &b->p, &b->pinned);
	if (rc)
		return sl__err(rc, "%s: %s memory for %zu bytes: %s", what, dev ? "GPU" : "pinned", c,
			       sluice_last_error_detail());
	b->cap = c;
	return 0;
}
