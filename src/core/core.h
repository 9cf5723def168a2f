/*
 * core: errors, logging, configuration, time and statistics.
 * Depends on nothing else in sluice.
 */
#ifndef SL_CORE_H
#define SL_CORE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "sluice.h"

#define SL_HIDDEN __attribute__((visibility("hidden")))
#define SL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define SL_ALIGN 4096u

static inline uint64_t sl__align_down(uint64_t v, uint64_t a)
{
	return v & ~(a - 1);
}

static inline uint64_t sl__align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/* 1 if s ends in suffix with something before it (a file named ".tar" is no tar). */
static inline int sl__ends_with(const char *s, const char *suffix)
{
	size_t l = strlen(s), k = strlen(suffix);

	return l > k && !strcmp(s + l - k, suffix);
}

static inline uint64_t sl__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * Records code with a formatted detail for sluice_last_error_detail() and
 * returns code, so callers write `return sl__err(-EINVAL, "...")`.
 */
SL_HIDDEN int sl__err(int code, const char *fmt, ...) SL_PRINTF(2, 3);
SL_HIDDEN void sl__err_clear(void);

/*
 * The public structs that grow (sluice.h's conventions) start with their
 * size.  SL_V1 is a struct's size in the release that fixed it: through
 * the field that was last then, named forever in the call.  A field
 * added later is read or written only where the caller's size covers it.
 * sl__sized_in copies a caller's options into mine (full bytes): fields
 * an older caller lacks read 0; a newer caller's fields beyond full must
 * be 0.  NULL gives mine zeroed.  sl__report_in checks a caller's report
 * (NULL is fine) and clears it (sl__report_clear: the fields its size
 * covers, the size kept); both return 0 or an error naming the struct.
 * sl__report_copy copies a whole report of the library's into as much
 * of a caller's as its size covers.
 */
#define SL_V1(type, last) (offsetof(struct type, last) + sizeof(((struct type *)0)->last))
SL_HIDDEN int sl__sized_in(void *mine, size_t full, const void *theirs, size_t v1, const char *name);
SL_HIDDEN int sl__report_in(void *rep, size_t full, size_t v1, const char *name);
SL_HIDDEN void sl__report_clear(void *rep, size_t full);
SL_HIDDEN void sl__report_copy(void *theirs, const void *mine, size_t full);
/* Each growing struct's SL_V1: lines are only added, never edited. */
#define SL_V1_xfer_report SL_V1(sluice_xfer_report, bytes_verified)
#define SL_V1_copy_report SL_V1(sluice_copy_report, files_verified)
#define SL_V1_shard_report SL_V1(sluice_shard_report, why_not_gpu)
#define SL_V1_checkpoint_report SL_V1(sluice_checkpoint_report, state)
#define SL_V1_engine_info SL_V1(sluice_engine_info, ngpus)
#define SL_V1_stats SL_V1(sluice_stats, lat_max_us)
#define SL_V1_pack_report SL_V1(sluice_pack_report, dtype)
#define SL_V1_loader_options SL_V1(sluice_loader_options, device_index)
#define SL_V1_batch SL_V1(sluice_batch, event)
#define SL_V1_packer_options SL_V1(sluice_packer_options, ignore_index_set)
#define SL_V1_writer_options SL_V1(sluice_writer_options, metadata)
#define SL_V1_pack_options SL_V1(sluice_pack_options, progress_arg)
#define SL_V1_image_options SL_V1(sluice_image_options, resize)
#define SL_V1_machine_sample SL_V1(sluice_machine_sample, procs_left_out)
/* A field added to a caller's struct after SL_V1: 1 when the caller's size covers it. */
#define SL_COVERS(s, field) ((s)->size >= offsetof(__typeof__(*(s)), field) + sizeof((s)->field))
/* The checks of a caller's report or options of the struct sluice_NAME. */
#define SL_REPORT_IN(rep, NAME) sl__report_in((rep), sizeof(*(rep)), SL_V1_##NAME, "sluice_" #NAME)
#define SL_SIZED_IN(mine, theirs, NAME) sl__sized_in((mine), sizeof(*(mine)), (theirs), SL_V1_##NAME, "sluice_" #NAME)
#define SL_REPORT_CLEAR(rep) sl__report_clear((rep), sizeof(*(rep)))

