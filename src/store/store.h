/*
 * store: where bytes live, behind one ops table per kind of storage (the
 * shape of fio's ioengine_ops).  A store opens what a path names (a local
 * file, an s3:// object, an http(s):// URL) into a handle, and moves bytes
 * between that handle and memory.  The engine picks one store per file at
 * open (the registry, registry.c, through the engine's sl__store_for) and
 * keeps, in each worker thread, one instance (struct sl__io_ctx) of each
 * store it uses: instances are never shared between threads, and stores
 * never call each other.
 *
 * A store owns names as well as bytes (fio's open_file, get_file_size,
 * unlink_file): what a name is (info: kind, size, version tag), the names
 * below a directory (list), remove, and a whole file as of a version
 * (fetch).  Everything that asks what a path is or where its bytes are,
 * the datasets, the cache, sluice_list/remove/copy and Python, asks the
 * registry (registry.c) for the path's store, never the path's scheme.
 *
 * Every store lives here: local files (uring.c, psync.c, and local.c, what
 * they share), gds (gds.c, through gpu/), s3:// and http(s):// (s3store.c,
 * httpstore.c, over remote/'s transport); the names side over them is
 * names.c, the cache of remote files cache.c, sluice_copy copy.c.
 * Depends on core, remote (the transport) and gpu (cuFile).
 */
#ifndef SL_STORE_H
#define SL_STORE_H

#include <sys/types.h>

#include "core/core.h"

enum sl__io_opcode { SL_IO_READ = 0, SL_IO_WRITE = 1 };

enum sl__store_caps {
	SL_STORE_GPU_MEM = 1u << 0,  /* io->buf may be GPU memory (cuFile) */
	SL_STORE_ASYNC = 1u << 1,    /* several I/Os in flight per instance */
	SL_STORE_FIXED = 1u << 2,    /* registered buffers and files */
	SL_STORE_STREAM = 1u << 3,   /* a read's bytes arrive in order over its time (io->progress is called) */
	SL_STORE_SUMS = 1u << 4,     /* sums a read's bytes as they arrive (io->sum_kind) */
	SL_STORE_READONLY = 1u << 5, /* files open read-only: written whole, another way (upload) */
	SL_STORE_LOCAL = 1u << 6,    /* files of the local file system: opened in place, never cached */
	SL_STORE_URL_NAMES = 1u << 7, /* paths are URLs: names in them percent-encoded (a file "a b" is .../a%20b) */
};

/*
 * The registry, in the order a path's store is chosen: the first whose
 * match claims the path (a URL's scheme, or a mount: a 3FS or Lustre
 * path), else the first usable store of local files in this order (gds
 * for GPU destinations where it is usable, then uring, then psync).  A new
 * store is one file and one name here; its id (SL_STORE_ID_name) and every
 * array by store follow from this list.
 */
#define SL_STORE_LIST(X) X(uring) X(psync) X(gds) X(s3) X(http)
enum sl__store_id {
#define SL_STORE_ENUM(n) SL_STORE_ID_##n,
	SL_STORE_LIST(SL_STORE_ENUM)
#undef SL_STORE_ENUM
	SL_STORES
};

/* One storage I/O.  Owned by the caller from submit until reaped. */
struct sl__io {
	int op;               /* enum sl__io_opcode */
	void *handle;         /* the store's handle of the file (what its open made, or a route gave) */
	int direct;           /* local files: through O_DIRECT, else the page cache */
	int file_index;       /* index in the engine's file table, -1 if none */
	unsigned file_gen;    /* generation of that index, to detect reuse */
	void *buf;
	int buf_index;        /* registered buffer index, -1 if none */
	uint64_t offset;
	size_t len;
	ssize_t res;          /* bytes transferred or -errno, set at reap */
	void *user;
	/*
	 * Optional, reads of SL_STORE_STREAM stores: called as the bytes
	 * arrive with how many of io->buf are there so far, so the caller can
	 * move them on before the whole I/O is done.  The count may go back to
	 * 0 when the store starts over (a retry): the bytes it then receives
	 * again are the same.
	 */
	void (*progress)(struct sl__io *io, size_t bytes);
	/*
	 * A failed I/O's detail where the store knows more than an errno
	 * (the URL, the HTTP status, the server's code, the attempts), set
	 * with res; "" otherwise.  The caller names it in its own error.
	 */
	char detail[256];
	/*
	 * Optional, reads of SL_STORE_SUMS stores: sum_kind (SL_CRC32C,
	 * SL_CRC32 or SL_CRC64NVME, 0 none) asks for the CRC of the bytes
	 * delivered, taken as they arrive; the store sets sum, over res
	 * bytes, with res.
	 */
	int sum_kind;
	uint64_t sum;
};

