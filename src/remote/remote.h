/*
 * remote: object storage (S3 and compatible stores).  s3conf.c resolves
 * where to connect and with which credentials the way AWS tools do, and
 * parses s3:// URLs.  Depends on core.  The stores over this transport
 * (s3store.c, httpstore.c) are in store/.
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
 * http.c: HTTP requests over libcurl, the transport of the s3 and http
 * stores.  A connection (struct sl__http_conn) is one thread's at a time
 * and keeps its socket between requests.
 */
struct sl__http_conn;
SL_HIDDEN int sl__http_init(void);
/*
 * The CA bundle https is checked against where AWS_CA_BUNDLE and
 * SSL_CERT_FILE say none: libcurl's own (builtin) where it is readable
 * (NULL: curl uses it), else the first readable of candidates (the common
 * distributions' paths: a wheel's libcurl built on one runs on another),
 * else NULL.
 */
SL_HIDDEN const char *sl__ca_pick(const char *builtin, const char *const *candidates);
SL_HIDDEN int sl__http_conn_open(struct sl__http_conn **out);
SL_HIDDEN void sl__http_conn_close(struct sl__http_conn *c);
/* The calling thread's connection, made on first use, closed when the thread ends; NULL without memory. */
SL_HIDDEN struct sl__http_conn *sl__http_thread_conn(void);

enum { SL_HTTP_HEAD, SL_HTTP_GET, SL_HTTP_PUT, SL_HTTP_POST, SL_HTTP_DELETE };
#define SL_HTTP_HDRS 6
#define SL_HTTP_KEPT 6

struct sl__http_resp;
/*
 * One request.  GET: bytes [off, off + len) into buf (len 0: the whole
 * body into the answer's small buffer), only while the resource's ETag
 * is if_match when that is set.  PUT and POST: len bytes of buf as the
 * body.  name: how errors name what is asked ("s3://b/k", the URL).
 */
struct sl__http_req {
	int method;
	const char *url, *name;
	uint64_t off;
	size_t len;
	void *buf;
	const char *if_match;
	const char *hdr[SL_HTTP_HDRS];   /* more headers ("Name: value"), up to the first NULL */
	const char *sigv4, *userpwd;     /* signed with AWS Signature V4 by curl (S3), NULL: not signed */
	unsigned retries;                /* more attempts after a retryable failure */
	int follow;                      /* follow redirects (up to 5) */
	unsigned timeout_s;              /* the whole request's limit, each attempt (0: none but the stall rule) */
	/* Optional: the server's words in an error body, as " Code: message" into out (S3's XML). */
	void (*describe)(const char *body, size_t len, char *out, size_t cap);
	/* Optional: the status the answer means (S3 reports some failures in a 200's body). */
	long (*status_of)(const struct sl__http_req *q, const struct sl__http_resp *k);
	/*
	 * A ranged GET of an open file: what the resource was at open.  An
	 * answer with another ETag or Last-Modified (NULL or "": not compared),
	 * or (total_known) another total size (a 206's Content-Range "/N", a
	 * 200's length) is -ESTALE naming the resource, whether or not the
	 * server honoured If-Match: never bytes of another version.
	 */
	const char *seen_etag, *seen_modified;
	uint64_t total;
	int total_known;
};

/*
 * An answer.  The caller sets cap (GET: the bytes buf holds), and may set
 * progress (called with the bytes in buf so far as the body arrives, 0
 * again when a retry starts over), sum_kind (core.h's SL_CRC32C, SL_CRC32
 * or SL_CRC64NVME: the CRC of the body into sum as each piece arrives,
 * while it is in cache) and keep (a header prefix whose headers are kept: name
 * past the prefix and value).
 */
struct sl__http_resp {
	size_t cap;
	void (*progress)(void *arg, size_t bytes);
	void *progress_arg;
	int sum_kind;
	uint64_t sum;
	const char *keep;
	/* what came back */
	long status;
	size_t got;              /* body bytes into buf */
	char etag[128], last_modified[64];
	uint64_t size;           /* Content-Length, where have_size */
	int have_size;
	char range[96];          /* Content-Range as sent, "" if none; parsed where have_range */
	int have_range;
	uint64_t r_first, r_last, r_total;
	int at_dir;              /* the URL answered (after redirects) ends in '/': a web server's directory */
	struct {
		char name[32], value[64];
	} kept[SL_HTTP_KEPT];
	unsigned nkept;
	char err[4096];          /* an error's body, or the body of a request without buf */
	size_t errlen;
	/* the transport's own */
	char *dst;
	int overflow;
	void *h;
};

