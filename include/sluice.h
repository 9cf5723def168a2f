/*
 * sluice.h - move training data between storage and GPU memory at the
 * speed of the hardware.
 *
 * libsluice reads file ranges into GPU (or host) memory and writes GPU (or
 * host) memory back to files.  Underneath it picks an I/O backend at run
 * time (io_uring, a pread/pwrite thread pool, or cuFile when real
 * GPUDirect Storage is present), decides per request between O_DIRECT and
 * the page cache, and overlaps storage reads with host-to-device DMA
 * through a pool of pinned bounce buffers.  CUDA and cuFile are loaded with
 * dlopen() at run time: a machine without a GPU runs every host path.
 *
 * Conventions
 *   - Fallible functions return int (ssize_t for byte counts): >= 0 on
 *     success, -errno for operating-system errors, and SLUICE_E* codes (a
 *     reserved range far below -errno) for sluice's own.  sluice_strerror()
 *     names both.  More detail (backend, file, offset, foreign error code)
 *     comes from sluice_last_error_detail().
 *   - Constructors hand the object out through their first argument and
 *     return a code.  Every close and free function accepts NULL.
 *   - Every function is thread-safe unless its comment says otherwise.
 *     One engine may serve many threads at once.
 *   - Configuration: each setter has an environment variable SLUICE_*;
 *     sluice_config_new() reads the environment, setters override it.
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SLUICE_API __attribute__((visibility("default")))
#define SLUICE_WUR __attribute__((warn_unused_result))
#else
#define SLUICE_API
#define SLUICE_WUR
#endif

#define SLUICE_VERSION_MAJOR 0
#define SLUICE_VERSION_MINOR 1
#define SLUICE_VERSION_PATCH 0
#define SLUICE_VERSION_STRING "0.1.0"

/* Returns SLUICE_VERSION_STRING of the library actually loaded. */
SLUICE_API const char *sluice_version(void);

/* ================================================================
 * Errors
 * ================================================================ */

/*
 * sluice's own codes.  They sit far below any -errno value so the two never
 * collide.  Codes are only ever appended.
 */
enum sluice_error {
	SLUICE_EBASE = -100000,
	SLUICE_EINVAL_CONFIG = -100001, /* bad configuration value */
	SLUICE_ENOGPU = -100002,        /* no CUDA driver or no such GPU */
	SLUICE_ECUDA = -100003,         /* a CUDA driver call failed */
	SLUICE_ECUFILE = -100004,       /* a cuFile call failed */
	SLUICE_EBACKEND = -100005,      /* requested backend unusable */
	SLUICE_ERANGE = -100006,        /* range beyond the end of the file */
	SLUICE_ESHORT = -100007,        /* file shrank under a transfer */
	SLUICE_EVERIFY = -100008,       /* data verification failed */
	SLUICE_ENOTGPU = -100009,       /* pointer is not GPU memory */
	SLUICE_ECANCELED = -100010,     /* transfer abandoned after an error */
	SLUICE_ELAST = -100011,
};

/*
 * Returns a static English sentence for any code this library returns:
 * 0, -errno or SLUICE_E*.  Never NULL.
 */
SLUICE_API const char *sluice_strerror(int code);

/*
 * Returns a sentence describing the last error raised by the calling
 * thread inside libsluice (backend, foreign code and its name, file,
 * offset), or "" if none.  The string is thread-local and valid until the
 * calling thread's next libsluice call.
 */
SLUICE_API const char *sluice_last_error_detail(void);

/* ================================================================
 * Configuration
 * ================================================================ */

struct sluice_config;

/* Which I/O backend moves bytes between storage and memory. */
enum sluice_backend {
	SLUICE_BACKEND_AUTO = 0, /* best usable: gds (only real GDS), uring, psync */
	SLUICE_BACKEND_URING = 1,  /* io_uring through liburing */
	SLUICE_BACKEND_PSYNC = 2,  /* pread/pwrite from worker threads */
	SLUICE_BACKEND_GDS = 3,    /* cuFile; forced use allows compat mode */
};

/* Whether storage I/O bypasses the page cache. */
enum sluice_direct {
	SLUICE_DIRECT_AUTO = 0,   /* per request: O_DIRECT unless data is cached */
	SLUICE_DIRECT_ALWAYS = 1, /* O_DIRECT wherever the filesystem allows */
	SLUICE_DIRECT_NEVER = 2,  /* buffered I/O through the page cache */
};

/* How bytes cross between host and GPU. */
enum sluice_staging {
	SLUICE_STAGING_PINNED = 0,   /* pinned bounce buffers, async DMA */
	SLUICE_STAGING_PAGEABLE = 1, /* baseline: pageable buffers, sync copy */
};

