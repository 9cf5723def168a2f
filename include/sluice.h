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
 *   - Structs that grow (options and reports) start with `size_t size`:
 *     set it with the struct's SLUICE_*_INIT (or sizeof).  The library
 *     reads or writes only the fields that size covers, so a program
 *     built against an older sluice keeps working with a newer one.  A
 *     struct whose size is too small is refused (SLUICE_EINVAL_CONFIG);
 *     options from a newer sluice than the library must leave the fields
 *     it does not know 0 (-E2BIG otherwise).
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
	SLUICE_EFORMAT = -100011,       /* malformed or inconsistent data file */
	SLUICE_ECRC = -100012,          /* checksum mismatch: a record, a block or a file */
	SLUICE_ERESOLVE = -100013,      /* a host name does not resolve */
	SLUICE_ELAST = -100014,
};

/*
 * Returns a static English sentence for any code this library returns:
 * 0, -errno or SLUICE_E*.  Never NULL.
 */
SLUICE_API const char *sluice_strerror(int code);

/*
 * Returns the code's name, for programs that tell errors apart: "ENOENT"
 * for -ENOENT, "SLUICE_ECRC" for SLUICE_ECRC, "" for 0, a positive value or
 * a code it does not know.  Static; never NULL.
 */
SLUICE_API const char *sluice_error_name(int code);

/*
 * Returns a sentence describing the last error raised by the calling
 * thread inside libsluice (backend, foreign code and its name, file,
 * offset), or "" if none.  The string is thread-local and valid until the
 * calling thread's next libsluice call.
 */
SLUICE_API const char *sluice_last_error_detail(void);

/*
 * Writes into out (cap bytes, cut and terminated there; nothing where cap
 * is 0) url as every message of sluice names it: a URL (a text holding
 * "://") without its query and fragment (a presigned URL's query is a
 * credential) and with the password of its userinfo hidden
 * (https://user:***@host/...); a path as it is.  For callers' own
 * messages, so they leak no more than sluice's do.  url MUST NOT be NULL.
 * Thread-safe: it keeps no state.
 */
SLUICE_API void sluice_url_redact(const char *url, char *out, size_t cap);

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
 * settings named at each setter: the environment's variables, else the
 * settings file's (sluice_settings_path; `sluice tune` writes it).  A
 * malformed value fails with SLUICE_EINVAL_CONFIG and a detail naming the
 * setting and where it came from; so does a settings file that does not
 * parse (the detail names the file).  Free with sluice_config_free().
 */
SLUICE_API SLUICE_WUR int sluice_config_new(struct sluice_config **out);
SLUICE_API void sluice_config_free(struct sluice_config *cfg);

/*
 * The settings file's path into buf (cap bytes): SLUICE_CONFIG, else
 * $XDG_CONFIG_HOME/sluice/sluice.conf, else ~/.config/sluice/sluice.conf.
 * It holds one section, [sluice], of SLUICE_* names without the prefix in
 * lower case ("threads = 8"); the environment wins over it.  Returns 0,
 * -ENOENT when there is none (SLUICE_CONFIG="", or no HOME), or
 * -ENAMETOOLONG.  The file itself need not exist.
 */
SLUICE_API SLUICE_WUR int sluice_settings_path(char *buf, size_t cap);

/*
 * The settings registry: every SLUICE_* setting, its type, allowed values,
 * default, scope and help, and its value in force with where it came from.
 * Scope "engine": a field of struct sluice_config (sluice_config_set and the
 * typed setters below); "process": read where used (S3, the cache, logs,
 * the loader's stats), checked by sluice_config_new(); "environment": the
 * environment's alone, not the settings file's.  `sluice info --settings`
 * prints the table.  The strings are static, but value, which stays valid
 * for the process.
 */
struct sluice_setting {
	const char *name;   /* "SLUICE_THREADS"; the settings file's key is "threads" */
	const char *type;   /* word, uint, size, bool, seconds, path, list */
	const char *scope;  /* engine, process, environment */
	const char *words;  /* a word's choices, "auto|uring|psync|gds"; NULL otherwise */
	const char *def;    /* the default as written; "" where the machine decides (help says how) */
	const char *help;
	const char *value;  /* in force: the environment's, else the file's; NULL: the default */
	const char *origin; /* "the environment", the settings file's path, or "the default" */
};
/* The i-th setting (from 0); 0, or -ENOENT past the last. */
SLUICE_API SLUICE_WUR int sluice_setting_get(unsigned i, struct sluice_setting *out);
/* A setting's value in force by name ("SLUICE_THREADS" or "threads"), as text; NULL: its default. */
SLUICE_API const char *sluice_setting(const char *name);
/*
 * Sets an engine's setting by name ("SLUICE_THREADS" or "threads") from
 * its text, as the environment would: 0, or SLUICE_EINVAL_CONFIG naming the
 * setting and what it wants (a process setting is refused: it is read from
 * the environment or the settings file).  The typed setters below do the
 * same for each.
 */
SLUICE_API SLUICE_WUR int sluice_config_set(struct sluice_config *cfg, const char *name, const char *value);
/*
 * Writes names[i] = values[i] (n of them) into the settings file at path
 * (NULL: sluice_settings_path's) in its [sluice] section, with a "# note" line above them, keeping its other
 * lines; each value is checked as the reader checks it first, and the file
 * is replaced atomically.  What `sluice tune` writes with.  0 or an error
 * naming the setting or the file.
 */
SLUICE_API SLUICE_WUR int sluice_settings_write(const char *path, const char *const *names,
						const char *const *values, unsigned n, const char *note);

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
/* SLUICE_THREADS: worker threads, 1..256 (default: min(cpus, 16)) */
SLUICE_API SLUICE_WUR int sluice_config_set_threads(struct sluice_config *cfg,
						    unsigned n);
/*
 * SLUICE_QUEUE_DEPTH: I/Os in flight per worker, 1..256 (default 4).  Reads
 * and writes through the page cache keep at most 2 in flight: each is a CPU
 * copy, and more only spread the copies over more pinned memory.
 */
SLUICE_API SLUICE_WUR int sluice_config_set_queue_depth(struct sluice_config *cfg,
							unsigned n);
/*
 * SLUICE_MAX_TRANSFER_SIZE: the largest single storage I/O and bounce
 * chunk, 4 KiB..1 GiB, a multiple of 4 KiB (default 4 MiB).  Sizes accept
 * K, M, G suffixes (powers of 1024).
 */
SLUICE_API SLUICE_WUR int sluice_config_set_max_transfer_size(struct sluice_config *cfg,
							      size_t n);
/*
 * SLUICE_READ_GAP: reads of ranges less than this many bytes apart in a
 * file are one storage I/O that reads the gap too (0..64 MiB, default 64
 * KiB), where the gap is no longer than the range after it (or 4 KiB): at
 * most half of an I/O is bytes not asked for.  0 reads only the ranges'
 * own bytes.  Files read through the page
 * cache (mostly cached, no O_DIRECT, or SLUICE_DIRECT=never) read no gap:
 * there it would be a copy, not an I/O saved.  Reports' bytes_storage says
 * what the I/Os spanned.
 */
SLUICE_API SLUICE_WUR int sluice_config_set_read_gap(struct sluice_config *cfg, size_t n);
/*
 * SLUICE_BUFFER_POOL_SIZE: pinned bytes shared by the workers (default:
 * threads * queue_depth * max_transfer_size).  If smaller, each worker
 * gets fewer slots (at least 2); a pool that RLIMIT_MEMLOCK or the driver
 * refuses to pin is used unpinned with a warning.
 */
SLUICE_API SLUICE_WUR int sluice_config_set_buffer_pool_size(struct sluice_config *cfg,
							     size_t n);
/* The GPU used for transfers (default 0): sluice_config_set_device_ids(cfg, &gpu, 1). */
SLUICE_API SLUICE_WUR int sluice_config_set_device(struct sluice_config *cfg, int gpu);
/*
 * SLUICE_DEVICE_IDS: the GPUs one engine serves, e.g. "0" or "0,1,2,3"
 * (default 0; up to SLUICE_MAX_DEVICES, no repeats).  The workers are split
 * among them, each on its GPU's NUMA node with its own stream and slots;
 * a read into a listed GPU's memory (or a write from it) is done by that
 * GPU's workers, over its own PCIe link.  The first id is the engine's GPU
 * for everything else (sluice_gpu_alloc, loaders, the info's gpu).
 */
#define SLUICE_MAX_DEVICES 16
SLUICE_API SLUICE_WUR int sluice_config_set_device_ids(struct sluice_config *cfg, const int *ids, unsigned n);
/*
 * SLUICE_ENABLE_P2P=0|1 (default 1): GPU-to-GPU copies (sluice_read_broadcast)
 * peer to peer where the GPUs allow it; 0 leaves peer access off, so the
 * driver stages them through host memory.
 */
SLUICE_API SLUICE_WUR int sluice_config_set_enable_p2p(struct sluice_config *cfg, int on);
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
 * Utilities
 * ================================================================ */

/*
 * Parses a byte size: digits with an optional K, M, G or T suffix (powers
 * of 1024, optional trailing "iB" or "B").  Returns 0 or SLUICE_EINVAL_CONFIG
 * for anything else, including overflow.
 */
SLUICE_API SLUICE_WUR int sluice_parse_size(const char *s, uint64_t *out);

/*
 * For bindings: sizeof(struct NAME) of a public struct named without its
 * "struct " ("sluice_pack_options"), 0 for a name it does not know, so a
 * binding (the Python package's ctypes) can check its layouts against the
 * library it loaded.
 */
SLUICE_API size_t sluice_sizeof(const char *name);

/*
 * Writes dirty pages back and drops the page cache (Linux, root only), so the
 * next reads are cold.  Returns 1 if dropped, 0 if not permitted.  The whole
 * machine's, every other job's files too: sluice_page_cache_evict() drops
 * only the files one reads, and needs no root.
 */
SLUICE_API int sluice_drop_page_cache(void);
/*
 * Evicts the file at path from the page cache, and no other file, so that
 * its next reads come from storage (cold): its dirty pages written back
 * (fdatasync), then every page dropped (POSIX_FADV_DONTNEED); no root
 * needed.  A remote file's (s3://, http(s)://) local copy in the cache is
 * the one evicted (fetched first if there is none).  What stayed is then
 * counted (cachestat(2), else mincore(2)): *cached (or NULL) its bytes,
 * why (cap bytes, or NULL) why any did ("" when none stayed): a file on
 * tmpfs lives in the page cache alone; pages a process maps or locks stay.
 * Returns 0 whether or not all went (see *cached), or -errno naming the
 * path (no such file; not a regular file).
 */
SLUICE_API SLUICE_WUR int sluice_page_cache_evict(const char *path, uint64_t *cached, char *why, size_t cap);