/*
 * q with bounded retries: up to q->retries more attempts, each after a
 * random wait of up to 100 ms x 2^attempt (capped at 5 s: "full jitter",
 * so that many workers retrying at once do not come back in step).  A
 * GET's range is received again from its start, and its answer is checked
 * against it: the status, the Content-Range (the range asked for, cut
 * only at the end) and the body's length; one that does not match is
 * tried again like a failed request, then fails with -EIO naming q->name,
 * the range asked for and what came back.  The last error says how many
 * attempts were made.
 */
SL_HIDDEN int sl__http_request(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k);
/*
 * The direct receive's parser of an HTTP/1.x answer's head at the start of
 * buf (len bytes, buf[len] == 0): -EAGAIN until its blank line is there;
 * else *end past it, its headers through the same reader as curl's path
 * into k, *keep (the connection may carry another request), and 0 where the
 * direct receive takes the answer (a Content-Length, no chunks), 1 where
 * curl's path should (follow: redirects too), -EIO where it is not HTTP/1.x.
 */
SL_HIDDEN int sl__http_head_parse(const char *buf, size_t len, struct sl__http_resp *k, size_t *end, int *keep,
				  int follow);

/*
 * weblist.c: the entries a web server's listing page (len bytes, untrusted,
 * any bytes) links to, in page order, read as a browser reads the links
 * (character references such as &amp; decoded, then %XX): each(arg, href,
 * n, dir) with the entry's name in one canonical form (every byte but
 * RFC 3986's unreserved ones as %XX, uppercase; n bytes, valid during the
 * call; dir: a directory, and then it ends in '/').  Links that name no
 * entry (the parent, absolute ones, other schemes or hosts, queries,
 * fragments, paths below) are passed over; one that would be an entry but
 * whose name cannot be a file's ('/' or NUL decoded in it, a '\\' a browser
 * reads as '/', a '%' that is no escape, over 255 bytes) is named in a
 * warning (where: the page's URL, for it) and skipped, never dropped
 * without a word.  A nonzero return from each stops the walk with it;
 * else 0.
 */
SL_HIDDEN int sl__web_links(const char *page, size_t len, const char *where,
			    int (*each)(void *arg, const char *href, size_t n, int dir), void *arg);

/*
 * sigv4.c: the Authorization header of a request signed with AWS Signature
 * V4 into auth; 0 or an error.  hdr: the headers to sign ("Name: value"; host
 * and the x-amz-* ones at least), up to the first NULL.
 */
#define SL_SIGV4_HDRS 12
struct sl__sigv4_in {
	const char *method;
	const char *path;            /* as sent: URI-encoded, "/" at least */
	const char *query;           /* as sent, without '?': "" or NULL for none */
	const char *hdr[SL_SIGV4_HDRS];
	const char *payload_hash;    /* x-amz-content-sha256's value (UNSIGNED-PAYLOAD, or the body's SHA-256) */
	const char *amz_date;        /* x-amz-date's value, YYYYMMDDTHHMMSSZ */
	const char *region, *service, *access, *secret;
};
SL_HIDDEN int sl__sigv4(const struct sl__sigv4_in *in, char *auth, size_t cap);
/* The value of a kept header (k->keep), by its name past the prefix; "" if none came. */
SL_HIDDEN const char *sl__http_kept(const struct sl__http_resp *k, const char *name);

/*
 * s3.c: requests on an S3 endpoint, over http.c's transport.  A client
 * (struct sl__s3) is shared by threads; each request runs on the caller's
 * connection.
 */
struct sl__s3;
SL_HIDDEN int sl__s3_open(struct sl__s3 **out, const struct sl__s3_args *args, sl__env_fn env, void *ctx);
SL_HIDDEN void sl__s3_close(struct sl__s3 *s);
SL_HIDDEN const struct sl__s3_conf *sl__s3_conf(const struct sl__s3 *s);
/*
 * What a HEAD says of an object: its size, its ETag (quotes kept, as the
 * server sends it) and its end-to-end checksum, which a whole read is
 * checked against.  sum_kind is SL_CRC32C or SL_CRC32 (core.h) where the
 * object carries a full-object checksum of that kind (the engine folds
 * its pieces' CRCs into it); osum_kind (SL_OSUM_*) where it carries a
 * CRC64NVME, SHA-1 or SHA-256, checked in one pass over the whole object
 * in order (sum.c), its bytes in osum.  Neither for none, an algorithm
 * sluice does not know, or a composite checksum (a checksum of the parts'
 * checksums, which a reader cannot recompute without the part sizes).
 * sum_name says which, for reports: "crc32c", "crc32", "crc64nvme",
 * "sha1", "sha256", "sha256 composite (not verified)", "xxhash3 (not
 * verified)", or "" (none).
 */
enum { SL_OSUM_NONE = 0, SL_OSUM_CRC64NVME = 1, SL_OSUM_SHA1 = 2, SL_OSUM_SHA256 = 3 };
struct sl__s3_meta {
	uint64_t size;
	char etag[128];
	int sum_kind;
	uint32_t sum;
	char sum_name[48];
	int osum_kind;
	unsigned char osum[32];
};