/*
 * Creates a configuration holding the defaults overridden by the SLUICE_*
 * environment variables named at each setter.  A malformed variable fails
 * with SLUICE_EINVAL_CONFIG and a detail naming the variable.
 * Free with sluice_config_free().
 */
SLUICE_API SLUICE_WUR int sluice_config_new(struct sluice_config **out);
SLUICE_API void sluice_config_free(struct sluice_config *cfg);

/*
 * Setters.  Each returns 0 or SLUICE_EINVAL_CONFIG for an out-of-range
 * value.  Not thread-safe against use of the same config elsewhere; an
 * engine copies the config at open, so later changes do not affect it.
 */
/* SLUICE_BACKEND=auto|uring|psync|gds */
SLUICE_API SLUICE_WUR int sluice_config_set_backend(struct sluice_config *cfg,
						    enum sluice_backend b);
/* SLUICE_DIRECT=auto|always|never */
SLUICE_API SLUICE_WUR int sluice_config_set_direct(struct sluice_config *cfg,
						   enum sluice_direct d);
/* SLUICE_STAGING=pinned|pageable */
SLUICE_API SLUICE_WUR int sluice_config_set_staging(struct sluice_config *cfg,
						    enum sluice_staging s);
/* SLUICE_THREADS: worker threads, 1..256 (default: min(cpus, 8)) */
SLUICE_API SLUICE_WUR int sluice_config_set_threads(struct sluice_config *cfg,
						    unsigned n);
/* SLUICE_QUEUE_DEPTH: I/Os in flight per worker, 1..256 (default 4) */
SLUICE_API SLUICE_WUR int sluice_config_set_queue_depth(struct sluice_config *cfg,
							unsigned n);
/*
 * SLUICE_MAX_TRANSFER_SIZE: the largest single storage I/O and bounce
 * chunk, 4 KiB..1 GiB, a multiple of 4 KiB (default 8 MiB).  Sizes accept
 * K, M, G suffixes (powers of 1024).
 */
SLUICE_API SLUICE_WUR int sluice_config_set_max_transfer_size(struct sluice_config *cfg,
							      size_t n);
/*
 * SLUICE_BUFFER_POOL_SIZE: pinned bytes shared by the workers (default:
 * threads * queue_depth * max_transfer_size).  If smaller, each worker
 * gets fewer slots (at least 2); a pool that RLIMIT_MEMLOCK or the driver
 * refuses to pin is used unpinned with a warning.
 */
SLUICE_API SLUICE_WUR int sluice_config_set_buffer_pool_size(struct sluice_config *cfg,
							     size_t n);
/* SLUICE_DEVICE_IDS: GPU ordinal used for transfers, e.g. "0" (default 0) */
SLUICE_API SLUICE_WUR int sluice_config_set_device(struct sluice_config *cfg, int gpu);
/* SLUICE_SQPOLL=0|1: io_uring kernel submission polling (default 0) */
SLUICE_API SLUICE_WUR int sluice_config_set_sqpoll(struct sluice_config *cfg, int on);
/* SLUICE_GPU=0|1: 0 never loads CUDA, for host-only use (default 1) */
SLUICE_API SLUICE_WUR int sluice_config_set_gpu(struct sluice_config *cfg, int on);

/*
 * Logging goes to stderr as "sluice[tag] level: message".
 * SLUICE_LOG=error|warn|info|debug (default warn).
 */
enum sluice_log_level {
	SLUICE_LOG_ERROR = 0,
	SLUICE_LOG_WARN = 1,
	SLUICE_LOG_INFO = 2,
	SLUICE_LOG_DEBUG = 3,
};
SLUICE_API void sluice_set_log_level(enum sluice_log_level level);

/* ================================================================
 * Engine
 * ================================================================ */

struct sluice_engine;

/*
 * Opens an engine: probes the backends, starts the worker threads, loads
 * CUDA when present and allocates the pinned pool.  cfg may be NULL for
 * defaults plus environment.  Returns 0, -errno, SLUICE_EBACKEND when a
 * forced backend is unusable (the detail says why), or SLUICE_ENOGPU when
 * the configured GPU does not exist.  A missing CUDA driver is not an
 * error: the engine then moves host memory only.
 * Free with sluice_engine_close().
 */
SLUICE_API SLUICE_WUR int sluice_engine_open(struct sluice_engine **out,
					     const struct sluice_config *cfg);
/* Waits for outstanding transfers, then frees everything.  NULL is a no-op. */
SLUICE_API void sluice_engine_close(struct sluice_engine *eng);