/* Grows the malloc'd buffer *(void **)pp of *cap bytes to at least n bytes; 0 or -ENOMEM (*pp kept). */
SL_HIDDEN int sl__reserve(void *pp, size_t *cap, size_t n);
/* mkdir -p: path and every missing parent (path is changed while it runs, restored after); 0 or -errno. */
SL_HIDDEN int sl__mkdirs(char *path);
/*
 * open(2) of a path from outside (a file, a shard, an index, a settings
 * file) that MUST NOT block or stream forever: opened O_NONBLOCK (a FIFO
 * with no writer would hold a plain open), then refused unless a regular
 * file or a block device (a directory: -EISDIR; a FIFO, character device
 * or socket: -EINVAL, named in the detail), then O_NONBLOCK cleared.
 * Returns the descriptor (O_CLOEXEC), or -errno with a detail naming the
 * path and the cause.
 */
SL_HIDDEN int sl__open_file(const char *path, int oflags, mode_t mode);
/* What st_mode says a file is, in words ("FIFO", "directory"), for messages. */
SL_HIDDEN const char *sl__file_kind(mode_t mode);
/*
 * Whether a write may replace path by renaming a temporary over it: 0 if
 * path is absent or (through symlinks) a regular file; else an error
 * naming it (-EISDIR; -EINVAL for a device, FIFO or socket, which a rename
 * would turn into a regular file).  Called before the temporary is made.
 */
SL_HIDDEN int sl__replaceable(const char *path);
/* The same of name in the directory dirfd (AT_FDCWD: the working one), shown as shown in the error. */
SL_HIDDEN int sl__replaceable_at(int dirfd, const char *name, const char *shown);
/*
 * Links met while walking a tree (pack --from-dir, cp -r), decided in one
 * place.  sl__link_where: where path (an entry of the tree whose real
 * path is root, realpath(3)'s) leads: SL_LINK_NONE, no link (*st its
 * lstat); SL_LINK_IN, a link whose target lies in root (through any
 * chain of links, "..", absolute names); SL_LINK_OUT, one that leads out
 * of it; SL_LINK_DANGLING, one to nothing; SL_LINK_LOOP, one of a loop of
 * links (each leads to the next, and never to a file).  For IN and OUT, *st is the target's stat and real (PATH_MAX
 * bytes, or NULL) its real path.  -errno where path cannot be looked at.
 * sl__link_skipped: the one warning a walk gives for a link it skips
 * (OUT, DANGLING, LOOP), under tag, naming the link, the tree (root_shown) and
 * the target; hint: what takes it anyway ("--follow-symlinks"), or NULL.
 */
enum { SL_LINK_NONE = 0, SL_LINK_IN = 1, SL_LINK_OUT = 2, SL_LINK_DANGLING = 3, SL_LINK_LOOP = 4 };
struct stat;
SL_HIDDEN int sl__link_where(const char *root, const char *path, struct stat *st, char *real);
SL_HIDDEN void sl__link_skipped(const char *tag, int where, const char *path, const char *root_shown, const char *real,
				const char *hint);
/*
 * The directories on a walk's current path, by device and inode, so that
 * a link back to one of them (a loop) is seen: sl__dirs_enter returns 1
 * (entered), 0 (st is on the path already: not to be walked again), or
 * -ELOOP past SL_DIRS_DEEP; sl__dirs_leave undoes the last entry.
 */
#define SL_DIRS_DEEP 256
struct sl__dirs {
	struct { dev_t dev; ino_t ino; } v[SL_DIRS_DEEP];
	unsigned n;
};
SL_HIDDEN int sl__dirs_enter(struct sl__dirs *d, const struct stat *st);
SL_HIDDEN void sl__dirs_leave(struct sl__dirs *d);
/*
 * A file below the directory dirfd by a relative name of segments (no
 * "..", no "."), each opened with O_NOFOLLOW: a symbolic link anywhere on
 * the way (one swapped in after a walk listed the name) is refused
 * (-ELOOP, naming shown and saying so), as are non-regular files
 * (sl__open_file's rules).  The descriptor (O_RDONLY, O_CLOEXEC) or -errno.
 */
SL_HIDDEN int sl__open_beneath(int dirfd, const char *rel, const char *shown);
/*
 * The temporary of a write that then replaces dir/base by a rename:
 * ".BASE.sluice-tmp-HOST-PID-N" beside it (sluice.write's, sluice cp's,
 * and checkpoint.py's _TMP, which names them the same), made O_EXCL (never
 * a file or link already there), with mode under the umask; with link
 * (not NULL) a symbolic link to it instead.  First the temporaries of
 * base that writers of this host left and that are gone (killed before
 * their rename: kill(pid, 0) finds no such process), owned by this user,
 * are removed; a live writer's never.  dirfd: what the names are relative
 * to (AT_FDCWD: the working directory); dir: the directory below it (""
 * or NULL: dirfd's own).  Returns the descriptor (O_RDWR, O_CLOEXEC; 0 for
 * a link) with *tmp (malloc'd) its name relative to dirfd, or -errno.
 */