/* CRC32C (Castagnoli) of n bytes, continuing from crc (0 to start). */
SLUICE_API uint32_t sluice_crc32c(uint32_t crc, const void *p, size_t n);

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
	size_t size; /* sizeof(struct sluice_engine_info), set by the caller */
	const char *backend;      /* name of the backend in use */
	int gpu;                  /* GPU ordinal, or -1 without CUDA */
	char gpu_name[96];        /* device name, "" without CUDA */
	int gds;                  /* 1 if cuFile runs with nvidia-fs */
	unsigned threads;
	unsigned queue_depth;
	size_t max_transfer_size;
	size_t buffer_pool_size;  /* bytes actually allocated */
	int pool_pinned;          /* 1 with a GPU and SLUICE_STAGING=pinned: each slot
				     is registered with the CUDA driver on its first
				     GPU copy, and none was refused */
	int uring_fixed_buffers;  /* 1 if registered with io_uring */
	/*
	 * One line per backend that was probed and found unusable, saying
	 * why, separated by '\n'.  Valid while the engine is open.
	 */
	const char *unusable;
	/*
	 * Why the engine has no GPU ("" when gpu >= 0): CUDA disabled, the
	 * driver library not loadable, cuInit's error.  Also a line of
	 * unusable.  Valid while the engine is open.
	 */
	const char *gpu_unusable;
	int numa_node;            /* the GPU's NUMA node, where the workers run and their slots are
				     allocated; -1 when the GPU reports none */
	unsigned ngpus;           /* GPUs served (SLUICE_DEVICE_IDS), the workers split among them; 0 without a GPU */
};
#define SLUICE_ENGINE_INFO_INIT { sizeof(struct sluice_engine_info), NULL, 0, "", 0, 0, 0, 0, 0, 0, 0, NULL, NULL, 0, 0 }
SLUICE_API SLUICE_WUR int sluice_engine_get_info(const struct sluice_engine *eng,
				       struct sluice_engine_info *info);

/* ================================================================
 * Statistics
 * ================================================================ */

/*
 * Per-I/O latency and volume since the engine opened or the last reset.
 * An I/O's latency runs from its submission to storage to the moment its
 * bytes are in the destination (DMA included).
 */
struct sluice_stats {
	size_t size; /* sizeof(struct sluice_stats), set by the caller */
	uint64_t ios;
	uint64_t bytes;
	double lat_avg_us;
	double lat_p50_us;
	double lat_p99_us;
	double lat_p999_us;
	double lat_max_us;
};
#define SLUICE_STATS_INIT { sizeof(struct sluice_stats), 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0 }
SLUICE_API SLUICE_WUR int sluice_engine_stats(struct sluice_engine *eng, struct sluice_stats *st);
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
/*
 * The caller's GPU memory [p, p + n) on the engine's GPU registered as a
 * destination with each of the engine's stores that registers memory
 * (gds: cuFileBufRegister), once, before many reads into it (KvikIO's
 * buffer_register); sluice_gpu_alloc's memory is registered so already.
 * Returns 0 (also where no store registers memory), SLUICE_ENOGPU, or the
 * store's error (nothing then stays registered).  Undo with
 * sluice_gpu_deregister(eng, p) before the memory is freed.
 */
SLUICE_API SLUICE_WUR int sluice_gpu_register(struct sluice_engine *eng, void *p, size_t n);
SLUICE_API void sluice_gpu_deregister(struct sluice_engine *eng, void *p);
/* Copy between any two of host and GPU memory; complete on return. */
SLUICE_API SLUICE_WUR int sluice_gpu_copy(struct sluice_engine *eng, void *dst,
					  const void *src, size_t n);
/* 1 if p points into CUDA device memory, else 0. */
SLUICE_API int sluice_is_gpu_ptr(struct sluice_engine *eng, const void *p);
/*
 * Waits until the work queued on stream (a CUstream of the engine's GPU;
 * 1 and 2 are CUDA's legacy and per-thread default streams) is done.  The
 * synchronous transfers read and write GPU memory on the engine's own
 * streams: memory that a caller's kernels are still writing must be
 * waited for first (the Python package does so with the stream that
 * __cuda_array_interface__ names).  Returns 0, SLUICE_ENOGPU or SLUICE_ECUDA.
 */
SLUICE_API SLUICE_WUR int sluice_gpu_stream_sync(struct sluice_engine *eng, void *stream);

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
	size_t size; /* sizeof(struct sluice_xfer_report), set by the caller */
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
	/*
	 * Bytes checked end to end: reads of whole s3:// objects that carry a
	 * full-object CRC32C, CRC32, CRC64NVME, SHA-1 or SHA-256, matched
	 * against it (a mismatch is read once more, then fails with
	 * SLUICE_EVERIFY), into host or GPU memory (a SHA-1 or SHA-256 there
	 * by reading the object back from it, one device-to-host pass).
	 * Ranges of an object have no checksum in S3 to match.
	 */
	uint64_t bytes_verified;
	/*
	 * Bytes the storage I/Os spanned: the payload and the gaps a
	 * coalesced read reads through (neighbouring ranges less than
	 * SLUICE_READ_GAP apart are one I/O).  Added after the struct's first release:
	 * written only when size covers it.
	 */
	uint64_t bytes_storage;
	/*
	 * Reads of s3:// and http(s):// files: what their bytes were checked
	 * with end to end, the algorithm ("crc32c", "crc32", "crc64nvme",
	 * "sha1", "sha256", "sha256 (verified: read back from GPU memory)"),
	 * or why they were not ("none (no checksum)", "none (a part; its
	 * crc32c covers the whole)", "sha256 composite (not verified)", "none
	 * (web servers send no checksum)"); of the first such range where there are
	 * several.  "" for local files.  Added after the struct's first
	 * release: written only when size covers it.
	 */
	char checksum[64];
};
#define SLUICE_XFER_REPORT_INIT { sizeof(struct sluice_xfer_report), 0, 0, 0, 0, 0.0, "", 0, 0, "" }

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
 * Model checkpoints: the tensors of safetensors files (one file, a
 * directory's model.safetensors.index.json or else its *.safetensors, an
 * index) or of a checkpoint sluice.dcp wrote (a directory with its
 * .metadata), from their headers, checked as safetensors checks them; and
 * all of them loaded as one batched read into one buffer, host or GPU
 * memory.  Readers are a table, one per layout (xfer/ckpt.c).  Each file
 * stays open from sluice_ckpt_open to sluice_ckpt_close: its header and its
 * data are read through one open (a local file replaced meanwhile stays
 * the file opened; an s3:// or http(s):// one is read at the ETag its open
 * saw, or the load fails with -ESTALE; a local file rewritten in place,
 * its size or times changed, fails the load with -ESTALE).  URLs name a
 * file or an index.  A directory holds one variant, and without an index
 * shards 1 to N of one save, each once; no tensor is stored twice.
 */
struct sluice_ckpt;
struct sluice_ckpt_tensor {
	const char *name;       /* DCP: the fully qualified name of the tensor the chunk is of */
	const char *dtype;      /* safetensors' name: "BF16", "F32", "F8_E4M3", ... */
	const char *torch_dtype; /* torch's name ("bfloat16"), or NULL where torch has none */
	unsigned ndim;
	const uint64_t *shape;  /* this entry's (DCP: the chunk's) */
	const uint64_t *chunk;  /* DCP: the chunk's offsets in its tensor; NULL: a whole tensor */
	unsigned file;          /* sluice_ckpt_file(ck, file) holds its bytes */
	uint64_t offset, bytes; /* where in that file */
	uint64_t at;            /* where sluice_ckpt_load puts it in its buffer (aligned to its element) */
};
/* Opens the checkpoint at path through eng: 0, or an error whose detail names the file and what is wrong. */
SLUICE_API SLUICE_WUR int sluice_ckpt_open(struct sluice_ckpt **out, struct sluice_engine *eng, const char *path);
SLUICE_API void sluice_ckpt_close(struct sluice_ckpt *ck);
/* "safetensors" or "sluice-dcp". */
SLUICE_API const char *sluice_ckpt_format(const struct sluice_ckpt *ck);
/* The tensors (DCP: stored chunks), in file and offset order; i < sluice_ckpt_count(). */
SLUICE_API size_t sluice_ckpt_count(const struct sluice_ckpt *ck);
SLUICE_API const struct sluice_ckpt_tensor *sluice_ckpt_tensor(const struct sluice_ckpt *ck, size_t i);
SLUICE_API unsigned sluice_ckpt_files(const struct sluice_ckpt *ck);
SLUICE_API const char *sluice_ckpt_file(const struct sluice_ckpt *ck, unsigned i);
/* Bytes of the tensors; bytes of the buffer sluice_ckpt_load fills (alignment padding included). */
SLUICE_API uint64_t sluice_ckpt_bytes(const struct sluice_ckpt *ck);
SLUICE_API uint64_t sluice_ckpt_load_size(const struct sluice_ckpt *ck);
/*
 * Reads every tensor into buf (len >= sluice_ckpt_load_size(), host or GPU
 * memory), tensor i at sluice_ckpt_tensor(ck, i)->at: one batched read, in
 * which tensors that follow one another in a file and stay aligned land
 * as one range.  Returns 0 or an error as sluice_read_batch (SLUICE_ESHORT:
 * a file cut short since its open).
 */
SLUICE_API SLUICE_WUR int sluice_ckpt_load(struct sluice_ckpt *ck, void *buf, size_t len,
					   struct sluice_xfer_report *rep);

#ifdef SLUICE_EXPERIMENTAL
/*
 * Experimental: what the Python package calls while it settles; it may
 * change in any release (define SLUICE_EXPERIMENTAL to see it).
 *
 * One safetensors file's header, read through f (open for reading; path
 * names it in errors) and checked as sluice_ckpt_open checks every file's:
 * a JSON object (no name twice) of tensors {dtype, shape, data_offsets}
 * and an optional __metadata__ of strings, every dtype the
 * specification's, shapes whose element count fills whole bytes, the
 * tensors tiling the data to the file's end.  0, or SLUICE_EFORMAT naming
 * path and what is wrong (a torch.save file is named as such).
 * sluice_st_header_json gives the header's JSON text (*len bytes, valid
 * until sluice_st_header_free), sluice_st_header_data_start the byte the
 * data starts at.
 */
struct sluice_st_header;
SLUICE_API SLUICE_WUR int sluice_st_header_read(struct sluice_st_header **out, struct sluice_file *f,
						const char *path);
