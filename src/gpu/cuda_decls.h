/*
 * Our own minimal declarations of the CUDA driver API and cuFile types.
 * sluice never includes cuda.h or cufile.h: both libraries are dlopen()ed.
 * tests/unit/t_cuda_decls.c checks every value and layout here against the
 * real headers wherever the CUDA toolkit is installed; change both together.
 */
#ifndef SL_CUDA_DECLS_H
#define SL_CUDA_DECLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int sl_CUresult;
typedef int sl_CUdevice;
typedef unsigned long long sl_CUdeviceptr;
typedef struct CUctx_st *sl_CUcontext;
typedef struct CUstream_st *sl_CUstream;
typedef struct CUevent_st *sl_CUevent;
typedef void (*sl_CUhostFn)(void *user);
typedef struct CUmod_st *sl_CUmodule;
typedef struct CUfunc_st *sl_CUfunction;

#define SL_CUDA_SUCCESS 0
#define SL_CUDA_ERROR_INVALID_CONTEXT 201
#define SL_CUDA_ERROR_NOT_READY 600
#define SL_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define SL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define SL_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define SL_CU_MEMORYTYPE_HOST 1
#define SL_CU_MEMORYTYPE_DEVICE 2
#define SL_CU_MEMHOSTREGISTER_PORTABLE 1
#define SL_CU_MEMHOSTREGISTER_DEVICEMAP 2
#define SL_CU_MEMHOSTREGISTER_READ_ONLY 8
#define SL_CU_STREAM_WAIT_VALUE_GEQ 0
#define SL_CU_STREAM_NON_BLOCKING 1
#define SL_CU_EVENT_BLOCKING_SYNC 1
#define SL_CU_EVENT_DISABLE_TIMING 2
#define SL_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define SL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define SL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76

/* cuFile (libcufile.so.0). */
#define SL_CU_FILE_HANDLE_TYPE_OPAQUE_FD 1
#define SL_CU_FILE_SUCCESS 0
#define SL_CU_FILE_ERROR_BASE 5000

typedef void *sl_CUfileHandle_t;

typedef struct {
	int err;    /* CUfileOpError */
	int cu_err; /* sl_CUresult */
} sl_CUfileError_t;

typedef struct {
	int type; /* CUfileFileHandleType */
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} sl_CUfileDescr_t;

/*
 * CUfileDrvProps_t is large and grows between releases; sluice reads only
 * nvfs.major_version and nvfs.minor_version, its first two members, and
 * hands the library a buffer larger than any released version.
 */
typedef union {
	struct {
		unsigned int major_version;
		unsigned int minor_version;
	} nvfs;
	unsigned char raw[4096];
} sl_CUfileDrvProps_t;

#endif
