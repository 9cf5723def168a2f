/*
 * remote: object storage (S3 and compatible stores).  s3conf.c resolves
 * where to connect and with which credentials the way AWS tools do, and
 * parses s3:// URLs.  Depends on core only.
 */
#ifndef SL_REMOTE_H
#define SL_REMOTE_H

#include <pthread.h>
#include <sys/stat.h>

#include "core/core.h"

/*
 * What a client connects with.  secret_key and session_token MUST NOT
 * reach logs, error details, traces or JSON: nothing in remote/ prints them.
 */
struct sl__s3_conf {
	char endpoint[512];       /* scheme://host[:port]; AWS's own when none is set */
	char region[64];
	char access_key[128];
	char secret_key[256];
	char session_token[4096];
	char profile[128];        /* the profile the files were read for */
	int anonymous;            /* no credentials anywhere: requests go unsigned */
	int path_style;           /* bucket in the path, not the host (custom endpoints, addressing_style = path) */
	const char *cred_source;  /* "arguments", "environment", a file's path, or "none" */
};

/* What the caller gives explicitly (NULL or "" each: not given); it wins over everything else. */
struct sl__s3_args {
	const char *endpoint, *access_key, *secret_key, *session_token, *region, *profile;
};

/* The environment: getenv, or a table in tests and the fuzzer. */
typedef const char *(*sl__env_fn)(const char *name, void *ctx);

/*
 * Resolves c as the AWS CLI does.  Credentials: args, else
 * AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN), else the
 * profile (args, AWS_PROFILE, "default") in AWS_SHARED_CREDENTIALS_FILE
 * (~/.aws/credentials), then in AWS_CONFIG_FILE (~/.aws/config, sections
 * "[profile NAME]" or "[default]"); none: anonymous.  Region: args,
 * AWS_REGION, AWS_DEFAULT_REGION, the profile's region, "us-east-1".
 * Endpoint: args, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
 * endpoint_url, else https://s3.REGION.amazonaws.com.  Path-style
 * addressing for custom endpoints, or where the profile's "s3 =" block
 * says addressing_style = path.  A missing file is not an error; a
 * malformed one is SLUICE_EINVAL_CONFIG naming the file and line (not the
 * line's text, which may hold a secret).  env NULL: the process's.
 */
SL_HIDDEN int sl__s3_conf_resolve(struct sl__s3_conf *c, const struct sl__s3_args *args, sl__env_fn env,
				  void *ctx);


/*
 * Splits "s3://BUCKET/KEY" into bucket (DNS-compatible name, 3-63
 * characters) and key (may be empty: a prefix).  Returns 0 or
 * SLUICE_EINVAL_CONFIG naming the URL.  1 from sl__is_s3_url means the
 * path is an s3:// URL.
 */
SL_HIDDEN int sl__is_s3_url(const char *path);
SL_HIDDEN int sl__s3_parse_url(const char *url, char *bucket, size_t bucket_cap, char *key, size_t key_cap);

/*
 * s3.c: requests on an S3 endpoint (see there for the errno mapping).  A
 * client (struct sl__s3) is shared by threads; a connection (struct
 * sl__s3_conn) is one thread's at a time and keeps its socket between calls.
 */
struct sl__s3;
struct sl__s3_conn;
SL_HIDDEN int sl__s3_open(struct sl__s3 **out, const struct sl__s3_args *args, sl__env_fn env, void *ctx);
SL_HIDDEN void sl__s3_close(struct sl__s3 *s);
SL_HIDDEN const struct sl__s3_conf *sl__s3_conf(const struct sl__s3 *s);
SL_HIDDEN int sl__s3_conn_open(struct sl__s3_conn **out);
SL_HIDDEN void sl__s3_conn_close(struct sl__s3_conn *c);
/* The calling thread's connection, kept alive between its requests and closed when it ends; NULL without memory. */
SL_HIDDEN struct sl__s3_conn *sl__s3_thread_conn(void);
/*
 * What a HEAD says of an object: its size, its ETag (quotes kept, as the
 * server sends it) and its end-to-end checksum.  sum_kind is SL_CRC32C or
 * SL_CRC32 (core.h) where the object carries a full-object checksum of
 * that kind, which a whole read is checked against; SL_CRC_NONE otherwise
 * (none, another algorithm, or a composite one: a checksum of the parts'
 * checksums, which a reader cannot recompute without the part sizes).
 * sum_name says which, for reports: "crc32c", "crc32", "crc64nvme
 * (not verified)", "crc32c composite (not verified)" or "".
 */