SL_HIDDEN int sl__tmp_open(int dirfd, const char *dir, const char *base, mode_t mode, const char *link, char **tmp);
/*
 * cachestat(2): the pages of fd's [off, off+len) in the page cache; -errno
 * where unanswered (before Linux 6.5, or sl__test_no_cachestat set by a test).
 */
SL_HIDDEN int64_t sl__cachestat(int fd, uint64_t off, uint64_t len);
SL_HIDDEN extern int sl__test_no_cachestat;
/*
 * The open file fd (shown in errors) out of the page cache, and no other
 * file: dirty pages written back (fdatasync), then all dropped
 * (POSIX_FADV_DONTNEED); what stayed counted (cachestat, else mincore)
 * into *cached (bytes; or NULL), why into why (cap bytes, or NULL): ""
 * when none stayed and that was counted.  0, or -errno (not a regular file).
 */
SL_HIDDEN int sl__page_cache_evict(int fd, const char *shown, uint64_t *cached, char *why, size_t cap);
/* The byte a URL's escape "%XX" at p[0, n) stands for, or -1 where p holds no such escape. */
SL_HIDDEN int sl__pct_byte(const char *p, size_t n);
/*
 * Appends s to out (cap bytes at out, l used), percent-encoding all but
 * RFC 3986's unreserved characters and, where slash is set, '/'.  Returns
 * the new length, 0 if it does not fit.
 */
SL_HIDDEN size_t sl__url_encode(char *out, size_t cap, size_t l, const char *s, int slash);
/*
 * Rewrites, in place, every URL (scheme://..., up to white space) in the
 * message s (of cap bytes; past 4096 it is cut there) as sluice_url_redact()
 * names it, so that no message leaks a password or a query whoever wrote
 * it.  sl__err() and the log pass every line through it.
 */
SL_HIDDEN void sl__redact_urls(char *s, size_t cap);
/*
 * s into buf (cap bytes, cut there) for a message: a byte that is not
 * printable ASCII as \xHH, so a name or value of any bytes shows, and no
 * escape sequence reaches a terminal.  Returns buf.
 */
SL_HIDDEN const char *sl__printable(const char *s, char *buf, size_t cap);
/*
 * par.c: work shared by threads.  struct sl__first_err keeps the first
 * error among them with the detail of the thread that met it (details are
 * thread-local); err may be read without the lock.  sl__first_err_raise
 * makes it the caller's error (0 if none).  sl__fanout runs fn(arg) on n
 * threads at once, the caller's one of them, and returns when all have:
 * threads that cannot start leave their share to the others.
 */
struct sl__first_err {
	pthread_mutex_t lock;
	_Atomic int err;
	char detail[512];
};
SL_HIDDEN void sl__first_err_init(struct sl__first_err *fe);
SL_HIDDEN void sl__first_err_keep(struct sl__first_err *fe, int rc);
SL_HIDDEN int sl__first_err_raise(struct sl__first_err *fe);
SL_HIDDEN void sl__first_err_fini(struct sl__first_err *fe);
SL_HIDDEN void sl__fanout(unsigned n, void *(*fn)(void *arg), void *arg);
/*
 * sys.c: machine facts, in one place for the engine and `sluice doctor`.
 * sl__sysroot: SLUICE_SYSROOT ("" for the machine's own /), under which
 * sl__sys_read reads a /proc or /sys file (formatted path) into buf,
 * trailing white space cut: 0 or -errno.  sl__nvfs_loaded: 1 if the
 * nvidia-fs module is loaded (without it cuFile runs in compat mode only).
 * sl__memlock: the memlock limit, unlimited, and whether CAP_IPC_LOCK
 * lifts it: 0 or -ENOENT when /proc does not say.
 */
SL_HIDDEN const char *sl__sysroot(void);
SL_HIDDEN int SL_PRINTF(3, 4) sl__sys_read(char *buf, size_t cap, const char *fmt, ...);
SL_HIDDEN int sl__sys_vread(char *buf, size_t cap, const char *fmt, va_list ap);
SL_HIDDEN int sl__nvfs_loaded(void);
SL_HIDDEN int sl__memlock(uint64_t *soft, int *unlimited, int *ipc_lock);