/* Facts about an open engine, for reports and `sluice doctor`. */
struct sluice_engine_info {
	const char *backend;      /* name of the backend in use */
	int gpu;                  /* GPU ordinal, or -1 without CUDA */
	char gpu_name[96];        /* device name, "" without CUDA */
	int gds;                  /* 1 if cuFile runs with nvidia-fs */
	unsigned threads;
	unsigned queue_depth;
	size_t max_transfer_size;
	size_t buffer_pool_size;  /* bytes actually allocated */
	int pool_pinned;          /* 1 if registered with the CUDA driver */
	int uring_fixed_buffers;  /* 1 if registered with io_uring */
	/*
	 * One line per backend that was probed and found unusable, saying
	 * why, separated by '\n'.  Valid while the engine is open.
	 */
	const char *unusable;
};
SLUICE_API void sluice_engine_get_info(const struct sluice_engine *eng,
				       struct sluice_engine_info *info);

/* ================================================================
 * Files
 * ================================================================ */

struct sluice_file;

enum sluice_open_flags {
	SLUICE_RDONLY = 0,
	SLUICE_RDWR = 1,   /* read and write an existing file */
	SLUICE_CREATE = 2, /* with SLUICE_RDWR: create if missing */
};

/*
 * Opens path for transfers through eng.  Both a buffered and, where the
 * filesystem allows, an O_DIRECT descriptor are kept so each request can
 * take either.  Returns 0 or -errno (the detail names the path).
 * The file must be closed before its engine.
 */
SLUICE_API SLUICE_WUR int sluice_file_open(struct sluice_file **out,
					   struct sluice_engine *eng,
					   const char *path, int flags);
SLUICE_API void sluice_file_close(struct sluice_file *f);
/* Size in bytes when last looked at (open, or after a write grew it). */
SLUICE_API uint64_t sluice_file_size(const struct sluice_file *f);
/* 1 if the filesystem accepted O_DIRECT for this file. */
SLUICE_API int sluice_file_direct_ok(const struct sluice_file *f);

/* ================================================================
 * Transfers
 * ================================================================ */

/*
 * What a transfer did.  Every transfer call takes an optional report
 * (NULL to skip) and fills it whether or not it succeeded.
 */
struct sluice_xfer_report {
	uint64_t bytes;          /* payload bytes moved */
	uint64_t bytes_direct;   /* of which through O_DIRECT (or GDS) */
	uint64_t bytes_buffered; /* of which through the page cache */
	uint64_t ios;            /* storage I/Os issued (after coalescing) */
	double seconds;          /* wall time of the call */
	/*
	 * The path actually taken, e.g. "uring:direct>pinned>h2d" or
	 * "psync:buffered>host" or "gds>gpu".  Several parts joined by '+'
	 * when requests took different paths.
	 */
	char path[96];
};

/*
 * One piece of a batched transfer: len bytes at offset of file to or from
 * buf.  buf may be host memory or GPU memory of the engine's device; the
 * kind is detected from the pointer.
 */
struct sluice_range {
	struct sluice_file *file;
	uint64_t offset;
	size_t len;
	void *buf;
};

/*
 * GPU memory and synchronous transfers: sluice's copy streams do not wait
 * for work on the caller's streams, so GPU work that still uses dst (or
 * writes src) MUST have finished before a synchronous call; to order a
 * transfer after queued work instead, use sluice_read_async() on the stream.
 *
 * Reads len bytes at offset of f into dst (host or GPU memory), blocking
 * until the bytes are in place.  Returns len, SLUICE_ERANGE if the range
 * passes the end of the file, SLUICE_ESHORT if the file shrank during the
 * read, -errno, or SLUICE_ECUDA.  dst is only used during the call.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_file_read(struct sluice_file *f, uint64_t offset,
					       size_t len, void *dst,
					       struct sluice_xfer_report *rep);
/*
 * Writes len bytes from src (host or GPU memory) at offset of f (opened
 * SLUICE_RDWR); not durable until sluice_file_sync().  Returns len or an
 * error as sluice_file_read().
 */
SLUICE_API SLUICE_WUR ssize_t sluice_file_write(struct sluice_file *f, uint64_t offset,
						size_t len, const void *src,
						struct sluice_xfer_report *rep);
/* fdatasync()s f.  Returns 0 or -errno. */
SLUICE_API SLUICE_WUR int sluice_file_sync(struct sluice_file *f);