/*
 * What a store's open fills in: the part of a sluice_file that is the
 * store's.  size is kept current by the engine (writes extend it).
 */
struct sl__sfile {
	const struct sl__store *ops;
	void *handle;
	_Atomic uint64_t size;
	int direct_ok;        /* the file takes O_DIRECT I/O */
	const char *shown;    /* how messages name it where not by its path (a URL's query is a credential); NULL: the path */
	/*
	 * The whole file's end-to-end checksum where the store learnt one at
	 * open (an object's x-amz-checksum-crc32c): sum_kind SL_CRC32C,
	 * SL_CRC32 or SL_CRC64NVME, 0 none; sum_name names it for reports (""
	 * none, or why it is not checked).  A whole read is matched against
	 * it, its pieces' CRCs folded in file order (job.c), wherever they
	 * land, GPU memory included.
	 */
	int sum_kind;
	uint64_t sum;
	char sum_name[48];
};

/* What a store's open gets beside the path. */
struct sl__open_env {
	const struct sluice_config *cfg;
	/*
	 * The store's state shared by every file of one engine (an S3
	 * client), NULL until a store's open sets it, under the engine's lock
	 * (lock/unlock); released by the store's release at engine close.
	 */
	void **shared;
	void (*lock)(void *arg), (*unlock)(void *arg);
	void *lock_arg;
	void *arg; /* the caller's choice for this open (an S3 client of its own), NULL: the store's default */
};

/* A segment's question to its file's store: how does its I/O run? */
struct sl__route_ask {
	int op;
	uint64_t off;
	size_t len;
	int pad_ok;           /* a write may pad to 4 KiB past the end (truncated later) */
	int gpu_whole;        /* one piece of GPU memory, no CRC asked: a store may move it straight there */
	int want_map;         /* a read that would take its bytes from a mapping of the page cache (route.map) */
	const struct sluice_config *cfg;
	const struct sl__store *local; /* the engine's store of local files, for stores that hand host I/O on */
};

/* The answer: the store whose worker instance runs the I/O, on which handle, and how. */
struct sl__route {
	const struct sl__store *store;
	void *handle;
	int direct;           /* O_DIRECT: aligned, through a bounce slot unless memory is aligned too */
	int gpu;              /* io->buf is the caller's GPU memory (store has SL_STORE_GPU_MEM) */
	const char *map;      /* asked (want_map), of a read through the page cache: its bytes mapped, read-only */
};

struct sl__io_ctx;

/* What a name is (a store's info). */
enum sl__kind { SL_KIND_FILE = 1, SL_KIND_DIR = 2 };
struct sl__entry {
	int kind;             /* SL_KIND_FILE, or SL_KIND_DIR: a directory, or a prefix with names below it */
	uint64_t size;        /* a file's bytes */
	/*
	 * A file's version: it changes whenever the content may have (a local
	 * file's device, inode, mtime and size; an object's ETag; a web file's
	 * strong ETag, else its Last-Modified and size); "" where the store
	 * cannot tell versions apart, and then no copy of it is trusted.
	 */
	char tag[256];        /* names.h's SL_TAG_MAX */
};

/* What a name op gets beside the path: the shared state of the engine that asks, or of the process. */
struct sl__open_env;

