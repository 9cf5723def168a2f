/*
 * The nvCOMP shim (gpu.h): libnvcomp.so.6, loaded at run time and never
 * linked, for decoding zstd blocks in GPU memory.  It comes with the
 * nvidia-libnvcomp-cu13 wheel (nvidia/libnvcomp/lib64), or the CUDA
 * toolkit's; SLUICE_NVCOMP_LIB names the file when the loader's path does
 * not reach it (the Python package sets it from the wheel).  Our own
 * declarations of the few types (nvcomp/zstd.h, nvcomp/shared_types.h of
 * 6.0): the options are 64 bytes passed by value.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"

static struct sl__nvcomp_api sl_nc;
static const struct sl__nvcomp_api *sl_nc_ok;
static char sl_nc_why[512] = "nvCOMP not loaded";
static pthread_once_t sl_nc_once = PTHREAD_ONCE_INIT;

static void sl_nvcomp_load(void)
{
	const char *lib = sl__setting("SLUICE_NVCOMP_LIB");
	void *h = dlopen(lib && *lib ? lib : "libnvcomp.so.6", RTLD_NOW | RTLD_LOCAL);
	struct {
		void **slot;
		const char *name;
	} syms[] = {
		{ (void **)&sl_nc.ZstdGetRequiredAlignments, "nvcompBatchedZstdDecompressGetRequiredAlignments" },
		{ (void **)&sl_nc.ZstdGetTempSize, "nvcompBatchedZstdDecompressGetTempSize" },
		{ (void **)&sl_nc.ZstdDecompressAsync, "nvcompBatchedZstdDecompressAsync" },
	};

	if (!h) {
		snprintf(sl_nc_why, sizeof(sl_nc_why), "%s not loadable (pip install nvidia-libnvcomp-cu13, or set "
			 "SLUICE_NVCOMP_LIB): %s", lib && *lib ? lib : "libnvcomp.so.6", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].slot = dlsym(h, syms[i].name);
		if (!*syms[i].slot) {
			snprintf(sl_nc_why, sizeof(sl_nc_why), "libnvcomp lacks %s (nvCOMP 6 wanted)", syms[i].name);
			return;
		}
	}
	sl_nc_ok = &sl_nc;
}

const struct sl__nvcomp_api *sl__nvcomp(const char **why)
{
	pthread_once(&sl_nc_once, sl_nvcomp_load);
	if (!sl_nc_ok && why)
		*why = sl_nc_why;
	return sl_nc_ok;
}