/*
 * Batched reads and writes: n ranges, possibly in different files, run as
 * one job.  Neighbouring ranges of one file are coalesced into single
 * storage I/Os of at most max_transfer_size, then scattered to their
 * buffers.  Returns the total bytes or the first error; on error some
 * ranges may have completed.  The ranges array is only read during the
 * call.  Overlapping destination buffers give undefined contents.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_read_batch(struct sluice_engine *eng,
						const struct sluice_range *ranges,
						size_t n, struct sluice_xfer_report *rep);
SLUICE_API SLUICE_WUR ssize_t sluice_write_batch(struct sluice_engine *eng,
						 const struct sluice_range *ranges,
						 size_t n, struct sluice_xfer_report *rep);

/*
 * The object store API shape: whole-object helpers.
 *
 * sluice_read_to_gpu() reads len bytes at offset of path into dst.
 *
 * sluice_write_from_gpu() writes len bytes of src as the whole new content
 * of path, durably and atomically: a temporary file beside it (O_DIRECT
 * where possible, space reserved first), fdatasync, rename over path,
 * fsync of the directory.  A crash or kill at any point leaves either the
 * previous file or the complete new one under path; on error (-ENOSPC,
 * -EIO, -EFBIG ...) the temporary file is removed and path is untouched.
 * Despite the names, both also accept host memory.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_read_to_gpu(struct sluice_engine *eng, const char *path,
						 uint64_t offset, size_t len, void *dst,
						 struct sluice_xfer_report *rep);
SLUICE_API SLUICE_WUR ssize_t sluice_write_from_gpu(struct sluice_engine *eng,
						    const char *path, const void *src,
						    size_t len,
						    struct sluice_xfer_report *rep);

/* ================================================================
 * Asynchronous transfers ordered on a CUDA stream
 * ================================================================ */

struct sluice_future;

/*
 * Enqueues a read of [offset, offset+len) of f into dst on the caller's
 * CUDA stream (a CUstream; NULL is the legacy default stream): the read
 * starts once the work enqueued before it on the stream has finished, and
 * work enqueued after it waits for the bytes.  Storage I/O and DMA still
 * overlap inside the engine when GDS is absent.  f and dst MUST stay valid
 * until the future completes.  Returns 0 and a future to wait on and free,
 * or an error at submission (SLUICE_ENOGPU without CUDA).
 */
SLUICE_API SLUICE_WUR int sluice_read_async(struct sluice_file *f, uint64_t offset,
					    size_t len, void *dst, void *stream,
					    struct sluice_future **out);
/* The same for a write of src to f, as sluice_file_write(). */
SLUICE_API SLUICE_WUR int sluice_write_async(struct sluice_file *f, uint64_t offset,
					     size_t len, const void *src, void *stream,
					     struct sluice_future **out);
/*
 * Blocks until the transfer has finished on the host side and returns its
 * result (bytes or error); the stream's later work is released at the same
 * moment.  May be called more than once.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_future_wait(struct sluice_future *fut,
						 struct sluice_xfer_report *rep);
/* Waits if needed, then frees.  NULL is a no-op. */
SLUICE_API void sluice_future_free(struct sluice_future *fut);

/* ================================================================
 * Statistics
 * ================================================================ */

/*
 * Per-I/O latency and volume since the engine opened or the last reset.
 * An I/O's latency runs from its submission to storage to the moment its
 * bytes are in the destination (DMA included).
 */
struct sluice_stats {
	uint64_t ios;
	uint64_t bytes;
	double lat_avg_us;
	double lat_p50_us;
	double lat_p99_us;
	double lat_p999_us;
	double lat_max_us;
};
SLUICE_API void sluice_engine_stats(struct sluice_engine *eng, struct sluice_stats *st);
SLUICE_API void sluice_engine_stats_reset(struct sluice_engine *eng);

/* ================================================================
 * GPU helpers
 * ================================================================ */

/* Number of CUDA devices, 0 without a driver.  Never fails. */
SLUICE_API int sluice_gpu_count(void);
/*
 * Device memory on the engine's GPU, for tools and tests.  Returns 0,
 * SLUICE_ENOGPU or SLUICE_ECUDA (-ENOMEM folded into it; see detail).
 * Free with sluice_gpu_free().
 */
SLUICE_API SLUICE_WUR int sluice_gpu_alloc(struct sluice_engine *eng, size_t n, void **out);
SLUICE_API void sluice_gpu_free(struct sluice_engine *eng, void *p);
/* Copy between any two of host and GPU memory; complete on return. */
SLUICE_API SLUICE_WUR int sluice_gpu_copy(struct sluice_engine *eng, void *dst,
					  const void *src, size_t n);
/* 1 if p points into CUDA device memory, else 0. */
SLUICE_API int sluice_is_gpu_ptr(struct sluice_engine *eng, const void *p);

/* ================================================================
 * Utilities
 * ================================================================ */

/*
 * Parses a byte size: digits with an optional K, M, G or T suffix (powers
 * of 1024, optional trailing "iB" or "B").  Returns 0 or SLUICE_EINVAL_CONFIG
 * for anything else, including overflow.
 */
SLUICE_API SLUICE_WUR int sluice_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_H */