struct sl__store {
	const char *name;
	int id;               /* its index in the registry (SL_STORE_ID_name, registry.c) */
	unsigned caps;        /* enum sl__store_caps */
	/* match: optional.  1 if the store serves path (its URL scheme); stores without one serve local files. */
	int (*match)(const char *path);
	/*
	 * probe: required.  Called once per engine before any init.  Returns
	 * 0 if the store is usable with cfg; otherwise a negative code and a
	 * sentence in why saying what makes it unusable (it reaches logs and
	 * `sluice doctor`).
	 */
	int (*probe)(const struct sluice_config *cfg, char *why, size_t why_len);
	/*
	 * open: required.  Opens path (flags: SLUICE_RDWR, SLUICE_CREATE) and
	 * fills sf's handle, size and direct_ok (and its checksum where the
	 * store knows one).  Returns 0 or an error naming path.
	 */
	int (*open)(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env);
	/* close: required.  Frees what open made; called with nothing in flight. */
	void (*close)(struct sl__sfile *sf);
	/* stat: optional.  The file's size now (it may have grown), or an error. */
	int (*stat)(struct sl__sfile *sf, uint64_t *size);
	/* truncate, sync: required of writable stores.  0 or -errno; errors name path. */
	int (*truncate)(struct sl__sfile *sf, const char *path, uint64_t size);
	int (*sync)(struct sl__sfile *sf, const char *path);
	/*
	 * route: optional.  How a segment's I/O runs; without one, on this
	 * store's instance, buffered, through host memory.
	 */
	void (*route)(const struct sl__sfile *sf, const struct sl__route_ask *a, struct sl__route *r);
	/*
	 * put: optional, of SL_STORE_READONLY stores whose files are written
	 * whole (objects): len bytes at src become path's whole content.  With
	 * copy set, src is GPU memory that copy(copy_ctx, dst, src, n) moves to
	 * host memory a piece at a time.  0 or an error naming path.
	 */
	int (*put)(const char *path, const void *src, size_t len, int (*copy)(void *ctx, void *dst, const void *src, size_t n),
		   void *copy_ctx, const struct sl__open_env *env);
	/* release: optional.  Frees an engine's shared state (struct sl__open_env). */
	void (*release)(void *shared);
	/*
	 * init: required.  Called on the worker thread that will use the
	 * instance, while the engine opens; depth is the most I/Os the caller
	 * keeps in flight.  Sets ctx->priv.  MUST be quick: the engine's open
	 * waits for every worker's.
	 */
	int (*init)(struct sl__io_ctx *ctx, const struct sluice_config *cfg, unsigned depth);
	/*
	 * register_bufs: optional (SL_STORE_FIXED).  Called on the owning
	 * thread after init, before its first I/O, once the engine is open:
	 * registers the worker's bounce slots (bufs/nbufs/buf_size), which
	 * pins their pages and may take milliseconds.  Sets ctx->fixed when
	 * they are registered; a refusal is not an error (I/O then uses
	 * plain buffers).
	 */
	void (*register_bufs)(struct sl__io_ctx *ctx, void *const *bufs, unsigned nbufs, size_t buf_size);
	/*
	 * submit: required.  Queues io; it may already complete inside
	 * submit (synchronous stores).  Returns 0 or a negative code if io
	 * could not be queued (io then never comes back from reap).
	 */
	int (*submit)(struct sl__io_ctx *ctx, struct sl__io *io);
	/*
	 * reap: required.  Starts anything queued, then hands back up to max
	 * completed I/Os in done[], waiting for at least one if wait is set
	 * and any is in flight.  Returns the count or a negative code.
	 */
	int (*reap)(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max, int wait);
	/* fini: required.  Called on the owning thread with nothing in flight. */
	void (*fini)(struct sl__io_ctx *ctx);
	/* The SLUICE_* settings the store reads, NULL-terminated (for `sluice info --settings`); NULL: none. */
	const char *const *settings;
	/*
	 * verify: optional.  A whole read's n bytes, in order, checked against
	 * a checksum the file has that the engine cannot fold from its pieces'
	 * CRCs (sum_kind 0; an object's SHA-256, say): 1 matched, 0 the file
	 * has none, SLUICE_EVERIFY naming the file on a mismatch, or an error.
	 * buf: the bytes in host memory; NULL where they are not (GPU memory):
	 * copy(ctx, dst, off, len) then brings len of them at off into host
	 * memory dst, 0 or an error.  Called after the read, on the caller's
	 * thread.
	 */
	int (*verify)(const struct sl__sfile *sf, const void *buf, size_t n,
		      int (*copy)(void *ctx, void *dst, uint64_t off, size_t len), void *ctx);

	/*
	 * Names (fio's get_file_size and unlink_file), with no engine: remote
	 * stores use the process's client.  Errors name the path.
	 * info: required.  What path names, into e; -ENOENT where nothing.
	 * list: optional (-EOPNOTSUPP without).  Every file directly in dir
	 * (recursive: below it), as its whole name, to add(arg, name); a
	 * nonzero return from add stops the listing with it.  Names that would
	 * lead outside dir (".", "..", absolute) are never given.
	 * remove: optional.  The file is gone: unlink(2), DELETE.
	 * fetch: required.  The whole file into fd from offset 0, as of the
	 * version tag (an info's; -ESTALE where the file is another now),
	 * checked against the file's checksum where it has one (*verified or
	 * NULL: whether; sum_name or NULL: which, or why none); cancel (or
	 * NULL), once set, stops it with -ECANCELED.
	 * where: optional.  Where path's bytes come from beyond its name (an
	 * S3 endpoint), for the cache's keys; "" without.
	 * put_sum: what a put's bytes are checked with at the far end; NULL: nothing.
	 */
	int (*info)(const char *path, struct sl__entry *e);
	int (*list)(const char *dir, int recursive, int (*add)(void *arg, const char *name), void *arg);
	int (*remove)(const char *path);
	int (*fetch)(const char *path, const char *tag, int fd, const _Atomic int *cancel, int *verified,
		     char sum_name[48]);
	void (*where)(char *out, size_t cap);
	const char *put_sum;
	/*
	 * register_mem: optional.  Registers GPU memory [ptr, ptr + len) as a
	 * destination with the store (cuFileBufRegister), once, before many
	 * transfers into it; 0, or an error (the memory is then used
	 * unregistered).  deregister_mem undoes it.
	 */
	int (*register_mem)(void *ptr, size_t len);
	void (*deregister_mem)(void *ptr);
};