SLUICE_API const char *sluice_st_header_json(const struct sluice_st_header *sh, size_t *len);
SLUICE_API uint64_t sluice_st_header_data_start(const struct sluice_st_header *sh);
SLUICE_API void sluice_st_header_free(struct sluice_st_header *sh);
/*
 * A safetensors checkpoint from what the caller resolved: its n files (in
 * this order; no tensor in two), or an index (index names it, index_json
 * holds its index_len bytes as the caller read them; files NULL, n 0)
 * whose weight_map names files beside it, exactly the tensors it names
 * read, each from the file it names (one another file holds too is an
 * error: which copy is meant?).  Headers are read on up to 16 threads.
 * Checked as sluice_ckpt_open checks a directory or an index.
 */
SLUICE_API SLUICE_WUR int sluice_ckpt_open_files(struct sluice_ckpt **out, struct sluice_engine *eng,
						 const char *const *files, unsigned n, const char *index,
						 const char *index_json, size_t index_len);
/* The open handle file i's header was read through and its data is (for sluice_read_batch); NULL past the end. */
SLUICE_API struct sluice_file *sluice_ckpt_handle(const struct sluice_ckpt *ck, unsigned i);
/* 0, or -ESTALE naming a local file rewritten in place since the open (as sluice_ckpt_load checks). */
SLUICE_API SLUICE_WUR int sluice_ckpt_check(const struct sluice_ckpt *ck);
/*
 * The .metadata of a checkpoint sluice.dcp's StorageWriter wrote (len bytes
 * of raw; path names it in errors), checked whole as sluice_ckpt_open checks
 * it: its notice, then JSON of tensors (dtype, size, chunks inside it),
 * bytes, and items each stored once, under the name the writer gives it, in
 * files of one save, each as long as its chunk.  0, or SLUICE_EFORMAT naming
 * path and what is wrong.
 */
SLUICE_API SLUICE_WUR int sluice_dcp_metadata_check(const void *raw, size_t len, const char *path);
/*
 * The files a safetensors index names (index_len bytes of index_json as the
 * caller read them; index names it in errors), checked as
 * sluice_ckpt_open_files checks an index, without opening them: sorted,
 * each once, plain names beside the index, in *files (*n of them; free
 * with sluice_list_free()).  0, SLUICE_EFORMAT naming index and what is
 * wrong, or -ENOMEM.
 */
SLUICE_API SLUICE_WUR int sluice_st_index_files(const char *index, const char *index_json, size_t index_len,
						char ***files, unsigned *n);
#endif

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
/*
 * Reads len bytes at offset of path once and delivers them to each of the
 * n buffers dsts[0..n) (GPU memory of any GPU, or host memory): the engine
 * reads into dsts[0] chunk by chunk (64 MiB), and each chunk is copied on
 * to the others while the next one is read, GPU to GPU over peer-to-peer
 * copies where the devices allow it (NVLink, PCIe).  rep counts the
 * storage reads (once).  Returns len, or the error of the read or a copy.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_read_broadcast(struct sluice_engine *eng, const char *path, uint64_t offset,
						    size_t len, void *const *dsts, unsigned n,
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
 * Enqueues a read of [offset, offset+len) of f into dst (GPU memory) on the
 * caller's CUDA stream (a CUstream; NULL is the legacy default stream):
 * dst is written once the work enqueued before it on the stream has
 * finished, and work enqueued after it waits for the bytes.  Storage I/O
 * starts at once and overlaps the stream's earlier work; it is staged in
 * windows of max_transfer_size x threads bytes through two pinned halves,
 * so storage reads and DMA overlap without GDS.  The stream waits on a
 * flag in mapped host memory (cuStreamWaitValue32): other streams that the
 * driver puts in the same hardware queue wait with it (raise
 * CUDA_DEVICE_MAX_CONNECTIONS to keep them apart).  f and dst MUST stay
 * valid until the future is freed.  Returns 0 and a future to wait on and
 * free, or an error at submission: SLUICE_ENOGPU without CUDA,
 * SLUICE_ENOTGPU if dst is not GPU memory, SLUICE_ERANGE past the end.
 */
SLUICE_API SLUICE_WUR int sluice_read_async(struct sluice_file *f, uint64_t offset,
					    size_t len, void *dst, void *stream,
					    struct sluice_future **out);
/* The same for a write of src to f, as sluice_file_write(). */
SLUICE_API SLUICE_WUR int sluice_write_async(struct sluice_file *f, uint64_t offset,
					     size_t len, const void *src, void *stream,
					     struct sluice_future **out);
/*
 * Blocks until the storage side has finished and returns the result (bytes
 * or error).  For a read, the stream's copy of the last bytes into dst may
 * still be queued: work on the stream sees them, the host must synchronize
 * the stream first.  For a write the file holds the bytes (durable after
 * sluice_file_sync()).  After an error the stream is let go, and what it
 * copied is undefined.  May be called more than once.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_future_wait(struct sluice_future *fut,
						 struct sluice_xfer_report *rep);
/* Waits if needed (for the stream too), then frees.  NULL is a no-op. */
SLUICE_API void sluice_future_free(struct sluice_future *fut);

/* ================================================================
 * Object storage (S3 and compatible stores)
 * ================================================================ */

/*
 * Any path argument of sluice may also be s3://BUCKET/KEY: objects are
 * read with ranged GETs on the engine's workers (into the same bounce
 * slots as files, then the same copy to the GPU), every GET pinned to the
 * ETag seen at open, and written whole (one PUT, or a multipart upload
 * completed only when every part is in and aborted on failure).  The
 * engine's own client takes its settings as AWS tools do: AWS_ENDPOINT_URL
 * (_S3), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
 * AWS_REGION / AWS_DEFAULT_REGION, AWS_PROFILE with ~/.aws/credentials and
 * ~/.aws/config; none: anonymous.  SLUICE_S3_RETRIES (default 4),
 * SLUICE_S3_PART_SIZE (8M), SLUICE_S3_CONCURRENCY (8) tune every client.
 * Errors: -ENOENT (no such key or bucket), -EACCES (refused, bad
 * signature), -ESTALE (the object changed during a read), -EIO and
 * -ECONNRESET, -ETIMEDOUT, -ECONNREFUSED once retries are spent; the
 * detail names s3://bucket/key, the HTTP status and the server's code.
 * Secrets never appear in details or logs.
 *
 * struct sluice_s3 is a client of its own (bucket and key apart,
 * explicit credentials): endpoint, access_key, secret_key and
 * region may each be NULL or "" to take them as above; a key pair given
 * here wins over everything.  It uses eng's workers and MUST be closed
 * before eng.  Thread-safe.  sluice_s3_close(NULL) is a no-op.
 */
struct sluice_s3;
SLUICE_API SLUICE_WUR int sluice_s3_open(struct sluice_s3 **out, struct sluice_engine *eng,
					 const char *endpoint, const char *access_key,
					 const char *secret_key, const char *region);
/*
 * A client with an engine of its own, opened from cfg (NULL: the
 * environment's settings) and closed with the client: its knobs are the
 * engine's, under the same names (sluice_config_set_buffer_pool_size,
 * _max_transfer_size, which is each ranged GET's size, _queue_depth,
 * _threads, which is the GETs in flight).
 */
SLUICE_API SLUICE_WUR int sluice_s3_open_config(struct sluice_s3 **out, const struct sluice_config *cfg,
						const char *endpoint, const char *access_key,
						const char *secret_key, const char *region);
SLUICE_API void sluice_s3_close(struct sluice_s3 *c);
/* len bytes at offset of bucket/key into dst (GPU or host memory); the bytes read, or an error. */
SLUICE_API SLUICE_WUR ssize_t sluice_s3_read_to_gpu(struct sluice_s3 *c, const char *bucket,
						    const char *key, void *dst, uint64_t offset,
						    size_t len, struct sluice_xfer_report *rep);
/* len bytes of src (GPU or host memory) as the whole object bucket/key; len, or an error. */
SLUICE_API SLUICE_WUR ssize_t sluice_s3_write_from_gpu(struct sluice_s3 *c, const char *bucket,
						       const char *key, const void *src, size_t len,
						       struct sluice_xfer_report *rep);
/* The object's size in bytes. */
SLUICE_API SLUICE_WUR int sluice_s3_size(struct sluice_s3 *c, const char *bucket, const char *key,
					 uint64_t *size);
/*
 * The same two transfers without waiting: they start at once on a thread
 * of their own (the bytes move on the engine's workers as above) and
 * return a future (sluice_future_wait gives the bytes or the error and the
 * report; free it with sluice_future_free, which waits first).  cb (or
 * NULL) is called once, on that thread, with the result and user, when the
 * transfer is done and before waiters wake; it must not free the future.
 * dst or src, and c, MUST stay valid until then; bucket and key are copied.
 */
struct sluice_future;
SLUICE_API SLUICE_WUR int sluice_s3_read_async(struct sluice_s3 *c, const char *bucket, const char *key,
					       void *dst, uint64_t offset, size_t len,
					       void (*cb)(ssize_t result, void *user), void *user,
					       struct sluice_future **out);
SLUICE_API SLUICE_WUR int sluice_s3_write_async(struct sluice_s3 *c, const char *bucket, const char *key,
						const void *src, size_t len,
						void (*cb)(ssize_t result, void *user), void *user,
						struct sluice_future **out);
/*
 * Many small objects (a sample an object: images, clips, JSON) of one
 * bucket, whole, into host memory: up to in_flight GETs at a time (0: 64;
 * at most SLUICE_S3_MAX_IN_FLIGHT), each on a kept-alive connection the
 * client keeps between calls, each object checked against its length and,
 * where the server sends one, its full-object CRC32C or CRC32.  For each:
 * key and buf (cap bytes) in; result (its size, or an error: -EFBIG where
 * it is larger than cap, -ENOENT, ...) and size (its size, also where too
 * large, when the server said it) out.  Returns 0 when every object was
 * read, else the first failure's error (its detail names the object).
 */
#define SLUICE_S3_MAX_IN_FLIGHT 256
struct sluice_s3_object {
	const char *key;
	void *buf;
	size_t cap;
	ssize_t result;
	uint64_t size;
};
SLUICE_API SLUICE_WUR int sluice_s3_get_many(struct sluice_s3 *c, const char *bucket, struct sluice_s3_object *objs,
					     size_t n, unsigned in_flight);

/*
 * Copies between local files and s3:// objects, either way (`sluice cp`).
 * src a file or object: dst is the copy's name, or a directory (local:
 * one that exists; s3://: ending in '/') that receives it under src's last
 * name.  With SLUICE_COPY_RECURSIVE, src a directory or prefix: every file
 * below it, to the same relative names below dst.  Each file goes in
 * parallel parts (SLUICE_S3_PART_SIZE, SLUICE_S3_CONCURRENCY) and several
 * files at once; uploads appear whole or not at all, downloads are
 * written under a temporary name and renamed.  Local to local and s3 to
 * s3 are refused (-EINVAL).
 *
 * Datasets under s3://BUCKET/PREFIX (sluice_dataset_open, the loader,
 * sluice_writer_open) read their files through a local cache shared by
 * the machine's processes: SLUICE_CACHE_DIR (default
 * $XDG_CACHE_HOME/sluice, else ~/.cache/sluice), at most
 * SLUICE_CACHE_LIMIT bytes (default half of its file system), least
 * recently used out, a copy used only while the object's size and ETag
 * match; a writer uploads each shard when finished and the index last.
 */
