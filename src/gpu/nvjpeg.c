/*
 * The nvJPEG shim (gpu.h): libnvjpeg.so.13 of the CUDA toolkit, loaded at
 * run time and never linked (SLUICE_NVJPEG_LIB names another file).  The
 * few declarations sluice uses are its own (gpu.h), checked against
 * nvjpeg.h by tests/unit/t_cuda_decls.c wherever the toolkit is installed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "gpu/gpu.h"

static struct sl__nvjpeg_api sl_nj;
static const struct sl__nvjpeg_api *sl_nj_ok;
static char sl_nj_why[512] = "nvJPEG not loaded";
static pthread_once_t sl_nj_once = PTHREAD_ONCE_INIT;

static void sl_nvjpeg_load(void)
{
	const struct sl__sym syms[] = {
		{ (void **)&sl_nj.CreateEx, "nvjpegCreateEx" },
		{ (void **)&sl_nj.Destroy, "nvjpegDestroy" },
		{ (void **)&sl_nj.JpegStateCreate, "nvjpegJpegStateCreate" },
		{ (void **)&sl_nj.JpegStateDestroy, "nvjpegJpegStateDestroy" },
		{ (void **)&sl_nj.DecodeBatchedInitialize, "nvjpegDecodeBatchedInitialize" },
		{ (void **)&sl_nj.DecodeBatched, "nvjpegDecodeBatched" },
		{ (void **)&sl_nj.JpegStreamCreate, "nvjpegJpegStreamCreate" },
		{ (void **)&sl_nj.JpegStreamDestroy, "nvjpegJpegStreamDestroy" },
		{ (void **)&sl_nj.JpegStreamParseHeader, "nvjpegJpegStreamParseHeader" },
		{ (void **)&sl_nj.DecodeBatchedSupported, "nvjpegDecodeBatchedSupported" },
		{ (void **)&sl_nj.JpegStreamGetComponentsNum, "nvjpegJpegStreamGetComponentsNum" },
		{ (void **)&sl_nj.JpegStreamGetComponentDimensions, "nvjpegJpegStreamGetComponentDimensions" },
	};

	void *h = sl__dl_load_cuda("SLUICE_NVJPEG_LIB", "libnvjpeg.so.13", syms, sizeof(syms) / sizeof(syms[0]),
				   "the CUDA toolkit's, or pip install nvidia-nvjpeg-cu13; or set SLUICE_NVJPEG_LIB",
				   "nvJPEG of CUDA 11.0 or later wanted", sl_nj_why, sizeof(sl_nj_why));

	if (!h)
		return;
	*(void **)&sl_nj.DecodeBatchedPreAllocate = dlsym(h, "nvjpegDecodeBatchedPreAllocate");
	sl_nj_ok = &sl_nj;
}

const struct sl__nvjpeg_api *sl__nvjpeg(const char **why)
{
	pthread_once(&sl_nj_once, sl_nvjpeg_load);
	if (!sl_nj_ok && why)
		*why = sl_nj_why;
	return sl_nj_ok;
}

