/*
 * remote: object storage (S3 and compatible stores).  s3conf.c resolves
 * where to connect and with which credentials the way AWS tools do, and
 * parses s3:// URLs.  Depends on core only.
 */
#ifndef SL_REMOTE_H
#define SL_REMOTE_H

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
 * Parses an AWS shared-config file's text (len bytes, NUL not needed):
 * calls fn(section, key, value, ctx) for every setting, with keys of an
 * indented block under "s3 =" as "s3.KEY".  Comments start with # or ;.
 * name is the file's path for errors.  Returns 0, fn's nonzero return
 * (which stops the parse), or SLUICE_EINVAL_CONFIG for a line that is
 * neither a [section], a key = value nor a continuation.
 */
SL_HIDDEN int sl__ini_parse(const char *text, size_t len, const char *name,
			    int (*fn)(const char *section, const char *key, const char *value, void *ctx), void *ctx);

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
/* Size and ETag (quotes kept, as the server sends it) of bucket/key. */
SL_HIDDEN int sl__s3_head(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			  uint64_t *size, char *etag, size_t etag_cap);
/*
 * Bytes [off, off + len) of bucket/key into dst; with if_match, only while
 * the object's ETag is that one (-ESTALE once it changed).  Returns the
 * bytes received (fewer at the object's end) or an error.
 */
SL_HIDDEN ssize_t sl__s3_get(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			     uint64_t off, size_t len, void *dst, const char *if_match);
/* len bytes of src as the whole object bucket/key; key "" creates the bucket. */
SL_HIDDEN int sl__s3_put(struct sl__s3 *s, struct sl__s3_conn *c, const char *bucket, const char *key,
			 const void *src, size_t len);
/* An object the engine reads (a sluice_file's remote part): its ETag pins every read to one version. */
struct sl__s3_obj {
	struct sl__s3 *s3;
	char bucket[64];
	char key[1025];
	char etag[128];
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
 * first: sluice passes a GPU-to-host copy for device memory.
 */
SL_HIDDEN int sl__s3_upload(struct sl__s3 *s, const char *bucket, const char *key, const void *src, size_t len,
			    int (*copy)(void *ctx, void *dst, const void *src, size_t n), void *copy_ctx);

/*
 * The <Code> and <Message> of an S3 error body (len bytes, untrusted), as
 * printable ASCII; returns a bit mask of the ones found (1 code, 2 message).
 */
SL_HIDDEN int sl__s3_error_parse(const char *body, size_t len, char *code, size_t code_cap, char *msg,
				 size_t msg_cap);

#endif