#define SLUICE_COPY_RECURSIVE 1u
/*
 * A local tree's symbolic links (with SLUICE_COPY_RECURSIVE), decided as
 * sluice pack --from-dir decides them: a link that leads out of the tree
 * (to /etc/passwd, ~/.aws/credentials, through "..", an absolute name or
 * another link) is skipped and named on stderr, as is one to nothing or
 * round a loop; one whose target lies in the tree is copied as that
 * target, a directory walked (a link back to a directory above it is
 * skipped and named: the tree is copied once, never round and round).
 * SLUICE_COPY_LINKS keeps each link inside the tree a link, made relative
 * to where it sits (an absolute one pointing back inside too), so it leads
 * to the same file in the copy; only a local destination can hold links:
 * with another, -EOPNOTSUPP before anything is copied.
 * SLUICE_COPY_FOLLOW copies links out of the tree too, as their targets
 * (cp -L; with SLUICE_COPY_LINKS, rsync's --copy-unsafe-links).  Every
 * file is opened beneath the tree's directory by its real path with no
 * link followed on the way, and must be the file listed: a link swapped
 * in after the listing fails the copy naming it (-ELOOP, -ESTALE).
 */
#define SLUICE_COPY_LINKS 2u
#define SLUICE_COPY_FOLLOW 4u
struct sluice_copy_report {
	size_t size; /* sizeof(struct sluice_copy_report), set by the caller */
	uint64_t files, bytes;
	double seconds;
	/*
	 * Downloads whose bytes matched their object's full-object CRC32C,
	 * CRC32, CRC64NVME, SHA-1 or SHA-256 (uploads always carry a CRC32C,
	 * which the server checks).
	 */
	uint64_t files_verified;
	/*
	 * Which: the algorithms of the downloads verified ("crc32c", "crc64nvme,
	 * sha256") where all were, else why the first one that was not was not
	 * ("none (no checksum)", "sha256 composite (not verified)"); uploads:
	 * "crc32c (checked by the server)".  Added after the struct's first
	 * release: written only when size covers it.
	 */
	char checksum[64];
	/* A local tree's links and special files left out (each named on stderr); added later, as checksum. */
	uint64_t skipped;
};
#define SLUICE_COPY_REPORT_INIT { sizeof(struct sluice_copy_report), 0, 0, 0.0, 0, "", 0 }
SLUICE_API SLUICE_WUR int sluice_copy(const char *src, const char *dst, unsigned flags,
				      struct sluice_copy_report *rep);
/*
 * sluice_copy, telling how far it has come: progress (or NULL) is called
 * about four times a second from a thread of the copy's own, and once
 * more at the end on the caller's (bytes: all of them; files_done ==
 * files), never two calls at once: bytes copied so far (of files underway, what they have written or
 * read; never less than the last call's), total the bytes of every file
 * (0 where the source's listing does not give sizes: a tree of objects or
 * of a web server), files_done of files.  None after it returns.
 */
SLUICE_API SLUICE_WUR int sluice_copy_with_progress(const char *src, const char *dst, unsigned flags,
						    struct sluice_copy_report *rep,
						    void (*progress)(uint64_t bytes, uint64_t total, uint64_t files_done,
								     uint64_t files, void *arg),
						    void *arg);
/*
 * Which store serves path: "local" (the engine's store of local files:
 * uring, psync or gds), "s3", "http", ...; and into *flags (or NULL) what it does:
 * SLUICE_STORE_LOCAL (a local file: opened in place, written by ranges;
 * else remote: datasets' files are cached, files are written whole),
 * SLUICE_STORE_LISTS (sluice_list can list its directories; a web server
 * only where it gives listings), SLUICE_STORE_WRITES (files can be
 * written or uploaded; a web server only with WebDAV).  Never NULL.
 */
#define SLUICE_STORE_LOCAL 1u
#define SLUICE_STORE_LISTS 2u
#define SLUICE_STORE_WRITES 4u
SLUICE_API const char *sluice_path_store(const char *path, unsigned *flags);
/*
 * The regular files directly in dir (a local directory, an s3:// prefix:
 * its objects, not its sub-prefixes, an http(s):// directory whose server
 * lists it: an nginx autoindex, Apache's, Python's http.server), or with
 * recursive every one below it: full paths (dir, '/', the rest), sorted,
 * in *names, *n of them; free with sluice_list_free().  Returns 0, -errno
 * (-EOPNOTSUPP: the server gives no listing), or the store's error naming
 * dir.
 */
SLUICE_API SLUICE_WUR int sluice_list(const char *dir, int recursive, char ***names, unsigned *n);
SLUICE_API void sluice_list_free(char **names, unsigned n);
/*
 * Removes a regular file, an s3:// object, or an http(s):// file (WebDAV's
 * DELETE).  Returns 0, -errno (-EROFS: the server takes no DELETE), or the
 * store's error naming the file.
 */
SLUICE_API SLUICE_WUR int sluice_remove(const char *path);

/* ================================================================
 * Datasets (docs/FORMAT.md)
 * ================================================================ */

/* Element types of dataset fields; SLUICE_DTYPE_BYTES is raw bytes. */
enum sluice_dtype {
	SLUICE_DTYPE_BYTES = 0,
	SLUICE_DTYPE_U8 = 1,
	SLUICE_DTYPE_U16 = 2,
	SLUICE_DTYPE_U32 = 3,
	SLUICE_DTYPE_I32 = 4,
	SLUICE_DTYPE_I64 = 5,
	SLUICE_DTYPE_F16 = 6,
	SLUICE_DTYPE_BF16 = 7,
	SLUICE_DTYPE_F32 = 8,
	SLUICE_DTYPE_I8 = 9,
	SLUICE_DTYPE_I16 = 10,
	SLUICE_DTYPE_F64 = 11,
};

#define SLUICE_MAX_FIELDS 64
#define SLUICE_MAX_NDIM 4

/* One field of every record: a name and a type; shape -1 is variable. */
struct sluice_field {
	const char *name;
	enum sluice_dtype dtype;
	int ndim;
	int64_t shape[SLUICE_MAX_NDIM];
};

/* Element size of dtype in bytes (1 for bytes), 0 for an unknown dtype. */
SLUICE_API size_t sluice_dtype_size(enum sluice_dtype dtype);
/* "bytes", "u8", ... "f64"; NULL for an unknown dtype. */
SLUICE_API const char *sluice_dtype_name(enum sluice_dtype dtype);

struct sluice_writer;

struct sluice_writer_options {
	size_t size; /* sizeof(struct sluice_writer_options) */
	uint64_t shard_size; /* target bytes per shard (uncompressed); 0: 1 GiB */
	/*
	 * zstd level 1..22 to store shards as zstd blocks of at least
	 * block_size uncompressed bytes (1 MiB..1 GiB; 0: 1 MiB), whole records
	 * each; 0: uncompressed.
	 */
	int zstd_level;
	size_t block_size;
	/*
	 * A JSON object stored with the dataset (up to 16 MiB), or NULL: what
	 * readers of the data need beside it, such as the class names of an
	 * ImageFolder (sluice pack --from-dir stores {"class_to_idx": {...}}).
	 * Copied at open.
	 */
	const char *metadata;
};
#define SLUICE_WRITER_OPTIONS_INIT { sizeof(struct sluice_writer_options), 0, 0, 0, NULL }

/*
 * Starts a dataset in directory dir (created if missing; it MUST NOT
 * already hold a dataset).  The field array is copied.  Nothing under dir
 * opens as a dataset until sluice_writer_close() succeeds.  Returns 0,
 * -errno, or SLUICE_EINVAL_CONFIG for a bad schema (detail names the
 * field).  Not thread-safe: one thread writes a given writer.
 */
SLUICE_API SLUICE_WUR int sluice_writer_open(struct sluice_writer **out, const char *dir,
					     const struct sluice_field *fields, unsigned nfields,
					     const struct sluice_writer_options *opt);
/*
 * As sluice_writer_open(), but dir may hold a sluice dataset already, which
 * the new one replaces whole: it is written into a directory beside dir
 * (".NAME.sluice-new-HOST-PID-N") and at sluice_writer_close(), once synced,
 * swapped with dir in one rename (renameat2 RENAME_EXCHANGE); the old
 * dataset's files are then removed.  A reader, or a kill -9 at any moment,
 * finds the old dataset whole or the new one whole at dir, never a mix and
 * never nothing; what a killed writer left beside dir is removed by the
 * next overwrite of dir on the same host.  dir may also be absent, an empty
 * directory, or what an unfinished write left (sluice's file names only);
 * anything else is refused, naming what it holds (-ENOTEMPTY), as are a file
 * (-ENOTDIR), a mount point (-EXDEV), a file system that cannot swap two
 * directories in one rename (-EOPNOTSUPP, before anything is written) and
 * a remote dir (-EOPNOTSUPP: a store's objects cannot all be replaced at
 * once).  A symbolic link dir is kept and the directory it names replaced.
 * A process that opened the old dataset before the swap MUST reopen it:
 * the shard names its index knows then lead to the new dataset's files.
 * Its record reads (sluice_dataset_read, read_batch, the loader) fail
 * those records' CRCs, naming them; but sluice_dataset_read_shard() of a
 * zstd dataset checks the blocks against the shard's own table only, and
 * can hand back the new shard's bytes.
 */
SLUICE_API SLUICE_WUR int sluice_writer_open_overwrite(struct sluice_writer **out, const char *dir,
						       const struct sluice_field *fields, unsigned nfields,
						       const struct sluice_writer_options *opt);
/*
 * Appends one record: vals[i] points at lens[i] bytes of field i.  Fixed
 * size fields must have exactly their size.  Returns 0, -errno, or
 * SLUICE_EINVAL_CONFIG (detail names the field and record).
 */
SLUICE_API SLUICE_WUR int sluice_writer_add(struct sluice_writer *w, const void *const *vals,
					    const size_t *lens);
/* Records added so far. */
SLUICE_API uint64_t sluice_writer_count(const struct sluice_writer *w);

/*
 * Finishes the last shard, writes and syncs the index, renames it into
 * place and frees w.  On error the dataset stays incomplete (no index).
 */
SLUICE_API SLUICE_WUR int sluice_writer_close(struct sluice_writer *w);
/* Frees w and removes what it wrote; the directory is left.  NULL is a no-op. */
SLUICE_API void sluice_writer_abort(struct sluice_writer *w);