struct sl__s3_meta {
	uint64_t size;
	char etag[128];
	int sum_kind;
	uint32_t sum;
	char sum_name[48];
};
/* m->size, etag and checksum of bucket/key. */
SL_HIDDEN int sl__s3_head(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			  struct sl__s3_meta *m);
/*
 * Bytes [off, off + len) of bucket/key into dst; with if_match, only while
 * the object's ETag is that one (-ESTALE once it changed).  Returns the
 * bytes received (fewer at the object's end) or an error.  The answer is
 * checked against the request: its status, its Content-Range (the range
 * asked for, cut only at the object's end) and its body's length; one that
 * does not match is tried again like a failed request, then fails with
 * -EIO naming the object, the range asked for and what came back.
 */
SL_HIDDEN ssize_t sl__s3_get(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			     uint64_t off, size_t len, void *dst, const char *if_match);
/*
 * The same, calling progress(arg, bytes in dst so far) as the body arrives
 * (0 again when a retry starts over), and with sum_kind (core.h's SL_CRC32C
 * or SL_CRC32; 0: none) the CRC of the bytes returned into *sum, summed as
 * each piece arrives, while it is still in cache.
 */
SL_HIDDEN ssize_t sl__s3_get_progress(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
				      uint64_t off, size_t len, void *dst, const char *if_match,
				      void (*progress)(void *arg, size_t bytes), void *arg, int sum_kind, uint32_t *sum);
/*
 * len bytes of src as the whole object bucket/key, sent with its CRC32C
 * (x-amz-checksum-crc32c), which the server checks; key "" creates the bucket.
 */
SL_HIDDEN int sl__s3_put(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			 const void *src, size_t len);
/* Removes bucket/key (S3 answers 204 whether or not it existed). */
SL_HIDDEN int sl__s3_delete(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key);
/* An object of a listing, or (is_prefix) a common prefix: a "directory" one level down. */
struct sl__s3_entry {
	char *key;
	uint64_t size;
	char etag[128];
	int is_prefix;
};
struct sl__s3_list {
	struct sl__s3_entry *e;
	size_t n, cap;
};
/*
 * Every key of bucket under prefix (ListObjectsV2, page after page), in
 * the server's order (by key); with delim "/" only one level: the objects
 * directly below and the common prefixes.  max > 0: one page of at most
 * max entries (enough to learn whether a prefix holds anything).  Appends
 * to *l; free it with sl__s3_list_free.
 */
SL_HIDDEN int sl__s3_list(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *prefix,
			  const char *delim, unsigned max, struct sl__s3_list *l);
SL_HIDDEN void sl__s3_list_free(struct sl__s3_list *l);
/*
 * list.c: one ListObjectsV2 page (len bytes, untrusted) appended to l; the
 * next page's token into token ("" on the last page).  0, -ENOMEM or
 * SLUICE_EFORMAT.
 */
SL_HIDDEN int sl__s3_list_parse(const char *xml, size_t len, struct sl__s3_list *l, char *token, size_t token_cap);

/* An object the engine reads (a sluice_file's remote part): its ETag pins every read to one version. */
struct sl__s3_obj {
	struct sl__s3 *s3;
	char bucket[64];
	char key[1025];
	struct sl__s3_meta meta;  /* size, ETag and checksum at open */
};

/*
 * Opens url (s3://BUCKET/KEY) for reading through s3: HEAD gives its size
 * and ETag.  sl__s3_obj_close(NULL) is a no-op.
 */
SL_HIDDEN int sl__s3_obj_open(struct sl__s3_obj **out, struct sl__s3 *s3, const char *url, uint64_t *size);
SL_HIDDEN void sl__s3_obj_close(struct sl__s3_obj *o);

/*
 * s3io.c: the engine's I/O backend for remote objects (io.h's ops table):
 * io->handle is the struct sl__s3_obj, io->offset and io->len the range;
 * each worker thread keeps its own kept-alive connection.  Synchronous:
 * many ranged GETs are in flight because many workers run them.
 */
struct sl__io_ops;
SL_HIDDEN extern const struct sl__io_ops sl__io_s3_ops;

/*
 * Writes len bytes at src as the whole object bucket/key: one PUT up to
 * SLUICE_S3_PART_SIZE (default 8 MiB), else a multipart upload whose parts
 * go SLUICE_S3_CONCURRENCY (default 8) at a time, each on its own
 * connection, completed only once every part is in and aborted on any
 * failure: the object appears whole or not at all, and no upload is left
 * behind.  copy (NULL: memcpy) moves each part from src into a host buffer
 * first: sluice passes a GPU-to-host copy for device memory.  Every request
 * carries the CRC32C of its bytes, and a multipart upload declares the
 * whole object's (a FULL_OBJECT checksum, combined from the parts'), so
 * the server refuses bytes damaged on the way and readers can verify them.
 */