/* crc(A||B) from crc(A), crc(B) and len(B), for CRC32C. */
SL_HIDDEN uint32_t sl__crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);
/*
 * The CRCs S3 objects carry end to end (and sluice's records: CRC32C),
 * which a whole read's pieces' CRCs fold into.  SL_CRC64NVME is
 * CRC-64/NVME (S3's CRC64NVME); the 32-bit kinds' values have the upper
 * 32 bits zero.
 */
enum { SL_CRC_NONE = 0, SL_CRC32C = 1, SL_CRC32 = 2, SL_CRC64NVME = 3 };
/* CRC of kind over n bytes, continuing from crc (0 to start), and the combine of two. */
SL_HIDDEN uint64_t sl__crc(int kind, uint64_t crc, const void *p, size_t n);
SL_HIDDEN uint64_t sl__crc_combine(int kind, uint64_t crc1, uint64_t crc2, uint64_t len2);
/* CRC-64/NVME of n bytes continuing from crc (0 to start): sl__crc(SL_CRC64NVME, ...). */
SL_HIDDEN uint64_t sl__crc64nvme(uint64_t crc, const void *p, size_t n);

/*
 * SLUICE_TRACE: spans of work (name, start and end in sl__now_ns, the thread's
 * CPU time in it, a number such as the batch) written at close as a Chrome
 * trace.  sl__trace_open with no path gives a NULL trace; spans on it cost
 * nothing.
 */
struct sl__trace;
SL_HIDDEN int sl__trace_open(struct sl__trace **t, const char *path);
SL_HIDDEN void sl__trace_span(struct sl__trace *t, const char *name, uint64_t t0, uint64_t t1, uint64_t cpu_ns,
			      uint64_t n);
SL_HIDDEN int sl__trace_close(struct sl__trace *t);
SL_HIDDEN uint64_t sl__thread_cpu_ns(void);

/* Logging; tag names the subsystem ("io", "gpu", "xfer", "core"). */
SL_HIDDEN extern int sl__log_level;
SL_HIDDEN void sl__log(int level, const char *tag, const char *fmt, ...) SL_PRINTF(3, 4);
#define sl__warn(tag, ...) sl__log(SLUICE_LOG_WARN, tag, __VA_ARGS__)
#define sl__info(tag, ...) sl__log(SLUICE_LOG_INFO, tag, __VA_ARGS__)
/* Lines the user asked for (SLUICE_STATS): printed whatever the level. */
#define sl__stat(tag, ...) sl__log(-1, tag, __VA_ARGS__)
#define sl__debug(tag, ...)                                   \
	do {                                                  \
		if (sl__log_level >= SLUICE_LOG_DEBUG)        \
			sl__log(SLUICE_LOG_DEBUG, tag, __VA_ARGS__); \
	} while (0)

/* The resolved configuration an engine copies at open. */
struct sluice_config {
	enum sluice_backend backend;
	enum sluice_direct direct;
	enum sluice_staging staging;
	unsigned threads;
	unsigned queue_depth;
	size_t max_transfer_size;
	size_t read_gap;         /* reads this close coalesce, the gap read too */
	size_t buffer_pool_size; /* 0: threads * queue_depth * chunk */
	int device;              /* the first of devices: the engine's own GPU */
	int devices[SLUICE_MAX_DEVICES];
	unsigned ndevices;       /* 1..SLUICE_MAX_DEVICES */
	int enable_p2p;          /* GPU to GPU copies peer to peer (default 1) */
	int sqpoll;
	int gpu;
};
SL_HIDDEN void sl__config_defaults(struct sluice_config *cfg);
/*
 * settings.c: the registry of every SLUICE_* setting.  Scopes: an engine's
 * (a struct sluice_config field, set through its typed setter by apply),
 * the process's (read where used, checked at the first config), the
 * environment's alone (not in the settings file).
 */