struct sluice_dataset;

/*
 * Opens a dataset.  path is one of:
 *   - a sluice dataset directory: O(1) in the record count (the index
 *     header, schema and shard table are checked, the entries mapped);
 *   - a Megatron indexed dataset, as its .idx, its .bin or their common
 *     prefix, read in place: one record per sequence, one field "tokens"
 *     of the .idx's dtype, no CRC; O(1);
 *   - a WebDataset .tar or a directory of them (sorted by name), read in
 *     place: one record per sample, one bytes field per extension seen
 *     (length 0 where a sample lacks it), no CRC.  Each tar's sidecar index
 *     (NAME.tar.sluice-idx) is built on first open, cached beside it when
 *     the directory is writable, and rebuilt when the tar changes.
 * Errors:
 * -errno, SLUICE_EFORMAT for a missing, truncated or inconsistent index
 * (detail names the file and what is wrong).  Free with sluice_dataset_close().
 * A dataset is immutable; all functions below are thread-safe.
 */
SLUICE_API SLUICE_WUR int sluice_dataset_open(struct sluice_dataset **out, const char *path);
SLUICE_API void sluice_dataset_close(struct sluice_dataset *ds);
/* The on-disk format read: "sluice", "megatron" or "webdataset". */
SLUICE_API const char *sluice_dataset_format(const struct sluice_dataset *ds);
/*
 * The dataset's metadata (sluice_writer_options.metadata): JSON text, or
 * NULL where it has none (other formats, datasets written without).  Valid
 * until the dataset is closed.
 */
SLUICE_API const char *sluice_dataset_metadata(const struct sluice_dataset *ds);
/*
 * 1 if each record carries a CRC32C that every read checks (sluice's own
 * format), 0 if the format has none (Megatron, WebDataset): then reads and
 * verify check bounds only.
 */
SLUICE_API int sluice_dataset_has_crc(const struct sluice_dataset *ds);
SLUICE_API uint64_t sluice_dataset_count(const struct sluice_dataset *ds);
SLUICE_API unsigned sluice_dataset_shards(const struct sluice_dataset *ds);
SLUICE_API unsigned sluice_dataset_nfields(const struct sluice_dataset *ds);
/* Field i of the schema; the name is valid while ds is open.  NULL if i is out of range. */
SLUICE_API const struct sluice_field *sluice_dataset_field(const struct sluice_dataset *ds, unsigned i);

/* Shard s's record count and the bytes its records span from the file's start (its 4 KiB header included; in zstd datasets, logical bytes); 0 or SLUICE_ERANGE. */
SLUICE_API SLUICE_WUR int sluice_dataset_shard_info(const struct sluice_dataset *ds, unsigned s,
						    uint64_t *records, uint64_t *bytes);

/* Where record i is stored.  Returns 0 or SLUICE_ERANGE. */
struct sluice_record_loc {
	unsigned shard;
	uint64_t offset; /* in the shard file (zstd datasets: in the uncompressed shard) */
	uint32_t length; /* record bytes (uncompressed) */
	uint32_t crc;
};
SLUICE_API SLUICE_WUR int sluice_dataset_locate(const struct sluice_dataset *ds, uint64_t i,
						struct sluice_record_loc *loc);

/*
 * A decoded record: the value of field f is data[f], len[f] bytes; the
 * pointers point into the buffer given to sluice_dataset_read(), but for a
 * WebDataset sample's __key__, which points into the dataset's index and
 * stays valid while the dataset is open.
 */
struct sluice_record {
	const void *data[SLUICE_MAX_FIELDS];
	size_t len[SLUICE_MAX_FIELDS];
};

/*
 * The codec of the dataset's shards, "zstd" or "none", and in *ratio (if
 * ratio is not NULL) its uncompressed over stored data bytes (1.0 when
 * unknown).  For zstd shards the ratio reads every block table.
 */
SLUICE_API const char *sluice_dataset_compression(struct sluice_dataset *ds, double *ratio);
/*
 * Reads record i into buf (at least its stored length, see
 * sluice_dataset_locate()), checks its CRC and decodes its fields into rec
 * (may be NULL).  Returns the stored length, SLUICE_ERANGE, SLUICE_ECRC
 * or SLUICE_EFORMAT (detail names shard, offset and record), -ENOSPC if
 * cap is too small, or -errno.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_dataset_read(struct sluice_dataset *ds, uint64_t i, void *buf,
						  size_t cap, struct sluice_record *rec);
/*
 * Decodes record i's stored bytes (as sluice_dataset_read_batch() left
 * them) against ds's schema, no CRC check: rec's fields point into bytes.
 * Returns 0 or SLUICE_EFORMAT.  (WebDataset samples need i to find their
 * members; the other formats ignore it.)
 */
SLUICE_API SLUICE_WUR int sluice_dataset_decode(const struct sluice_dataset *ds, uint64_t i, const void *bytes,
						size_t len, struct sluice_record *rec);

/*
 * Reads records idx[0..n) through eng's batched I/O into dst (host or GPU
 * memory of eng's device), back to back, each starting 8-byte aligned:
 * record k's stored bytes land at dst + offsets[k] (offsets, if not NULL,
 * has n + 1 entries; the last is the total).  Neighbouring records are
 * read with single I/Os.  Where the format has CRCs they are computed by
 * the engine's workers from host bytes before any DMA and checked.
 * Returns the total bytes, -ENOSPC if cap is too small, SLUICE_ECRC or
 * SLUICE_EFORMAT naming the record, SLUICE_ERANGE, or -errno.  Decode
 * host copies with sluice_dataset_decode().
 */
SLUICE_API SLUICE_WUR ssize_t sluice_dataset_read_batch(struct sluice_engine *eng, struct sluice_dataset *ds,
							const uint64_t *idx, size_t n, void *dst, size_t cap,
							uint64_t *offsets, struct sluice_xfer_report *rep);

/* Who decodes a zstd shard's blocks (sluice_dataset_read_shard). */
enum sluice_decoder {
	SLUICE_DECODE_AUTO = 0, /* SLUICE_DECODE (auto|gpu|cpu); auto: GPU when dst is GPU memory and nvCOMP loads */
	SLUICE_DECODE_CPU = 1,  /* zstd on the engine's thread count of CPU threads, then one copy to dst */
	SLUICE_DECODE_GPU = 2,  /* nvCOMP's batched zstd (libnvcomp.so.6, loaded at run time) in GPU memory */
};

struct sluice_shard_report {
	size_t size; /* sizeof(struct sluice_shard_report), set by the caller */
	uint64_t bytes;        /* logical (uncompressed) bytes delivered */
	uint64_t stored;       /* bytes read from storage */
	unsigned blocks;       /* zstd blocks decoded (0: an uncompressed shard) */
	double read_s;         /* the stored bytes into memory (GPU memory for GPU decoding) */
	double decode_s;       /* from there to the logical bytes in dst */
	char decoder[8];       /* "gpu", "cpu" or "none" */
	char why_not_gpu[256]; /* with auto: why the GPU did not decode ("" if it did) */
};
#define SLUICE_SHARD_REPORT_INIT { sizeof(struct sluice_shard_report), 0, 0, 0, 0.0, 0.0, "", "" }

/*
 * Reads shard s of a sluice dataset whole into dst (GPU or host memory,
 * cap bytes): its records back to back as an uncompressed shard holds
 * them from offset 4096 (record k of the shard at its locate() offset -
 * 4096).  The stored bytes go through the engine; zstd blocks are then
 * decoded by decoder, every block of the shard at once.  Returns the
 * bytes delivered; -ENOSPC when cap is short (it needs
 * sluice_dataset_shard_info's bytes - 4096), -ENOTSUP for other formats, SLUICE_ENOGPU
 * when SLUICE_DECODE_GPU cannot be had (the detail says why),
 * SLUICE_EFORMAT naming the shard and block that does not decode.
 */
SLUICE_API SLUICE_WUR ssize_t sluice_dataset_read_shard(struct sluice_engine *eng, struct sluice_dataset *ds,
							unsigned s, void *dst, size_t cap, int decoder,
							struct sluice_shard_report *rep);

/* What sluice_dataset_verify() found wrong with one record or shard. */
struct sluice_bad {
	uint64_t record;  /* UINT64_MAX when the problem is a whole shard */
	unsigned shard;
	uint64_t offset;
	int code;         /* SLUICE_ECRC, SLUICE_EFORMAT, -errno */
	const char *what; /* sentence; valid during the callback */
};
/*
 * Checks every shard header against the index, every record's bounds and
 * CRC, and that every record decodes.  Calls bad() (if not NULL) for each
 * problem; returns the number of problems (0: all good) or a negative
 * error that stopped the check.
 */
SLUICE_API int64_t sluice_dataset_verify(struct sluice_dataset *ds,
					 void (*bad)(const struct sluice_bad *b, void *user), void *user);

/* ================================================================
 * Importing: datasets, trees of files, JSON lines and tokens into sluice shards
 * ================================================================ */

/*
 * Imports a dataset sluice reads, a tree of files, JSON lines or token
 * arrays, into sluice shards at out (what `sluice pack` does, and
 * sluice.pack in Python).  opt->source says which:
 *   SLUICE_PACK_DATASET  from: any dataset sluice reads (WebDataset tars, a
 *                        Megatron prefix, sluice shards), every record and
 *                        field, in order;
 *   SLUICE_PACK_DIR      from: an ImageFolder tree, as torchvision's
 *                        ImageFolder takes it (classes are the sorted
 *                        subdirectories, label = index, image extensions
 *                        only unless all_files; links out of the tree
 *                        skipped unless follow_symlinks): fields data, key
 *                        and label (i64; none without classes), the class
 *                        map in the dataset's metadata; files read by
 *                        threads (0: the CPUs, up to 8);
 *   SLUICE_PACK_JSONL    from: one record per JSON line, fields: "k1,k2"
 *                        (string -> bytes, integer -> i64, real -> f64,
 *                        bool -> u8, [ints] -> i64[*], [numbers] -> f32[*]);
 *   SLUICE_PACK_TOKENS   from: a token array (.npy, or raw .bin of dtype
 *                        "u16" (default) or "u32"), cut into one record
 *                        ("tokens") per document by doc_lengths (.npy of
 *                        integers, or raw .bin of i64); with pack_context,
 *                        documents packed into rows of that many tokens
 *                        (best-fit decreasing, or greedy): input_ids,
 *                        position_ids, labels, cu_seqlens.
 * Nothing at out opens as a dataset unless all went well; out MUST NOT
 * hold a dataset (-EEXIST) unless overwrite is set, when the new one
 * replaces it whole, or not at all (sluice_writer_open_overwrite() says
 * what may be replaced and how).  progress (or
 * NULL) is called now and then with the records done and their total (0:
 * unknown).  Returns 0 with rep filled (or NULL), or an error naming the
 * file, line, record or option.
 */