SL_HIDDEN int sl__s3_upload(struct sl__s3 *s, const char *bucket, const char *key, const void *src, size_t len,
			    int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx);

/*
 * The first error among threads sharing one piece of work (an upload's
 * parts, a download's chunks, a copy's files), with the detail of the
 * thread that met it (details are thread-local).  Initialise lock with
 * pthread_mutex_init; err may be read without it.
 */
struct sl__first_err {
	pthread_mutex_t lock;
	_Atomic int err;
	char detail[512];
};
SL_HIDDEN void sl__first_err_keep(struct sl__first_err *fe, int rc);

/*
 * Downloads bucket/key (m->size bytes, pinned to m->etag) into fd: chunks
 * of SLUICE_S3_PART_SIZE, SLUICE_S3_CONCURRENCY ranged GETs in flight,
 * each on its own connection, written where they belong.  Where the object
 * carries a checksum (m->sum_kind), the chunks' CRCs are combined and
 * checked against it; a mismatch downloads the object once more, then
 * fails with SLUICE_EVERIFY.  *verified (or NULL) says whether it was
 * checked.  cancel (or NULL), once set, stops it between chunks with
 * -ECANCELED.
 */
SL_HIDDEN int sl__s3_download(struct sl__s3 *s, const char *bucket, const char *key, const struct sl__s3_meta *m,
			      int fd, const _Atomic int *cancel, int *verified);
/* The process's client, made from the AWS_* environment and files on first use and kept. */
SL_HIDDEN int sl__s3_default(struct sl__s3 **out);

/*
 * cache.c: the local copies of remote objects (datasets' files over
 * s3://).  SLUICE_CACHE_DIR (default $XDG_CACHE_HOME/sluice, else
 * ~/.cache/sluice) holds at most SLUICE_CACHE_LIMIT bytes (default half of
 * its file system), least recently used out.  A fetch asks the server for
 * the object's size and ETag and uses the copy only where both match,
 * else downloads it again; the ranks of one machine share the directory,
 * and each object is downloaded once (a file lock is held through the
 * check and the download: the others wait, then find it).
 *
 * sl__cache_fetch: the local path of url's copy into local (cap bytes).
 */
SL_HIDDEN int sl__cache_fetch(const char *url, char *local, size_t cap);
/*
 * Fetches urls[0..n) in order on a thread of its own, so that readers
 * find them there; only when all of them fit in the cache's limit beside
 * each other (total bytes), else each waits for its first reader.
 * sl__cache_prefetch_stop cancels what is left and waits; NULL is a no-op.
 */
struct sl__prefetch;
SL_HIDDEN struct sl__prefetch *sl__cache_prefetch(char *const *urls, unsigned n, uint64_t total);
SL_HIDDEN void sl__cache_prefetch_stop(struct sl__prefetch *p);

/*
 * fs.c: paths that are local or s3:// URLs, for the dataset readers.
 * sl__fs_stat: stat(2), or for a URL an object (S_IFREG, its size) or a
 * prefix with keys below it (S_IFDIR); -errno.  sl__fs_list: the regular
 * files directly in dir, or with recursive every one below it (full
 * paths, sorted, each and the array malloc'd).  sl__fs_local: a
 * path to open(2): path itself, or the cached copy of a URL.
 */
SL_HIDDEN int sl__fs_stat(const char *path, struct stat *st);
SL_HIDDEN int sl__fs_list(const char *dir, int recursive, char ***names, unsigned *n);
SL_HIDDEN int sl__fs_local(const char *path, char *local, size_t cap);
/*
 * Whole files between a local path and an s3:// URL, through the
 * process's client (parallel parts both ways).  sl__fs_upload: the file as
 * the object url.  sl__fs_download: the object as the file local, written
 * under a temporary name and renamed: it appears whole or not at all;
 * *verified (or NULL): checked against the object's checksum.
 * sl__fs_remove: unlink(2) or DELETE.  sl__fs_staging: a new empty
 * directory in the cache's directory (on the fast local disk), for files
 * on their way to a URL.
 */
SL_HIDDEN int sl__fs_upload(const char *local, const char *url);
SL_HIDDEN int sl__fs_download(const char *url, const char *local, int *verified);
SL_HIDDEN int sl__fs_remove(const char *path);
SL_HIDDEN int sl__fs_staging(char *out, size_t cap);

/*
 * The <Code> and <Message> of an S3 error body (len bytes, untrusted), as
 * printable ASCII; returns a bit mask of the ones found (1 code, 2 message).
 */
SL_HIDDEN int sl__s3_error_parse(const char *body, size_t len, char *code, size_t code_cap, char *msg,
				 size_t msg_cap);

#endif