enum sl__set_type { SL_SET_WORD, SL_SET_UINT, SL_SET_SIZE, SL_SET_BOOL, SL_SET_SECONDS, SL_SET_PATH, SL_SET_LIST };
enum sl__set_scope { SL_SCOPE_ENGINE, SL_SCOPE_PROCESS, SL_SCOPE_ENV };
struct sl__setting_def {
	const char *name;            /* "SLUICE_THREADS"; the file's key is the rest, lower case */
	int type, scope;
	uint64_t min, max, step;     /* UINT, SIZE, BOOL: the range; SIZE: a multiple of step (0: any) */
	const char *words;           /* WORD: "auto|uring|psync|gds", the value is the index */
	const char *def;             /* the default as written, "" where the machine decides (help says how) */
	const char *help;
	/* ENGINE: sets cfg from the parsed number u or the text v, through the typed setter. */
	int (*apply)(struct sluice_config *cfg, uint64_t u, const char *v);
	/* Optional: what the type cannot say (a directory writable); 0 or an error saying why. */
	int (*check)(const char *v);
};
SL_HIDDEN extern const struct sl__setting_def sl__settings[];
/* By "SLUICE_X" or the file's key "x"; NULL if there is no such setting. */
SL_HIDDEN const struct sl__setting_def *sl__setting_def(const char *name);
/*
 * The value in force, as text: the environment's, else the settings
 * file's, else NULL (the pointer stays valid for the process).
 * sl__setting_from names where it came from ("the environment", the file's
 * path, "the default"); sl__settings_check is 0 or the error of a settings
 * file that did not parse.
 */
SL_HIDDEN const char *sl__setting(const char *name);
SL_HIDDEN const char *sl__setting_from(const char *name);
SL_HIDDEN int sl__settings_check(void);
/*
 * v checked as d wants: 0 and its number in *u (a word's index, 0/1, a
 * count, bytes, or nanoseconds for SECONDS), or SLUICE_EINVAL_CONFIG
 * naming d, v, from and what is wanted.
 */
SL_HIDDEN int sl__setting_parse(const struct sl__setting_def *d, const char *v, const char *from, uint64_t *u);
/*
 * A setting's number in force (its default where unset): 0; 1 when unset
 * without a default (*out 0); or the error.  sl__setting_num: the same of
 * the text v (NULL or "": unset) that came from from.
 */
SL_HIDDEN int sl__setting_u64(const char *name, uint64_t *out);
SL_HIDDEN int sl__setting_num(const char *name, const char *v, const char *from, uint64_t *out);
/* Where SLUICE_* values come from: sl__setting, or a test's or fuzzer's table. */
struct sl__env {
	const char *(*get)(const char *name, void *ctx);
	void *ctx;
	const char *(*from)(const char *name, void *ctx); /* for errors; NULL: "the table" */
};
/* Checks every setting env holds, and applies the engine's to cfg through the setters. */
SL_HIDDEN int sl__settings_apply(struct sluice_config *cfg, const struct sl__env *env);

/*
 * Parses an INI text (AWS shared-config files, sluice's settings file) (len bytes, NUL not needed):
 * calls fn(section, key, value, ctx) for every setting, with keys of an
 * indented block under "s3 =" as "s3.KEY".  Comments start with # or ;.
 * name is the file's path for errors.  Returns 0, fn's nonzero return
 * (which stops the parse), or SLUICE_EINVAL_CONFIG for a line that is
 * neither a [section], a key = value nor a continuation.
 */
SL_HIDDEN int sl__ini_parse(const char *text, size_t len, const char *name,
			    int (*fn)(const char *section, const char *key, const char *value, void *ctx), void *ctx);
/*
 * Rewrites the INI file at path with keys[i] = vals[i] (n <= 16) in
 * [section], under a "# note" line, right after the section's header (a
 * new section at the end if it has none); every other line is kept but the
 * section's old lines for those keys and old notes starting "# note_tag".
 * The result is read back through sl__ini_parse before it replaces the
 * file (atomically, by rename).  0 or an error naming the file.
 */
SL_HIDDEN int sl__ini_update(const char *path, const char *section, const char *const *keys, const char *const *vals,
			     unsigned n, const char *note, const char *note_tag);
/* sl__ini_parse of the file at path; a missing file is 0 (nothing set); at most 1 MiB. */
SL_HIDDEN int sl__ini_file(const char *path, int (*fn)(const char *section, const char *key, const char *value, void *ctx),
			   void *ctx);

/*
 * Latency histogram: log2 buckets split into 16 linear sub-buckets, so
 * any percentile is within 1/16 (6%) of the true value.  Updates are
 * atomic so worker threads record without a lock.
 */
#define SL_HIST_SUB 16
#define SL_HIST_BUCKETS (64 * SL_HIST_SUB)
struct sl__hist {
	_Atomic uint64_t count[SL_HIST_BUCKETS];
	_Atomic uint64_t n, sum, max;
};
SL_HIDDEN void sl__hist_add(struct sl__hist *h, uint64_t v);
SL_HIDDEN uint64_t sl__hist_percentile(const struct sl__hist *h, double p);
SL_HIDDEN void sl__hist_reset(struct sl__hist *h);

#endif