enum sluice_pack_source {
	SLUICE_PACK_DATASET = 1,
	SLUICE_PACK_DIR = 2,
	SLUICE_PACK_JSONL = 3,
	SLUICE_PACK_TOKENS = 4,
};
struct sluice_pack_options {
	size_t size;                    /* sizeof(struct sluice_pack_options) */
	int source;                     /* enum sluice_pack_source */
	const char *from;
	const char *fields;             /* JSONL */
	const char *doc_lengths;        /* TOKENS */
	const char *dtype;              /* TOKENS, raw .bin: "u16" or "u32"; NULL: u16 */
	unsigned pack_context;          /* TOKENS: 0, one record per document */
	int greedy;                     /* TOKENS with pack_context */
	int all_files, follow_symlinks; /* DIR */
	unsigned threads;               /* DIR */
	struct sluice_writer_options writer; /* shard size, zstd; metadata is DIR's own */
	void (*progress)(uint64_t done, uint64_t total, uint64_t bytes, void *arg);
	void *progress_arg;
	int overwrite;                  /* 1: out may hold a sluice dataset, replaced whole (sluice_writer_open_overwrite) */
};
#define SLUICE_PACK_OPTIONS_INIT { sizeof(struct sluice_pack_options), 0, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, SLUICE_WRITER_OPTIONS_INIT, NULL, NULL, 0 }
struct sluice_pack_report {
	size_t size;            /* sizeof(struct sluice_pack_report), set by the caller */
	uint64_t records;       /* written */
	uint64_t bytes;         /* of record data read */
	uint64_t documents, tokens; /* TOKENS */
	double fill;            /* TOKENS with pack_context: real tokens / the rows' capacity (rows x context) */
	double seconds;
	int labelled;           /* DIR: records carry labels (the tree has classes) */
	char from_format[32];   /* "sluice", "webdataset", "megatron", "dir", "jsonl", "tokens" */
	char dtype[16];         /* TOKENS: the tokens' dtype */
};
#define SLUICE_PACK_REPORT_INIT { sizeof(struct sluice_pack_report), 0, 0, 0, 0, 0.0, 0.0, 0, "", "" }
SLUICE_API SLUICE_WUR int sluice_pack(const char *out, const struct sluice_pack_options *opt,
				      struct sluice_pack_report *rep);

/* ================================================================
 * Loader: shuffled, distributed, resumable batches
 * ================================================================ */

struct sluice_loader;
struct sluice_batch;

/*
 * Images decoded and augmented inside the loader: one field's encoded
 * images (JPEG, PNG, WebP) arrive as one dense tensor [B, 3, height, width]
 * (channels_last: [B, height, width, 3]) of dtype, as a torchvision
 * pipeline would give them: mode RANDOM_RESIZED_CROP samples as
 * RandomResizedCrop(size, scale, ratio) does, CENTER_CROP is
 * Resize(resize) then CenterCrop(size), RESIZE resizes the whole image; the
 * resize is bilinear with antialiasing (torchvision's default); flip is
 * RandomHorizontalFlip's probability; floats are the pixels / 255, then
 * (x - mean) / std where std is set.  Crops and flips are a function of
 * (seed, epoch, record id) alone.  Pixels are what PIL's convert("RGB")
 * gives (PNG alpha dropped, no gamma; 16-bit colour by its high byte,
 * 16-bit grey clipped to 255 as PIL's I;16 is; CMYK as Adobe stores it),
 * chroma upsampled as libjpeg does.  With a GPU
 * loader, baseline JPEGs are decoded by nvJPEG in batches (the hardware
 * decoders where the GPU has them) and the augmentation is one kernel
 * launch a batch (NVRTC, compiled once a process); PNG, WebP, progressive,
 * CMYK and RGB-stored JPEGs are decoded by a few CPU threads
 * (libjpeg-turbo, libpng, libwebp) and augmented beside them.  A record
 * that is not a whole image (a JPEG without its end marker; a decoder's
 * warning), or of more than SLUICE_MAX_IMAGE_PIXELS or 65535 pixels a side,
 * fails its batch naming the dataset and record, or with the loader's
 * skip_corrupt is left out of every field and counted (stats: "skipped").
 */
enum sluice_image_mode {
	SLUICE_IMAGE_RANDOM_RESIZED_CROP = 0,
	SLUICE_IMAGE_CENTER_CROP = 1,
	SLUICE_IMAGE_RESIZE = 2,
};
enum sluice_image_decode {
	SLUICE_IMAGE_DECODE_AUTO = 0, /* the GPU's (nvJPEG) with a GPU loader where it loads, else the CPU's */
	SLUICE_IMAGE_DECODE_GPU = 1,  /* nvJPEG, or the loader fails to open */
	SLUICE_IMAGE_DECODE_CPU = 2,
};
struct sluice_image_options {
	size_t size;                /* sizeof(struct sluice_image_options) */
	const char *field;          /* the field of encoded images (required) */
	uint32_t height, width;     /* the output's (required) */
	int mode;                   /* enum sluice_image_mode */
	float scale[2], ratio[2];   /* RANDOM_RESIZED_CROP's; both 0: (0.08, 1) and (3/4, 4/3) */
	float flip;                 /* probability of a horizontal flip */
	float mean[3], std[3];      /* of the [0, 1] pixels; std all 0: not normalised */
	enum sluice_dtype dtype;    /* U8, F16, BF16 or F32 (0: F32) */
	int channels_last;
	int decode;                 /* enum sluice_image_decode */
	uint32_t resize;            /* CENTER_CROP: the shorter side first resized to this, at most 16384
				       (0: the larger of height and width * 8 / 7) */
};
/*
 * What the loader does to one image (width x height) of record id in an
 * epoch: the region [x, x + w) x [y, y + h) of the image is resized to
 * resized_w x resized_h, of which the output is the window at (offset_x,
 * offset_y), then mirrored if flip.  For a crop's bounding boxes, or a
 * check against another pipeline.  0, or SLUICE_EINVAL_CONFIG naming the
 * option.
 */
struct sluice_image_box {
	int x, y, w, h, resized_w, resized_h, offset_x, offset_y, flip;
};
SLUICE_API SLUICE_WUR int sluice_image_plan(const struct sluice_image_options *opt, uint64_t seed, uint64_t epoch,
					    uint64_t id, uint32_t width, uint32_t height, struct sluice_image_box *box);
#define SLUICE_IMAGE_OPTIONS_INIT { sizeof(struct sluice_image_options), NULL, 0, 0, 0, { 0, 0 }, { 0, 0 }, 0, \
				    { 0, 0, 0 }, { 0, 0, 0 }, 0, 0, 0, 0 }

/*
 * One phase of an epoch in a resume state: the nodes it ran on and the
 * positions of each node's own sequence consumed in it (the same on every
 * node: ranks take their batches in step).  sluice_loader_state_ex() gives
 * the list, oldest first; the last one is the reporting loader's.
 */
struct sluice_loader_segment {
	unsigned nodes;
	uint64_t position;
};
#define SLUICE_LOADER_SEGMENTS_MAX 16

struct sluice_loader_options {
	size_t size; /* sizeof(struct sluice_loader_options) */
	uint32_t batch_size;       /* records per batch per rank (required) */
	const char *const *fields; /* names of the fields to load, NULL-terminated; NULL: all */
	int gpu;                   /* 1: batches land in the engine's GPU; 0: host memory */
	unsigned prefetch;         /* batches prepared ahead (0: 8, or down to 4 for batches over 32 MiB) */
	uint64_t seed;
	uint64_t epoch;
	uint64_t position;         /* resume: global samples already consumed this epoch */
	unsigned rank, world_size; /* world_size 0 means 1 */
	int drop_last;             /* 1: drop the last partial global batch; 0: keep it (short, or see even_batches) */
	int shuffle;               /* 0: dataset order */
	uint64_t window_bytes;     /* shuffle window (0: 64 MiB): read whole, ahead, permuted inside */
	int skip_corrupt;          /* 0: a corrupt record fails its batch, naming it; 1: left out (batch smaller), counted;
				      a batch left with no record is not delivered, but with world_size > 1 (every rank
				      takes the same number of steps) */
	unsigned device_index;     /* with gpu: which of the engine's device ids (SLUICE_DEVICE_IDS) batches land
				      in, 0: the first */
	const struct sluice_image_options *image; /* NULL, or one field's encoded images decoded and augmented */
	/*
	 * Optional: the caller's own work on each batch, after sluice's
	 * (images decoded, fields collated and copied), by the producer thread
	 * that built the batch, before the consumer can take it.  With a GPU
	 * loader, stream is the CUstream the batch was made on: queue GPU work
	 * on it, and the batch is ready once that work is done; with a host
	 * loader, NULL.  It may change the batch's data in place, not its
	 * layout.  Called from the loader's threads, several batches at once.
	 * Returns 0, or an error that fails the batch (sluice_loader_next
	 * returns it, naming the batch).
	 */
	int (*transform)(struct sluice_batch *b, void *stream, void *arg);
	void *transform_arg;
	/*
	 * Machines the world_size ranks run on (0 means 1): world_size must be
	 * a multiple of it, and ranks are numbered node-major, as torchrun
	 * numbers them (node = rank / (world_size / nodes)).  Each node reads
	 * only its share of the shards (see sluice_loader_open).
	 */
	unsigned nodes;
	/*
	 * Resume an epoch that ran on other node counts: the segments
	 * sluice_loader_state_ex() gave (nresume of them, at most
	 * SLUICE_LOADER_SEGMENTS_MAX; sluice reads them during
	 * sluice_loader_open only).  With nresume > 0, position MUST be 0.
	 */
	const struct sluice_loader_segment *resume;
	unsigned nresume;
	/*
	 * Without drop_last, the epoch's last global batch: 0, short, as
	 * torch's DistributedSampler and DataLoader make it: what is left,
	 * rounded up to a multiple of the node's ranks with records from the
	 * start of the node's sequence, so each rank gets the same number of
	 * records and at most (ranks a node - 1) of them twice (one process:
	 * none twice).  1: full on every rank, filled from the start of the
	 * node's sequence (accelerate's even_batches), for models that need
	 * one batch shape.
	 */
	int even_batches;
	/*
	 * 0: a batch's buffers stay valid until the next sluice_loader_next()
	 * call.  1: each batch stays the caller's, unchanged, until
	 * sluice_loader_release(ld, b->hold): the ring moves a batch still held
	 * when it needs its buffer again into memory of its own (a spare one,
	 * kept for the next), so holding many batches (gradient accumulation,
	 * a list of them) costs memory, never a batch overwritten.  hold_bytes:
	 * the most that memory may take (0: a quarter of the host's memory);
	 * past it, the batch that needs more fails with -ENOBUFS naming it.
	 */
	int hold;
	uint64_t hold_bytes;
};
#define SLUICE_LOADER_OPTIONS_INIT { sizeof(struct sluice_loader_options), 0, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
				     NULL, NULL, NULL, 0, NULL, 0, 0, 0, 0 }