struct sl__io_ctx {
	const struct sl__store *ops;
	void *priv;
	unsigned inflight;
	int fixed; /* set by register_bufs: the buffers it was given are registered */
};

/* Every store, each defined in its own file, and the registry's table of them by id (registry.c). */
#define SL_STORE_EXTERN(n) SL_HIDDEN extern const struct sl__store sl__store_##n;
SL_STORE_LIST(SL_STORE_EXTERN)
#undef SL_STORE_EXTERN
SL_HIDDEN extern const struct sl__store *const sl__stores[SL_STORES];
/* The stores of local files in the order they are preferred, NULL-terminated. */
SL_HIDDEN extern const struct sl__store *const sl__local_order[];
/* The store whose match claims path, or NULL (a local file). */
SL_HIDDEN const struct sl__store *sl__store_match(const char *path);
/* The store that names path: the one whose match claims it, else one of local files (their name ops are one). */
SL_HIDDEN const struct sl__store *sl__store_of(const char *path);
/*
 * uring.c: 0 if count rings of entries each, with these setup flags, can
 * be held at once here, else io_uring_setup's -errno: what the uring
 * store's probe (the workers' rings) and `sluice doctor` both ask.
 */
SL_HIDDEN int sl__uring_try(unsigned flags, unsigned entries, unsigned count);

static inline int sl__io_init(struct sl__io_ctx *ctx, const struct sl__store *ops,
			      const struct sluice_config *cfg, unsigned depth)
{
	ctx->ops = ops;
	ctx->priv = NULL;
	ctx->inflight = 0;
	ctx->fixed = 0;
	return ops->init(ctx, cfg, depth);
}

static inline void sl__io_register_bufs(struct sl__io_ctx *ctx, void *const *bufs, unsigned nbufs,
					size_t buf_size)
{
	if (ctx->ops && ctx->ops->register_bufs)
		ctx->ops->register_bufs(ctx, bufs, nbufs, buf_size);
}

static inline int sl__io_submit(struct sl__io_ctx *ctx, struct sl__io *io)
{
	int rc = ctx->ops->submit(ctx, io);

	if (!rc)
		ctx->inflight++;
	return rc;
}

static inline int sl__io_reap(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max,
			      int wait)
{
	int n;

	if (!ctx->inflight)
		return 0;
	n = ctx->ops->reap(ctx, done, max, wait);
	if (n > 0)
		ctx->inflight -= (unsigned)n;
	return n;
}

static inline void sl__io_fini(struct sl__io_ctx *ctx)
{
	if (ctx->ops)
		ctx->ops->fini(ctx);
	ctx->ops = NULL;
}

/*
 * Synchronous pread/pwrite of the whole range, retrying EINTR and partial
 * transfers; stops early only at EOF (reads).  Returns bytes or -errno.
 */
SL_HIDDEN ssize_t sl__pio_full(int op, int fd, void *buf, size_t len, uint64_t off);

/*
 * The completion queue of synchronous stores: submit does the I/O, then
 * sl__sync_complete() queues io for reap.  init/reap/fini serve as ops.
 */
SL_HIDDEN int sl__sync_init(struct sl__io_ctx *ctx, const struct sluice_config *cfg, unsigned depth);
SL_HIDDEN int sl__sync_complete(struct sl__io_ctx *ctx, struct sl__io *io);
SL_HIDDEN int sl__sync_reap(struct sl__io_ctx *ctx, struct sl__io **done, unsigned max, int wait);
SL_HIDDEN void sl__sync_fini(struct sl__io_ctx *ctx);

/*
 * local.c: what the stores of local files share.  A local file's handle
 * (struct sl__local) is its two descriptors (buffered, and O_DIRECT or -1
 * where the filesystem refuses it), and how it asks the page cache what
 * it holds: cachestat(2), or where the kernel lacks that (before 6.5) a
 * read-only mapping sampled with mincore().  Stores that extend a local
 * file (gds) put a struct sl__local first in their handle and use these as
 * their own ops.
 */
