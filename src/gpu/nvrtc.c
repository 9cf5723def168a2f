/*
 * The NVRTC shim (gpu.h): libnvrtc.so.13, loaded at run time and never
 * linked (SLUICE_NVRTC_LIB names another file).  A kernel's source is
 * compiled for the GPU's own architecture (sm_XY, a cubin) once per
 * process, source and architecture; each GPU context loads the module
 * once.  The compile log is the error's detail when it fails.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"

typedef struct sl_nvrtc_prog *sl_nvrtcProgram;
static struct {
	int (*CreateProgram)(sl_nvrtcProgram *p, const char *src, const char *name, int nheaders, const char *const *headers,
			     const char *const *include_names);
	int (*CompileProgram)(sl_nvrtcProgram p, int nopts, const char *const *opts);
	int (*GetCUBINSize)(sl_nvrtcProgram p, size_t *n);
	int (*GetCUBIN)(sl_nvrtcProgram p, char *out);
	int (*GetProgramLogSize)(sl_nvrtcProgram p, size_t *n);
	int (*GetProgramLog)(sl_nvrtcProgram p, char *out);
	int (*DestroyProgram)(sl_nvrtcProgram *p);
	const char *(*GetErrorString)(int r);
} sl_rt;
static int sl_rt_ok;
static char sl_rt_why[512] = "NVRTC not loaded";
static pthread_once_t sl_rt_once = PTHREAD_ONCE_INIT;

/* The modules loaded: one per (source, name, context). */
struct sl_kernel {
	const char *src, *name;
	sl_CUcontext ctx;
	sl_CUmodule mod;
	sl_CUfunction fn;
	struct sl_kernel *next;
};
static struct sl_kernel *sl_kernels;
static pthread_mutex_t sl_kernels_lock = PTHREAD_MUTEX_INITIALIZER;

static void sl_nvrtc_load(void)
{
	const struct sl__sym syms[] = {
		{ (void **)&sl_rt.CreateProgram, "nvrtcCreateProgram" },
		{ (void **)&sl_rt.CompileProgram, "nvrtcCompileProgram" },
		{ (void **)&sl_rt.GetCUBINSize, "nvrtcGetCUBINSize" },
		{ (void **)&sl_rt.GetCUBIN, "nvrtcGetCUBIN" },
		{ (void **)&sl_rt.GetProgramLogSize, "nvrtcGetProgramLogSize" },
		{ (void **)&sl_rt.GetProgramLog, "nvrtcGetProgramLog" },
		{ (void **)&sl_rt.DestroyProgram, "nvrtcDestroyProgram" },
		{ (void **)&sl_rt.GetErrorString, "nvrtcGetErrorString" },
	};

	sl_rt_ok = sl__dl_load_cuda("SLUICE_NVRTC_LIB", "libnvrtc.so.13", syms, sizeof(syms) / sizeof(syms[0]),
				    "the CUDA toolkit's, or pip install nvidia-cuda-nvrtc; or set SLUICE_NVRTC_LIB",
				    "NVRTC of CUDA 11.1 or later wanted", sl_rt_why, sizeof(sl_rt_why)) != NULL;
}

int sl__nvrtc_compile(const char *src, const char *name, int major, int minor, char **out, size_t *n)
{
	char arch[48];
	const char *opts[] = { arch, "--std=c++17", "-default-device" };
	sl_nvrtcProgram p = NULL;
	int rc;

	pthread_once(&sl_rt_once, sl_nvrtc_load);
	if (!sl_rt_ok)
		return sl__err(SLUICE_ENOGPU, "%s", sl_rt_why);
	snprintf(arch, sizeof(arch), "--gpu-architecture=sm_%d%d", major, minor);
	if ((rc = sl_rt.CreateProgram(&p, src, name, 0, NULL, NULL)))
		return sl__err(SLUICE_ECUDA, "nvrtcCreateProgram: %s", sl_rt.GetErrorString(rc));
	if ((rc = sl_rt.CompileProgram(p, 3, opts))) {
		size_t ln = 0;
		char *log = NULL;

		if (!sl_rt.GetProgramLogSize(p, &ln) && (log = malloc(ln + 1)) && !sl_rt.GetProgramLog(p, log))
			log[ln] = 0;
		rc = sl__err(SLUICE_ECUDA, "NVRTC could not compile %s for sm_%d%d: %s: %.300s", name, major, minor,
			     sl_rt.GetErrorString(rc), log ? log : "");
		free(log);
		sl_rt.DestroyProgram(&p);
		return rc;
	}
	rc = sl_rt.GetCUBINSize(p, n);
	if (!rc && !(*out = malloc(*n)))
		rc = -1;
	if (!rc && (rc = sl_rt.GetCUBIN(p, *out)))
		free(*out);
	sl_rt.DestroyProgram(&p);
	return rc ? sl__err(SLUICE_ECUDA, "NVRTC: the cubin of %s could not be had", name) : 0;
}

/* src compiled for g's architecture into a cubin (*out, malloc'ed, *n bytes). */
static int sl_compile(const struct sl__gpu *g, const char *src, const char *name, char **out, size_t *n)
{
	int major = 0, minor = 0;
	int rc = SL_CU(g->cu->DeviceGetAttribute(&major, SL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g->dev),
		       "cuDeviceGetAttribute");

	if (!rc)
		rc = SL_CU(g->cu->DeviceGetAttribute(&minor, SL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g->dev),
			   "cuDeviceGetAttribute");
	return rc ? rc : sl__nvrtc_compile(src, name, major, minor, out, n);
}

int sl__nvrtc_kernel(const struct sl__gpu *g, const char *src, const char *name, sl_CUfunction *fn)
{
	struct sl_kernel *k;
	char *cubin = NULL;
	size_t n = 0;
	int rc = 0;

	pthread_once(&sl_rt_once, sl_nvrtc_load);
	if (!sl_rt_ok)
		return sl__err(SLUICE_ENOGPU, "%s", sl_rt_why);
	pthread_mutex_lock(&sl_kernels_lock);
	for (k = sl_kernels; k; k = k->next)
		if (k->src == src && !strcmp(k->name, name) && k->ctx == g->ctx)
			break;
	if (!k) {
		sl_CUmodule mod = NULL;
		sl_CUfunction f = NULL;

		rc = sl_compile(g, src, name, &cubin, &n);
		if (!rc)
			rc = sl__gpu_bind(g);
		if (!rc)
			rc = SL_CU(g->cu->ModuleLoadData(&mod, cubin), "cuModuleLoadData");
		if (!rc && (rc = SL_CU(g->cu->ModuleGetFunction(&f, mod, name), "cuModuleGetFunction")))
			g->cu->ModuleUnload(mod);
		if (!rc && !(k = malloc(sizeof(*k)))) {
			g->cu->ModuleUnload(mod);
			rc = -ENOMEM;
		}
		if (!rc) {
			*k = (struct sl_kernel){ src, name, g->ctx, mod, f, sl_kernels };
			sl_kernels = k; /* kept for the process: the context's modules go with it */
		}
		free(cubin);
	}
	if (!rc)
		*fn = k->fn;
	pthread_mutex_unlock(&sl_kernels_lock);
	return rc;
}