/*
 * One field of a batch: fixed-size fields dense [size, ...]; others (data,
 * offsets), where offsets count ELEMENTS of dtype (bytes for a bytes field),
 * as cu_seqlens do: record j is ((T *)data)[offsets[j], offsets[j + 1]) for
 * the dtype's C type T, and the field holds offsets[size] elements.
 * (They once counted bytes: code that divided them by the element size
 * must no longer.)
 */
struct sluice_batch_field {
	const char *name;
	enum sluice_dtype dtype;
	void *data;                /* host or GPU memory, as the loader's gpu option */
	uint64_t *offsets;         /* variable-size fields: size + 1 element offsets into data (same memory); else NULL */
	uint64_t item_bytes;       /* fixed-size fields: bytes per record; else 0 */
	const uint64_t *host_offsets; /* the offsets in host memory (the same array for host batches) */
	/*
	 * What data holds, batch dimension first: ndim dimensions of shape,
	 * strides in elements (fixed-size fields: [size, item...] dense; an
	 * image field: [size, 3, h, w] or channels last [size, h, w, 3] of
	 * the image options' dtype); variable-size fields: ndim 1, the
	 * elements of all records.
	 */
	int ndim;
	int64_t shape[SLUICE_MAX_NDIM + 1], strides[SLUICE_MAX_NDIM + 1];
};

struct sluice_batch {
	size_t struct_size;        /* sizeof(struct sluice_batch), set by the caller (SLUICE_BATCH_INIT):
				      sluice_loader_next fills no more than that, so a newer library's larger
				      batch never writes past an older caller's */
	uint64_t index;            /* this rank's batch number in the epoch */
	uint32_t size;             /* records: batch_size, less any skipped as corrupt */
	unsigned nfields;
	struct sluice_batch_field field[SLUICE_MAX_FIELDS];
	const uint64_t *ids;       /* record ids, host memory */
	void *event;               /* GPU batches: a CUevent; work on any stream that waits for it sees the batch */
	uint64_t hold;             /* a loader with the hold option: what sluice_loader_release() takes; else 0 */
};
#define SLUICE_BATCH_INIT { sizeof(struct sluice_batch), 0, 0, 0, { { NULL, SLUICE_DTYPE_BYTES, NULL, NULL, 0, NULL, 0, { 0 }, { 0 } } }, NULL, NULL, 0 }

/*
 * Opens a loader over ds using eng's workers (and GPU, with gpu set).
 * The sample order is a function of the dataset, seed, epoch, shuffle,
 * window_bytes and nodes alone, never of the ranks within a node: the
 * shards are permuted into one sequence, which is cut by records into
 * `nodes` contiguous ranges (node k: [k * N / nodes, (k + 1) * N / nodes),
 * so at most nodes - 1 shards are split between two neighbouring nodes);
 * inside each node's range runs of neighbouring records (16 to a window,
 * at least 1 MiB each) are permuted, and the records of each window of
 * window_bytes are permuted inside it (docs/LOADER.md).  With nodes 1 the
 * order is the one sluice always gave.  Each window is read whole (this
 * rank's records of it, coalesced), so reads stay sequential, and a node's
 * windows touch only its own shards.  With L = world_size / nodes ranks a
 * node, its global batch g holds positions [o + g * B * L, o + (g + 1) * B * L)
 * of its sequence (o = position mod B * L, 0 from an epoch's start); its
 * local rank r takes the r-th B of them by record id.  Every rank of every
 * node gets the same number of batches and records, counted on the longest
 * node's sequence (a shorter one fills its last batch from its own start;
 * the last batch short, see even_batches) or, with drop_last, on the
 * shortest.  A resume from any `position` (nodes 1) or
 * `resume` state, with another world size or node count, neither repeats
 * nor skips a sample.  Returns 0, SLUICE_EINVAL_CONFIG (the detail names
 * the option), or an error of the dataset or engine.
 */
SLUICE_API SLUICE_WUR int sluice_loader_open(struct sluice_loader **out, struct sluice_engine *eng,
					     struct sluice_dataset *ds, const struct sluice_loader_options *opt);
/*
 * The next batch of the epoch: 1 and *b filled, 0 at the epoch's end, or an
 * error naming the record (CRC, format, I/O); b->struct_size must be set
 * (SLUICE_BATCH_INIT), else SLUICE_EINVAL_CONFIG.  b's buffers stay valid
 * until the next call of sluice_loader_next() or sluice_loader_close()
 * (with the hold option, until sluice_loader_release() or close); with a
 * GPU loader, pass the stream that uses the batch: it is made to wait for
 * the batch's copy (batch.event), and GPU work queued on it before that
 * next call (or the release) is waited for before the buffers are reused; with stream NULL,
 * the call returns once the copy is done.
 * Decompression, CRC checks and collation run in the loader's thread and
 * the engine's workers, never in the caller's.
 */
SLUICE_API SLUICE_WUR int sluice_loader_next(struct sluice_loader *ld, struct sluice_batch *b, void *stream);
/*
 * With the hold option: the caller is done with the batch whose b->hold
 * this is; its memory is reused once GPU work queued before this call on
 * the stream given to sluice_loader_next for it is done.  Any thread, any
 * order.  0, or SLUICE_EINVAL_CONFIG for a batch not held (released
 * already, or of a loader without hold).
 */
SLUICE_API SLUICE_WUR int sluice_loader_release(struct sluice_loader *ld, uint64_t hold);
/* This rank's batches in an epoch. */
SLUICE_API uint64_t sluice_loader_batches(const struct sluice_loader *ld);
/*
 * Resume state: seed, epoch and the global samples consumed after the
 * last batch returned.  Pass them back in the options to continue.  Exact
 * for a loader on one node that did not resume across node counts; for
 * any other, position counts the epoch's records consumed by all nodes
 * (the fill aside), a figure, not a place to resume from: take
 * sluice_loader_state_ex().
 */
SLUICE_API void sluice_loader_state(const struct sluice_loader *ld, uint64_t *seed, uint64_t *epoch,
				    uint64_t *position);
/*
 * The exact resume state of any loader: seed, epoch and the epoch's
 * segments so far into seg (room for cap; SLUICE_LOADER_SEGMENTS_MAX is
 * always enough), oldest first, the last being this loader's own phase
 * (nodes, positions of its node's sequence consumed after the last batch
 * returned).  Pass them back as the options' resume and nresume, with any
 * nodes and world size: the epoch goes on exactly.  A resume on the node
 * count of the last segment continues that phase; one on another count
 * keeps the list, which a loader then refuses once it would pass
 * SLUICE_LOADER_SEGMENTS_MAX (resume on the last segment's node count,
 * or start the next epoch).  Returns the number of segments, or -ENOSPC
 * when cap is smaller.
 */
SLUICE_API SLUICE_WUR int sluice_loader_state_ex(const struct sluice_loader *ld, uint64_t *seed, uint64_t *epoch,
						 struct sluice_loader_segment *seg, unsigned cap);
/* Starts epoch e from its beginning (drops prefetched batches). */
SLUICE_API SLUICE_WUR int sluice_loader_set_epoch(struct sluice_loader *ld, uint64_t e);
/*
 * Timings as JSON into buf (at most cap bytes, NUL-terminated): per stage
 * (read, collate, h2d, consumer wait) count and p50/p99 microseconds, and
 * batches, bytes and records delivered since open (over all epochs).
 * Returns the length it needed.
 */
SLUICE_API size_t sluice_loader_stats_json(struct sluice_loader *ld, char *buf, size_t cap);
SLUICE_API void sluice_loader_close(struct sluice_loader *ld);

/* ================================================================
 * Token packing: documents into rows of a fixed context length
 * ================================================================ */

struct sluice_packer;

struct sluice_packer_options {
	size_t size; /* sizeof(struct sluice_packer_options) */
	uint32_t context;     /* L, tokens per row (required) */
	uint32_t window;      /* documents gathered before they are placed (0: 1024); 1 with greedy */
	int greedy;           /* 1: documents in arrival order, a row closes when the next does not fit */
	int32_t pad_id;       /* input id of unused positions */
	int32_t ignore_index; /* label of masked positions (0: -100, unless ignore_index_set) */
	int ignore_index_set; /* 1: ignore_index as given, 0 included */
};
#define SLUICE_PACKER_OPTIONS_INIT { sizeof(struct sluice_packer_options), 0, 0, 0, 0, 0, 0 }

/*
 * One packed row.  input_ids, position_ids and labels hold context
 * entries; position ids restart at 0 at each document (and at the padding);
 * labels equal the input ids except at each document's first token and in
 * the padding, which get ignore_index, so no token is predicted across a
 * document boundary.  cu_seqlens[0..ndocs] are the documents' boundaries
 * (cu_seqlens[ndocs] = tokens).  Arrays belong to the packer, valid until
 * its next call.
 */
struct sluice_packed_row {
	const int32_t *input_ids, *position_ids, *labels;
	const int32_t *cu_seqlens;
	uint32_t ndocs, tokens;   /* documents (or pieces of longer ones) and real tokens */
};

SLUICE_API SLUICE_WUR int sluice_packer_new(struct sluice_packer **out, const struct sluice_packer_options *opt);
/*
 * Adds one document of n tokens.  A document longer than the context is
 * cut into pieces of at most context tokens, each packed as a document.
 * Returns 0 or -ENOMEM.
 */
SLUICE_API SLUICE_WUR int sluice_packer_add(struct sluice_packer *p, const int32_t *tokens, size_t n);
/*
 * The next finished row: 1 and *row, or 0 if none is finished yet.  With
 * flush set, documents still gathered are placed and every open row is
 * finished: call until it returns 0 at the end of the data.
 * Best-fit decreasing: a window of documents, longest first, each goes to
 * the open row with the least room that holds it (within a window every
 * row stays open, so a larger window never packs worse); rows that some
 * document seen so far could still fill stay open across windows (at most
 * 64, the emptiest).
 */
SLUICE_API int sluice_packer_row(struct sluice_packer *p, struct sluice_packed_row *row, int flush);
/* Real tokens and capacity (rows x context) of the rows handed out so far. */
SLUICE_API void sluice_packer_stats(const struct sluice_packer *p, uint64_t *tokens, uint64_t *capacity);
SLUICE_API void sluice_packer_free(struct sluice_packer *p);

