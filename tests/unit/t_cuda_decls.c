/*
 * Checks sluice's own CUDA and cuFile declarations (src/gpu/cuda_decls.h)
 * against the real headers: values, sizes, field offsets, and the
 * versioned symbol names cuda.h maps the plain names to (sluice dlsym()s
 * those names directly).  Built only where the CUDA toolkit is installed;
 * the checks are compile-time, so a mismatch fails the build.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>
#ifdef SL_HAVE_CUFILE_H
#include <cufile.h>
#endif
#ifdef SL_HAVE_NVJPEG_H
#include <nvjpeg.h>
#endif

#include "gpu/cuda_decls.h"
#ifdef SL_HAVE_NVJPEG_H
#include "gpu/gpu.h"
#endif

#define SAME(a, b) _Static_assert((long long)(a) == (long long)(b), #a " != " #b)

SAME(SL_CUDA_SUCCESS, CUDA_SUCCESS);
SAME(SL_CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME(SL_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(SL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(SL_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
SAME(SL_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(SL_CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE);
SAME(SL_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
SAME(SL_CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_DEVICEMAP);
SAME(SL_CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ);
SAME(SL_CU_EVENT_BLOCKING_SYNC, CU_EVENT_BLOCKING_SYNC);
SAME(SL_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(SL_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
SAME(SL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME(SL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
#ifdef SL_HAVE_NVJPEG_H
SAME(SL_NVJPEG_BACKEND_DEFAULT, NVJPEG_BACKEND_DEFAULT);
SAME(SL_NVJPEG_BACKEND_HARDWARE, NVJPEG_BACKEND_HARDWARE);
SAME(SL_NVJPEG_OUTPUT_RGBI, NVJPEG_OUTPUT_RGBI);
SAME(SL_NVJPEG_OUTPUT_UNCHANGED, NVJPEG_OUTPUT_UNCHANGED);
SAME(SL_NVJPEG_CSS_444, NVJPEG_CSS_444);
SAME(SL_NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION);
SAME(SL_NVJPEG_STATUS_ARCH_MISMATCH, NVJPEG_STATUS_ARCH_MISMATCH);
SAME(sizeof(struct sl_nvjpegImage), sizeof(nvjpegImage_t));
SAME(offsetof(struct sl_nvjpegImage, pitch), offsetof(nvjpegImage_t, pitch));
#endif
SAME(sizeof(sl_CUresult), sizeof(CUresult));
SAME(sizeof(sl_CUdevice), sizeof(CUdevice));
SAME(sizeof(sl_CUdeviceptr), sizeof(CUdeviceptr));
SAME(sizeof(sl_CUstream), sizeof(CUstream));

#ifdef SL_HAVE_CUFILE_H
SAME(SL_CU_FILE_HANDLE_TYPE_OPAQUE_FD, CU_FILE_HANDLE_TYPE_OPAQUE_FD);
SAME(SL_CU_FILE_SUCCESS, CU_FILE_SUCCESS);
SAME(sizeof(sl_CUfileError_t), sizeof(CUfileError_t));
SAME(offsetof(sl_CUfileError_t, cu_err), offsetof(CUfileError_t, cu_err));
SAME(sizeof(sl_CUfileDescr_t), sizeof(CUfileDescr_t));
SAME(offsetof(sl_CUfileDescr_t, handle), offsetof(CUfileDescr_t, handle));
SAME(offsetof(sl_CUfileDescr_t, fs_ops), offsetof(CUfileDescr_t, fs_ops));
SAME(offsetof(sl_CUfileDrvProps_t, nvfs.major_version), offsetof(CUfileDrvProps_t, nvfs.major_version));
SAME(offsetof(sl_CUfileDrvProps_t, nvfs.minor_version), offsetof(CUfileDrvProps_t, nvfs.minor_version));
_Static_assert(sizeof(CUfileDrvProps_t) <= sizeof(sl_CUfileDrvProps_t), "CUfileDrvProps_t outgrew our buffer");
#endif

#define XSTR(x) STR(x)
#define STR(x) #x

int main(void)
{
	/* The names src/gpu/cuda.c looks up must be the ones cuda.h selects. */
	static const char *const pairs[][2] = {
		{ XSTR(cuMemAlloc), "cuMemAlloc_v2" },
		{ XSTR(cuMemFree), "cuMemFree_v2" },
		{ XSTR(cuMemHostRegister), "cuMemHostRegister_v2" },
		{ XSTR(cuMemcpyHtoDAsync), "cuMemcpyHtoDAsync_v2" },
		{ XSTR(cuMemcpyDtoHAsync), "cuMemcpyDtoHAsync_v2" },
		{ XSTR(cuMemcpyHtoD), "cuMemcpyHtoD_v2" },
		{ XSTR(cuMemcpyDtoH), "cuMemcpyDtoH_v2" },
		{ XSTR(cuStreamDestroy), "cuStreamDestroy_v2" },
		{ XSTR(cuEventDestroy), "cuEventDestroy_v2" },
		{ XSTR(cuDevicePrimaryCtxRelease), "cuDevicePrimaryCtxRelease_v2" },
		{ XSTR(cuMemcpy), "cuMemcpy" },
		{ XSTR(cuStreamWaitEvent), "cuStreamWaitEvent" },
		{ XSTR(cuEventRecord), "cuEventRecord" },
		{ XSTR(cuMemHostGetDevicePointer), "cuMemHostGetDevicePointer_v2" },
		{ XSTR(cuStreamWaitValue32), "cuStreamWaitValue32_v2" },
	};
	int bad = 0;

	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
		if (strcmp(pairs[i][0], pairs[i][1])) {
			fprintf(stderr, "cuda.h maps to %s, sluice loads %s\n", pairs[i][0], pairs[i][1]);
			bad = 1;
		}
#ifdef SL_HAVE_NVJPEG_H
	printf("t_cuda_decls: nvjpeg.h matches\n");
#endif
#ifdef SL_HAVE_CUFILE_H
	printf("t_cuda_decls: cuda.h and cufile.h match\n");
#else
	printf("t_cuda_decls: cuda.h matches; cufile.h not installed, its checks not compiled\n");
#endif
	return bad;
}