struct sl__local {
	int fd, dfd;
	int cachestat;  /* the kernel answers cachestat(2) for this file */
	_Atomic(char *) map; /* the file mapped read-only: at open without cachestat (mincore), else on first want_map */
	size_t map_len; /* its bytes: the file's size at open */
};
SL_HIDDEN int sl__local_open(struct sl__sfile *sf, const char *path, int flags, const struct sl__open_env *env);
/* The same with a handle of hsize bytes (>= sizeof(struct sl__local), zeroed past it), for stores that extend it. */
SL_HIDDEN int sl__local_open_as(struct sl__sfile *sf, const char *path, int flags, size_t hsize);
SL_HIDDEN void sl__local_close(struct sl__sfile *sf);
SL_HIDDEN int sl__local_stat(struct sl__sfile *sf, uint64_t *size);
SL_HIDDEN int sl__local_truncate(struct sl__sfile *sf, const char *path, uint64_t size);
SL_HIDDEN int sl__local_sync(struct sl__sfile *sf, const char *path);
/* O_DIRECT where the file takes it and the range is not mostly in the page cache (cfg->direct). */
SL_HIDDEN void sl__local_route(const struct sl__sfile *sf, const struct sl__route_ask *a, struct sl__route *r);
/* The descriptor io runs on: its handle's O_DIRECT one or its buffered one. */
static inline int sl__local_fd(const struct sl__io *io)
{
	const struct sl__local *l = io->handle;

	return io->direct ? l->dfd : l->fd;
}
/* gds.c: 1 if sf is a gds file registered with cuFile (its GPU transfers go straight there). */
SL_HIDDEN int sl__gds_registered(const struct sl__sfile *sf);
/* The name ops of local files (local.c). */
SL_HIDDEN int sl__local_info(const char *path, struct sl__entry *e);
SL_HIDDEN int sl__local_list(const char *dir, int recursive, int (*add)(void *arg, const char *name), void *arg);
SL_HIDDEN int sl__local_remove(const char *path);
SL_HIDDEN int sl__local_fetch(const char *path, const char *tag, int fd, const _Atomic int *cancel, int *verified,
			      char sum_name[48]);
/* The bytes of the open file in (size of them, shown in errors) into fd from offset 0, in the kernel (copy_file_range). */
SL_HIDDEN int sl__local_copy_fd(int in, uint64_t size, int fd, const _Atomic int *cancel, const char *shown);
/*
 * The files of the tree below root for a copy of it (cp -r), links
 * decided as pack --from-dir decides them (core's sl__link_where): a link
 * whose target lies in the tree is taken as that target (a directory is
 * walked, unless it is one on the walk's own path: a loop, skipped and
 * named), or with SL_TREE_LINKS given as a link to make; one that leads
 * out of the tree, to nothing or round a loop is skipped and named, unless
 * SL_TREE_FOLLOW takes one leading out as its target.  FIFOs, devices
 * and sockets are skipped and named, and counted in *skipped.  Each to
 * add(arg, e), whose nonzero return stops the walk with it; the strings
 * of e are valid during the call.  0, or -errno naming the directory that
 * could not be read.
 */
enum { SL_TREE_LINKS = 1, SL_TREE_FOLLOW = 2 };
struct sl__tree_entry {
	const char *rel;       /* its name below root, as the walk reached it: the copy's name */
	const char *real;      /* its real path below root's, "a/b" (no link in it when listed); absolute: outside */
	const char *link;      /* SL_TREE_LINKS: the target, relative to rel's directory, of the link to make; or NULL */
	const struct stat *st; /* the file's (a link kept: its target's) */
};
SL_HIDDEN int sl__local_tree(const char *root, unsigned flags, int (*add)(void *arg, const struct sl__tree_entry *e),
			     void *arg, uint64_t *skipped);
/* At most 2^24 files and directories a tree (-E2BIG past them); a test sets a smaller bound. */
SL_HIDDEN extern unsigned sl__test_tree_max;
/* The file and name ops of a store of local files, in its struct sl__store. */
#define SL_LOCAL_FILE_OPS                                                                                   \
	.open = sl__local_open, .close = sl__local_close, .stat = sl__local_stat, .truncate = sl__local_truncate, \
	.sync = sl__local_sync, .route = sl__local_route, .info = sl__local_info, .list = sl__local_list,          \
	.remove = sl__local_remove, .fetch = sl__local_fetch
/* Set by tests to simulate a filesystem that refuses O_DIRECT (and core.h's sl__test_no_cachestat, a kernel without cachestat(2)). */
SL_HIDDEN extern int sl__test_refuse_direct;

#endif
