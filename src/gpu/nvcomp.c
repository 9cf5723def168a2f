/*
 * The nvCOMP shim (gpu.h): libnvcomp.so.6, loaded at run time and never
 * linked, for decoding zstd blocks in GPU memory.  It comes with the
 * nvidia-libnvcomp-cu13 wheel (nvidia/libnvcomp/lib64), or the CUDA
 * toolkit's; SLUICE_NVCOMP_LIB names the file when the loader's path does
 * not reach it (the Python package sets it from the wheel).  Our own
 * declarations of the few types (nvcomp/zstd.h, nvcomp/shared_types.h of
 * 6.0): the options are 64 bytes passed by value.
 */
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
	const struct sl__sym syms[] = {
		{ (void **)&sl_nc.ZstdGetRequiredAlignments, "nvcompBatchedZstdDecompressGetRequiredAlignments" },
		{ (void **)&sl_nc.ZstdGetTempSize, "nvcompBatchedZstdDecompressGetTempSize" },
		{ (void **)&sl_nc.ZstdDecompressAsync, "nvcompBatchedZstdDecompressAsync" },
	};

	if (!sl__dl_load(lib && *lib ? lib : "libnvcomp.so.6", syms, sizeof(syms) / sizeof(syms[0]),
			 "pip install nvidia-libnvcomp-cu13, or set SLUICE_NVCOMP_LIB", "nvCOMP 6 wanted", sl_nc_why,
			 sizeof(sl_nc_why)))
		return;
	sl_nc_ok = &sl_nc;
}

const struct sl__nvcomp_api *sl__nvcomp(const char **why)
{
	pthread_once(&sl_nc_once, sl_nvcomp_load);
	if (!sl_nc_ok && why)
		*why = sl_nc_why;
	return sl_nc_ok;
}