/* ================================================================
 * Doctor: what on this machine stands between storage and the GPU
 * ================================================================ */

enum sluice_verdict {
	SLUICE_CHECK_OK = 0,
	SLUICE_CHECK_WARN = 1, /* works, slower than it could */
	SLUICE_CHECK_FAIL = 2, /* broken, or far from the hardware's speed */
};

/* One check's result; the strings are valid only during the callback. */
struct sluice_check {
	const char *name;  /* gpu, gds, pcie_link, filesystem, numa, iommu, io_uring, memlock, cgroup,
			      scheduler, read_ahead_kb, nr_requests, max_sectors_kb, hugepages, cpu_governor */
	enum sluice_verdict verdict;
	const char *value; /* what was measured, with the device or file it belongs to */
	const char *why;   /* why it matters for moving data into the GPU */
	const char *fix;   /* the command or step that fixes it; "" when ok */
};
typedef int (*sluice_check_fn)(const struct sluice_check *check, void *arg);

/*
 * Runs every check for data under path (a directory or file; "s3://..."
 * for objects; NULL: the current directory), calling fn once per result in
 * a fixed order; a nonzero return from fn stops and is returned.  The
 * checks read /proc and /sys under SLUICE_SYSROOT (default "/"); cuFile's
 * loading and an io_uring's creation are tried only against the real
 * root; a remote path is asked for once (check "storage": fail where its
 * endpoint cannot be reached, saying what failed).  Returns 0, fn's code,
 * or -ENOMEM / SLUICE_EINVAL_CONFIG (the settings, which size the pinned
 * pool the memlock check compares).
 */
SLUICE_API SLUICE_WUR int sluice_doctor(const char *path, sluice_check_fn fn, void *arg);

/* ================================================================
 * Experimental.  Everything above is the stable interface from 1.0: a
 * function keeps its signature and meaning, a struct that grows (one
 * whose first field is its size) only gains fields at its end.  What
 * follows may still change in a minor release: GPU process checkpoints
 * (the driver's interface is young) and the figures loaders publish
 * for `sluice top` and /metrics.
 * ================================================================ */

/* ---- GPU process checkpoints (the driver's cuCheckpointProcess* functions) ---- */

#define SLUICE_CKPT_SUSPEND 1u /* lock the process, then move its GPU memory to host memory */
#define SLUICE_CKPT_RESUME 2u  /* restore its GPU memory, then unlock it */

/* Each phase's time, and the GPU memory the checkpoint freed (or the restore took back). */
struct sluice_checkpoint_report {
	size_t size; /* sizeof(struct sluice_checkpoint_report), set by the caller */
	double lock_s, checkpoint_s, restore_s, unlock_s;
	uint64_t gpu_bytes;  /* NVML's used memory of all GPUs, before against after; 0 without NVML */
	int state;           /* the process's state at the end (sluice_process_state_name), -1 unknown */
};
#define SLUICE_CHECKPOINT_REPORT_INIT { sizeof(struct sluice_checkpoint_report), 0.0, 0.0, 0.0, 0.0, 0, 0 }

/*
 * Suspends and/or resumes the CUDA process pid (this user's, or any as
 * root) through the driver, loaded at run time: SUSPEND locks it (its
 * CUDA calls block; the lock waits up to timeout_ms for running work, 0:
 * no limit) and checkpoints it (its GPU memory moves to host memory, its
 * GPUs are free for others); RESUME restores and unlocks it.  Both in one
 * call is a round trip.  A checkpoint that fails unlocks the process again.
 * Returns 0; -ENOSYS when the driver lacks the functions (before 550);
 * SLUICE_ENOGPU without a driver; -EBUSY when pid is not in the state the
 * phase needs; SLUICE_ECUDA with the call, pid and CUDA error in the
 * detail.  rep (may be NULL) gets the figures, also after a failure.
 */
SLUICE_API SLUICE_WUR int sluice_process_checkpoint(int pid, unsigned flags, unsigned timeout_ms,
						    struct sluice_checkpoint_report *rep);
/* The CUDA process's state: 0 running, 1 locked, 2 checkpointed, 3 failed, 4/5 mid-checkpoint/restore. */
SLUICE_API SLUICE_WUR int sluice_process_state(int pid, int *state);
SLUICE_API const char *sluice_process_state_name(int state);

/* ---- Watching: loaders' published figures, GPU samples, Prometheus metrics ---- */

/*
 * What a running loader publishes (every batch) for `sluice top` and
 * /metrics: counts since it opened, and the seconds each stage took.
 */
struct sluice_loader_figures {
	int pid;               /* the process */
	unsigned id;           /* its loaders numbered from 1 */
	char dataset[256];     /* the dataset's path, cut to fit */
	uint64_t batches, records, bytes; /* delivered */
	uint64_t read_bytes, read_ios;    /* from storage */
	double wall_s;         /* first batch to the latest */
	double read_s, decompress_s, storage_wait_s, collate_s, h2d_s, consumer_wait_s; /* summed over threads */
	double gpu_wait_share; /* the consumer's share of wall time spent waiting (the GPU idle) */
	char verdict[32];      /* compute-bound, loader-bound, transfer-bound, no batches yet */
	double age_s;          /* (filled by the reader) seconds since the last update */
	uint64_t read_bytes_cached; /* of read_bytes, read through the page cache: the engine found the pages there
				       (its mincore sample), or O_DIRECT is off (SLUICE_DIRECT=never) */
	uint64_t object_cache_hits, object_cache_misses; /* the process's (sluice_object_cache_counts) */
};

/*
 * Up to cap running loaders' figures into out, from every process on the
 * machine that publishes under the same SLUICE_RUN_DIR (default /dev/shm;
 * without one, $TMPDIR or /tmp).  Returns how many there are (may exceed cap) or -errno.  The
 * files of processes that have ended are skipped (and removed if allowed).
 */
SLUICE_API int sluice_loaders_published(struct sluice_loader_figures *out, unsigned cap);

/*
 * This process's lookups in the cache of remote objects (SLUICE_CACHE_DIR) so far: copies found there and
 * good (hits), and objects downloaded into it (misses).
 */
SLUICE_API void sluice_object_cache_counts(uint64_t *hits, uint64_t *misses);

/* One GPU's figures now, from NVML (libnvidia-ml.so.1, loaded at run time). */
struct sluice_gpu_sample {
	unsigned index;
	char name[96];
	int util_pct;          /* kernels running, % of the last sample period; -1 unknown */
	int mem_util_pct;      /* memory reads/writes, same period; -1 unknown */
	uint64_t mem_used, mem_total; /* bytes */
	double pcie_rx_mb_s, pcie_tx_mb_s; /* into / out of the GPU, MB/s over NVML's 20 ms window; -1 unknown */
};

/*
 * Samples up to cap GPUs.  Returns how many GPUs there are, or a negative
 * code with a detail saying why NVML is unusable (not installed, no driver).
 */
SLUICE_API int sluice_gpu_sample(struct sluice_gpu_sample *out, unsigned cap);

/*
 * The machine's counters now, as a pipeline's monitoring watches them: CPU
 * time (all CPUs and each), host memory and the page cache, each whole
 * disk's and network interface's counters, and one process tree's CPU
 * time, memory and reads (a training script and its DataLoader workers).
 * Counters since boot (or the process's start): a rate is the difference
 * of two samples over their t.  Read from /proc (under SLUICE_SYSROOT).
 */
#define SLUICE_SAMPLE_CPUS 256
#define SLUICE_SAMPLE_DISKS 32
#define SLUICE_SAMPLE_NICS 16
#define SLUICE_SAMPLE_PROCS 256
struct sluice_cpu_times {
	double busy_s;         /* user, nice, system, irq, softirq, steal */
	double idle_s, iowait_s;
};
struct sluice_disk_counters {
	char name[32];
	uint64_t reads, read_bytes, writes, write_bytes;
	double read_wait_s;    /* summed over reads: their time queued and served */
	double busy_s;         /* time with I/O in flight */
};
struct sluice_nic_counters {
	char name[32];
	uint64_t rx_bytes, tx_bytes;
};
struct sluice_proc_counters {
	int pid, ppid;
	char name[32];         /* its command name (comm) */
	double cpu_s;          /* user and system, its threads' */
	uint64_t rss;          /* resident bytes */
	uint64_t read_bytes;   /* fetched from storage (not the page cache); 0 where /proc hides it */
	uint64_t rchar;        /* asked of read(2) and the like, cache hits included */
};
struct sluice_machine_sample {
	size_t struct_size;    /* sizeof(struct sluice_machine_sample), set by the caller */
	double t;              /* CLOCK_MONOTONIC seconds */
	unsigned ncpus;        /* entries of cpu[] filled (the machine's CPUs, up to SLUICE_SAMPLE_CPUS) */
	struct sluice_cpu_times all;
	struct sluice_cpu_times cpu[SLUICE_SAMPLE_CPUS];
	uint64_t mem_total, mem_available, page_cache, dirty, mlocked; /* bytes (/proc/meminfo) */
	unsigned ndisks;       /* whole disks (under /sys/block; no loop or ram devices) */
	struct sluice_disk_counters disk[SLUICE_SAMPLE_DISKS];
	unsigned nnics;        /* network interfaces, loopback left out */
	struct sluice_nic_counters nic[SLUICE_SAMPLE_NICS];
	unsigned nprocs;       /* the tree's processes: the root first, then its descendants */
	struct sluice_proc_counters proc[SLUICE_SAMPLE_PROCS];
	unsigned procs_left_out; /* descendants past SLUICE_SAMPLE_PROCS */
};

/*
 * Samples the machine, and the process tree of pid (0: this process; -1:
 * none) into *s (its struct_size set).  0, or a negative code where
 * /proc/stat cannot be read (the detail names it; what else could be read
 * is filled all the same).
 */
SLUICE_API int sluice_machine_sample(struct sluice_machine_sample *s, int pid);

/*
 * Prometheus text exposition (format 0.0.4) of this process's figures:
 * engine bytes, calls, errors and segment latency, and each open loader's
 * counts and stage seconds.  Writes at most cap bytes (NUL-terminated when
 * cap > 0); returns the length the whole text needs.
 */
SLUICE_API size_t sluice_metrics_text(char *buf, size_t cap);

/*
 * Serves sluice_metrics_text at http://ADDR:port/metrics from a thread of
 * libmicrohttpd's, on every address (0.0.0.0); port 0 picks a free one.  The
 * port served goes to *bound (may be NULL).  Once per process: a second call
 * returns the first one's port.  Setting SLUICE_METRICS_PORT does the same at
 * the first sluice_engine_open.  Returns 0, -EADDRINUSE and the like.
 */
SLUICE_API SLUICE_WUR int sluice_metrics_serve(unsigned port, unsigned *bound);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_H */