/*
 * sum.c: the length of an SL_OSUM_* checksum; and n bytes at p, or the
 * first m->size bytes of the file fd, or n bytes copy brings into host
 * memory in order (copy(ctx, dst, off, len): len bytes at off into dst, 0
 * or an error with its detail; called with at most 4 MiB at a time),
 * checked against m's one-pass checksum: 1 matched, 0 m has none,
 * SLUICE_EVERIFY naming name, the algorithm and both values, or an error.
 */
SL_HIDDEN unsigned sl__osum_len(int kind);
SL_HIDDEN int sl__osum_check(const struct sl__s3_meta *m, const void *p, size_t n, const char *name);
SL_HIDDEN int sl__osum_check_copy(const struct sl__s3_meta *m, uint64_t n,
				  int (*copy)(void *ctx, void *dst, uint64_t off, size_t len), void *ctx,
				  const char *name);
SL_HIDDEN int sl__osum_check_fd(const struct sl__s3_meta *m, int fd, const char *name);
/* m->size, etag and checksum of bucket/key. */
SL_HIDDEN int sl__s3_head(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
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
SL_HIDDEN ssize_t sl__s3_get(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
			     uint64_t off, size_t len, void *dst, const char *if_match);
/*
 * The same, pinned to the object pin describes (NULL: none): its ETag sent
 * as If-Match, and every answer's ETag and total size (Content-Range's
 * "/N") checked against it (-ESTALE once it changed, whether or not the
 * server honours If-Match); calling progress(arg, bytes in dst so far) as
 * the body arrives (0 again when a retry starts over), and with sum_kind
 * (core.h's SL_CRC32C, SL_CRC32 or SL_CRC64NVME; 0: none) the CRC of the bytes returned
 * into *sum, summed as each piece arrives, while it is still in cache.
 */
SL_HIDDEN ssize_t sl__s3_get_progress(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
				      uint64_t off, size_t len, void *dst, const struct sl__s3_meta *pin,
				      void (*progress)(void *arg, size_t bytes), void *arg, int sum_kind, uint64_t *sum);
/*
 * The whole object bucket/key into dst (cap bytes) in one GET with no
 * Range, its length checked and, where the server sends one, its
 * full-object CRC32C or CRC32 (a mismatch is read once more, then fails
 * with SLUICE_EVERIFY).  Returns its size, or an error: -EFBIG where it is
 * larger than cap (*size then its size, where the server said it).
 */
SL_HIDDEN ssize_t sl__s3_get_object(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
				    void *dst, size_t cap, uint64_t *size);
/*
 * len bytes of src as the whole object bucket/key, sent with its CRC32C
 * (x-amz-checksum-crc32c), which the server checks; key "" creates the bucket.
 */
SL_HIDDEN int sl__s3_put(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
			 const void *src, size_t len);
/* Removes bucket/key (S3 answers 204 whether or not it existed). */
SL_HIDDEN int sl__s3_delete(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key);
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
SL_HIDDEN int sl__s3_list(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *prefix,
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
 * Multipart uploads, one request each (s3xfer.c composes them): create
 * (the upload's id, as the query's "uploadId=..."), a part (its number
 * from 1, its CRC32C sent; its ETag back), complete (every part's ETag and
 * CRC32C, the whole object's CRC32C), abort (retried hard; a failure is
 * only warned).  sl__s3_part_size and sl__s3_concurrency: the client's
 * SLUICE_S3_PART_SIZE and SLUICE_S3_CONCURRENCY.
 */
SL_HIDDEN size_t sl__s3_part_size(const struct sl__s3 *s);
SL_HIDDEN unsigned sl__s3_concurrency(const struct sl__s3 *s);
SL_HIDDEN int sl__s3_mpu_create(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
				char *id, size_t cap);
SL_HIDDEN int sl__s3_mpu_part(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
			      const char *id, unsigned part, const void *buf, size_t n, uint32_t crc, char etag[128]);
SL_HIDDEN int sl__s3_mpu_complete(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
				  const char *id, unsigned nparts, char (*etag)[128], const uint32_t *crc, uint32_t whole);
SL_HIDDEN void sl__s3_mpu_abort(struct sl__s3 *s, struct sl__http_conn *c, const char *bucket, const char *key,
				const char *id);


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
 * The <Code> and <Message> of an S3 error body (len bytes, untrusted), as
 * printable ASCII; returns a bit mask of the ones found (1 code, 2 message).
 */
SL_HIDDEN int sl__s3_error_parse(const char *body, size_t len, char *code, size_t code_cap, char *msg,
				 size_t msg_cap);

#endif
