/*
 * HTTP requests over libcurl: the transport under the s3 and http stores.
 * Each request runs on an easy handle the caller keeps (struct
 * sl__http_conn), so its connection is kept alive from one request to the
 * next.  A ranged GET's answer is checked against its request (status,
 * Content-Range, body length), and failed or mismatched answers are tried
 * again a bounded number of times.
 *
 * Errors name what was asked (req->name), the HTTP status and the
 * server's own words where the caller can read them (req->describe), mapped
 * to errno: 404 -ENOENT, 403 -EACCES, 412 -ESTALE (the resource changed),
 * 416 -ERANGE, transport failures -EIO, -ETIMEDOUT, -ECONNREFUSED (nothing
 * listens), SLUICE_ERESOLVE (the host name does not resolve) or -ECONNRESET, each
 * with curl's code, its name and its words in the detail; a server's
 * certificate refused -EKEYREJECTED (never tried again), a ranged GET
 * answered with a whole file -EOPNOTSUPP.
 */
#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "remote/remote.h"

struct sl__http_conn {
	CURL *h;
	char errbuf[CURL_ERROR_SIZE];
	CURL *raw;             /* the direct receive's connection (CURLOPT_CONNECT_ONLY), NULL: none open */
	char raw_origin[300];  /* scheme://host:port it is connected to */
	uint64_t recv_min;     /* SLUICE_HTTP_RECV_MIN: GETs this long go the direct way (0: none) */
	uint64_t stall_s;      /* SLUICE_HTTP_STALL_TIME: seconds under SL_LOW_SPEED bytes/s that are a stall */
	uint64_t win_t0;       /* the direct receive's speed window: its start (sl__now_ns) */
	uint64_t win_bytes;    /* and the bytes received in it */
	CURLcode raw_cc;       /* the direct receive's last failed curl_easy_recv/send (CURLE_OK: none), for details */
};

/* The low-speed rule of both receive paths: under this many bytes a second for stall_s seconds is a stall. */
enum { SL_LOW_SPEED = 1024 };

static pthread_once_t sl_curl_once = PTHREAD_ONCE_INIT;
static int sl_curl_ok;

static void sl_curl_init(void)
{
	sl_curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

int sl__http_init(void)
{
	pthread_once(&sl_curl_once, sl_curl_init);
	return sl_curl_ok ? 0 : sl__err(-EIO, "libcurl could not be initialised");
}

int sl__http_conn_open(struct sl__http_conn **out)
{
	struct sl__http_conn *c;
	int rc = sl__http_init();

	*out = NULL;
	if (rc)
		return rc;
	if (!(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->h = curl_easy_init();
	if (!c->h) {
		free(c);
		return sl__err(-ENOMEM, "curl_easy_init failed");
	}
	if ((rc = sl__setting_u64("SLUICE_HTTP_RECV_MIN", &c->recv_min)) ||
	    (rc = sl__setting_u64("SLUICE_HTTP_STALL_TIME", &c->stall_s))) {
		sl__http_conn_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

void sl__http_conn_close(struct sl__http_conn *c)
{
	if (!c)
		return;
	curl_easy_cleanup(c->h);
	if (c->raw)
		curl_easy_cleanup(c->raw);
	free(c);
}

/* Each thread's connection, kept alive across its requests and closed when the thread ends. */
static pthread_key_t sl_conn_key;
static pthread_once_t sl_conn_once = PTHREAD_ONCE_INIT;

static void sl_conn_free(void *c)
{
	sl__http_conn_close(c);
}

static void sl_conn_key_init(void)
{
	(void)pthread_key_create(&sl_conn_key, sl_conn_free);
}

struct sl__http_conn *sl__http_thread_conn(void)
{
	struct sl__http_conn *c;

	pthread_once(&sl_conn_once, sl_conn_key_init);
	c = pthread_getspecific(sl_conn_key);
	if (!c && sl__http_conn_open(&c) == 0 && pthread_setspecific(sl_conn_key, c) != 0) {
		sl__http_conn_close(c);
		c = NULL;
	}
	return c;
}

/* len more body bytes are in place at k->dst + k->got: their CRC while they are in cache, and the progress. */
static void sl_took(struct sl__http_resp *k, size_t len)
{
	if (k->sum_kind)
		k->sum = sl__crc(k->sum_kind, k->sum, k->dst + k->got, len);
	k->got += len;
	if (k->progress)
		k->progress(k->progress_arg, k->got);
}

/* The body: the caller's range (k->dst), or (errors, small answers) k->err. */
static size_t sl_body(char *p, size_t sz, size_t n, void *arg)
{
	struct sl__http_resp *k = arg;
	size_t len = sz * n;

	if (!k->status)
		curl_easy_getinfo(k->h, CURLINFO_RESPONSE_CODE, &k->status);
	if (k->status >= 300 || !k->dst) {
		size_t room = sizeof(k->err) - 1 - k->errlen;

		memcpy(k->err + k->errlen, p, len < room ? len : room);
		k->errlen += len < room ? len : room;
		return len;
	}
	if (len > k->cap - k->got) {
		k->overflow = 1;
		return 0; /* more than the range asked for: stop */
	}
	memcpy(k->dst + k->got, p, len);
	sl_took(k, len);
	return len;
}

/* 1 and the header's value (trimmed, cut to cap) into out if the line p (len bytes) is "name: value". */
static int sl_hval(const char *p, size_t len, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name), v, e = len;

	if (len <= nl || p[nl] != ':' || strncasecmp(p, name, nl))
		return 0;
	for (v = nl + 1; v < len && (p[v] == ' ' || p[v] == '\t'); v++)
		;
	while (e > v && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' ' || p[e - 1] == '\t'))
		e--;
	snprintf(out, cap, "%.*s", (int)(e - v), p + v);
	return 1;
}

/* "bytes FIRST-LAST/TOTAL" into k (have_range), digits only, nothing after. */
static void sl_parse_range(struct sl__http_resp *k)
{
	unsigned long long a, b, t;
	int end = 0;

	k->have_range = sscanf(k->range, "bytes %20llu-%20llu/%20llu%n", &a, &b, &t, &end) == 3 &&
			(size_t)end == strlen(k->range) && strspn(k->range + 6, "0123456789-/") == strlen(k->range + 6) &&
			a <= b && b < t;
	if (k->have_range) {
		k->r_first = a;
		k->r_last = b;
		k->r_total = t;
	}
}

/* Headers whose name starts with k->keep ("x-amz-checksum-"): the rest of the name and the value. */
static void sl_keep(struct sl__http_resp *k, const char *p, size_t len)
{
	size_t pl = strlen(k->keep);
	const char *c = memchr(p, ':', len);
	char name[96];

	if (!c || (size_t)(c - p) <= pl || (size_t)(c - p) >= sizeof(name) || k->nkept == SL_HTTP_KEPT)
		return;
	snprintf(name, sizeof(name), "%.*s", (int)(c - p), p);
	snprintf(k->kept[k->nkept].name, sizeof(k->kept[0].name), "%s", name + pl);
	sl_hval(p, len, name, k->kept[k->nkept].value, sizeof(k->kept[0].value));
	k->nkept++;
}

static size_t sl_header(char *p, size_t sz, size_t n, void *arg)
{
	struct sl__http_resp *k = arg;
	size_t len = sz * n;
	char num[32];

	/* A retry's or a redirect's new head starts over. */
	if (len > 5 && !strncmp(p, "HTTP/", 5)) {
		k->have_size = k->have_range = 0;
		k->range[0] = k->etag[0] = k->last_modified[0] = 0;
		k->nkept = 0;
	} else if (sl_hval(p, len, "ETag", k->etag, sizeof(k->etag))) {
	} else if (sl_hval(p, len, "Last-Modified", k->last_modified, sizeof(k->last_modified))) {
	} else if (sl_hval(p, len, "Content-Length", num, sizeof(num))) {
		char *end;

		k->size = strtoull(num, &end, 10);
		k->have_size = num[0] >= '0' && num[0] <= '9' && !*end;
	} else if (sl_hval(p, len, "Content-Range", k->range, sizeof(k->range))) {
		sl_parse_range(k);
	} else if (k->keep && len > strlen(k->keep) && !strncasecmp(p, k->keep, strlen(k->keep))) {
		sl_keep(k, p, len);
	}
	return len;
}

const char *sl__http_kept(const struct sl__http_resp *k, const char *name)
{
	for (unsigned i = 0; i < k->nkept; i++)
		if (!strcasecmp(k->kept[i].name, name))
			return k->kept[i].value;
	return "";
}

static int sl_errno_of_status(long status)
{
	switch (status) {
	case 404:
		return -ENOENT;
	case 403:
		return -EACCES;
	case 412:
		return -ESTALE;
	case 416:
		return -ERANGE;
	default:
		return -EIO;
	}
}

/*
 * curl's own name of a code, for error details (STYLE.md: the foreign code and its name are kept): the codes a
 * transfer of ours can end with; another is "CURLE_?" beside its number.
 */
static const char *sl_curl_name(CURLcode cc)
{
#define SL_CC(x) [x] = #x
	static const char *const names[] = {
		SL_CC(CURLE_OK), SL_CC(CURLE_UNSUPPORTED_PROTOCOL), SL_CC(CURLE_FAILED_INIT), SL_CC(CURLE_URL_MALFORMAT),
		SL_CC(CURLE_NOT_BUILT_IN), SL_CC(CURLE_COULDNT_RESOLVE_PROXY), SL_CC(CURLE_COULDNT_RESOLVE_HOST),
		SL_CC(CURLE_COULDNT_CONNECT), SL_CC(CURLE_WEIRD_SERVER_REPLY), SL_CC(CURLE_REMOTE_ACCESS_DENIED),
		SL_CC(CURLE_HTTP2), SL_CC(CURLE_PARTIAL_FILE), SL_CC(CURLE_HTTP_RETURNED_ERROR), SL_CC(CURLE_WRITE_ERROR),
		SL_CC(CURLE_UPLOAD_FAILED), SL_CC(CURLE_READ_ERROR), SL_CC(CURLE_OUT_OF_MEMORY),
		SL_CC(CURLE_OPERATION_TIMEDOUT), SL_CC(CURLE_RANGE_ERROR), SL_CC(CURLE_SSL_CONNECT_ERROR),
		SL_CC(CURLE_ABORTED_BY_CALLBACK), SL_CC(CURLE_BAD_FUNCTION_ARGUMENT), SL_CC(CURLE_INTERFACE_FAILED),
		SL_CC(CURLE_TOO_MANY_REDIRECTS), SL_CC(CURLE_GOT_NOTHING), SL_CC(CURLE_SSL_ENGINE_NOTFOUND),
		SL_CC(CURLE_SEND_ERROR), SL_CC(CURLE_RECV_ERROR), SL_CC(CURLE_SSL_CERTPROBLEM), SL_CC(CURLE_SSL_CIPHER),
		SL_CC(CURLE_PEER_FAILED_VERIFICATION), SL_CC(CURLE_BAD_CONTENT_ENCODING), SL_CC(CURLE_FILESIZE_EXCEEDED),
		SL_CC(CURLE_SEND_FAIL_REWIND), SL_CC(CURLE_LOGIN_DENIED), SL_CC(CURLE_SSL_CACERT_BADFILE),
		SL_CC(CURLE_AGAIN), SL_CC(CURLE_SSL_CRL_BADFILE), SL_CC(CURLE_SSL_ISSUER_ERROR),
		SL_CC(CURLE_SSL_PINNEDPUBKEYNOTMATCH), SL_CC(CURLE_HTTP2_STREAM), SL_CC(CURLE_HTTP3),
		SL_CC(CURLE_PROXY),
	};
#undef SL_CC

	return (unsigned)cc < sizeof(names) / sizeof(names[0]) && names[cc] ? names[cc] : "CURLE_?";
}

/*
 * What failed, as curl says it: a name that does not resolve (SLUICE_ERESOLVE) is not a server that
 * refused the connection (-ECONNREFUSED), nor one that did not answer in time (-ETIMEDOUT).
 */
static int sl_errno_of_curl(CURLcode cc)
{
	switch (cc) {
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
		return SLUICE_ERESOLVE;
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
		return -ECONNRESET;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	default:
		return -EIO;
	}
}

/* The server's certificate did not verify, or what it is checked against could not be read. */
static int sl_cert_refused(CURLcode cc)
{
	return cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_CERTPROBLEM ||
	       cc == CURLE_SSL_ISSUER_ERROR || cc == CURLE_SSL_CRL_BADFILE || cc == CURLE_SSL_PINNEDPUBKEYNOTMATCH;
}

/*
 * A ranged GET's answer against its request: 206 with the range asked for
 * (cut only at the resource's end) and as many body bytes, or 200 (the
 * Range ignored: the whole resource) where the range was all of it
 * (sl_answer refuses any other 200).  0 or -EIO, which sl__http_request
 * tries again.
 */
static int sl_check_range(const struct sl__http_req *q, const struct sl__http_resp *k)
{
	const uint64_t last = q->off + q->len - 1;
	const char *why = NULL;

	if (k->status == 206) {
		if (!k->have_range)
			why = k->range[0] ? "an unreadable Content-Range" : "no Content-Range";
		else if (k->r_first != q->off || k->r_last > last || (k->r_last < last && k->r_last + 1 != k->r_total))
			why = "another range";
		else if (k->got != k->r_last - k->r_first + 1)
			why = "a body of another length";
	} else if (k->status == 200) {
		if (k->have_size && k->got != k->size)
			why = "a body of another length";
	} else {
		why = "an unexpected status";
	}
	if (!why)
		return 0;
	return sl__err(-EIO, "%s: asked for bytes %llu-%llu, got %s (HTTP %ld, Content-Range '%s', %zu bytes)", q->name,
		       (unsigned long long)q->off, (unsigned long long)last, why, k->status, k->range, k->got);
}

/*
 * A ranged GET's answer against what the resource was at open (q->seen_*,
 * q->total): 0, or -ESTALE naming what changed.  Checked by the client
 * because a server may ignore If-Match and If-Unmodified-Since, and one
 * without validators has only the size to tell two versions apart.
 */
static int sl_check_seen(const struct sl__http_req *q, const struct sl__http_resp *k)
{
	const uint64_t total = k->status == 206 ? k->r_total : k->size;
	const int have_total = k->status == 206 ? k->have_range : k->have_size;
	char why[400] = "";

	if (q->seen_etag && *q->seen_etag && k->etag[0] && strcmp(k->etag, q->seen_etag))
		snprintf(why, sizeof(why), "ETag %.120s then, %.120s now", q->seen_etag, k->etag);
	else if (q->seen_modified && *q->seen_modified && k->last_modified[0] && strcmp(k->last_modified, q->seen_modified))
		snprintf(why, sizeof(why), "Last-Modified %.60s then, %.60s now", q->seen_modified, k->last_modified);
	else if (q->total_known && have_total && total != q->total)
		snprintf(why, sizeof(why), "%llu bytes then, %llu now (%s)", (unsigned long long)q->total,
			 (unsigned long long)total, k->status == 206 ? "its Content-Range's total" : "its Content-Length");
	if (!why[0])
		return 0;
	return sl__err(-ESTALE, "%s: changed on the server since it was opened (%s)", q->name, why);
}

/* The request's headers, curl's list of them. */
static struct curl_slist *sl_headers(const struct sl__http_req *q, char range[64], char match[160])
{
	struct curl_slist *hdr = NULL;

	for (int i = 0; i < SL_HTTP_HDRS && q->hdr[i]; i++)
		hdr = curl_slist_append(hdr, q->hdr[i]);
	if (q->method == SL_HTTP_GET && q->len) {
		snprintf(range, 64, "Range: bytes=%llu-%llu", (unsigned long long)q->off,
			 (unsigned long long)(q->off + q->len - 1));
		hdr = curl_slist_append(hdr, range);
	}
	if (q->method == SL_HTTP_GET && q->if_match && *q->if_match) {
		snprintf(match, 160, "If-Match: %s", q->if_match);
		hdr = curl_slist_append(hdr, match);
	}
	if (q->method == SL_HTTP_PUT || q->method == SL_HTTP_POST)
		hdr = curl_slist_append(hdr, q->method == SL_HTTP_POST ? "Content-Type: application/xml"
								 : "Content-Type: application/octet-stream");
	return hdr;
}

/*
 * The certificates https servers are checked against: AWS_CA_BUNDLE (as AWS
 * tools take it), else SSL_CERT_FILE (as OpenSSL's tools do), else curl's
 * own bundle (or the machine's); and beside it, the hashed directory
 * SSL_CERT_DIR names (as OpenSSL's tools take it).  A private endpoint's
 * certificate is trusted that way; none is ever left unchecked.
 */
const char *sl__ca_pick(const char *builtin, const char *const *candidates)
{
	if (builtin && access(builtin, R_OK) == 0)
		return NULL;
	for (; candidates && *candidates; candidates++)
		if (access(*candidates, R_OK) == 0)
			return *candidates;
	return NULL;
}

static const char *sl_ca_found;
static pthread_once_t sl_ca_once = PTHREAD_ONCE_INIT;

/* The machine's CA bundle where libcurl's own (compiled in for the distribution that built it) is absent. */
static void sl_ca_find(void)
{
	static const char *const bundles[] = {
		"/etc/ssl/certs/ca-certificates.crt",                /* Debian, Ubuntu, Arch, Gentoo */
		"/etc/pki/tls/certs/ca-bundle.crt",                  /* RHEL, Fedora, Amazon Linux */
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", /* RHEL 7 and later */
		"/etc/ssl/ca-bundle.pem",                            /* SUSE */
		"/etc/ssl/cert.pem",                                 /* Alpine */
		NULL,
	};

	sl_ca_found = sl__ca_pick(curl_version_info(CURLVERSION_NOW)->cainfo, bundles);
}

static void sl_ca(CURL *h)
{
	const char *ca = getenv("AWS_CA_BUNDLE");

	if (!ca || !*ca)
		ca = getenv("SSL_CERT_FILE");
	if (!ca || !*ca) {
		pthread_once(&sl_ca_once, sl_ca_find);
		ca = sl_ca_found;
	}
	if (ca && *ca)
		curl_easy_setopt(h, CURLOPT_CAINFO, ca);
	if ((ca = getenv("SSL_CERT_DIR")) && *ca)
		curl_easy_setopt(h, CURLOPT_CAPATH, ca);
}

static void sl_setopts(CURL *h, struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	static const char *const verb[] = { "HEAD", "GET", "PUT", "POST", "DELETE" };

	curl_easy_reset(h);
	k->h = h;
	curl_easy_setopt(h, CURLOPT_URL, q->url);
	/* Dot segments are sent as they are: "p/../k" names an S3 object of its own, and is what was signed. */
	curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	sl_ca(h);
	/* A stalled transfer (under 1 KiB/s for SLUICE_HTTP_STALL_TIME) is a timeout, not a hang. */
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)SL_LOW_SPEED);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)c->stall_s);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sl_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, k);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, sl_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, k);
	c->errbuf[0] = 0;
	curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)q->timeout_s);
	if (q->follow) {
		curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
		curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
	}
	if (q->sigv4) {
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, q->sigv4);
		curl_easy_setopt(h, CURLOPT_USERPWD, q->userpwd);
	}
	if (q->method == SL_HTTP_HEAD) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (q->method == SL_HTTP_GET) {
		k->dst = q->buf;
		/* Large reads: fewer, larger receives and callbacks than curl's 16 KiB default. */
		if (q->len >= (1u << 20))
			curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L << 10);
	} else {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, verb[q->method]);
		if (q->method != SL_HTTP_DELETE) {
			curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->buf ? (const char *)q->buf : "");
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->len);
		}
	}
}

/* ---- The direct receive: a ranged GET's body straight into the caller's memory ----
 *
 * Through curl, every byte is copied twice: by the kernel into curl's
 * buffer, then by the write callback into the destination.  For ranged GETs
 * of at least SLUICE_HTTP_RECV_MIN bytes curl only keeps the connection
 * (CURLOPT_CONNECT_ONLY: TCP and TLS); sluice writes the request (signed by
 * sigv4.c where S3 wants it), reads the answer's head and receives the body
 * with curl_easy_recv straight into the destination (TLS decrypts there).
 * An answer it does not take whole (not 200 or 206, no Content-Length, a
 * chunked body, a head over 16 KiB) goes back to curl's path, which gives
 * an error its words; where a proxy is set, every request goes that way.
 */
enum { SL_DECLINED = 1, SL_HEAD_MAX = 16 << 10, SL_RECV_STEP = 8 << 20 };

static void sl_raw_drop(struct sl__http_conn *c)
{
	if (c->raw)
		curl_easy_cleanup(c->raw);
	c->raw = NULL;
	c->raw_origin[0] = 0;
}

/*
 * curl's low-speed rule (CURLOPT_LOW_SPEED_LIMIT and _TIME) for the direct
 * receive: n more bytes came; -ETIMEDOUT where a whole window of stall_s
 * seconds brought fewer than SL_LOW_SPEED bytes a second, so that a peer
 * that trickles a byte now and then cannot hold a read forever.  The
 * window starts with each request (sl_raw_exchange).
 */
static int sl_raw_speed(struct sl__http_conn *c, size_t n)
{
	const uint64_t now = sl__now_ns();

	c->win_bytes += n;
	if (now - c->win_t0 < c->stall_s * 1000000000ull)
		return 0;
	if (c->win_bytes < SL_LOW_SPEED * c->stall_s)
		return -ETIMEDOUT;
	c->win_t0 = now;
	c->win_bytes = 0;
	return 0;
}

/* Waits until the connection can be read (out 0) or written (1); -ETIMEDOUT on a stall (sl_raw_speed). */
static int sl_raw_wait(struct sl__http_conn *c, int out)
{
	curl_socket_t fd = CURL_SOCKET_BAD;
	struct pollfd p;
	int n;

	if (curl_easy_getinfo(c->raw, CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK || fd == CURL_SOCKET_BAD)
		return -ECONNRESET;
	p = (struct pollfd){ .fd = fd, .events = out ? POLLOUT : POLLIN };
	for (;;) {
		/* Until the window's end at most: then the rule decides. */
		uint64_t now = sl__now_ns(), end = c->win_t0 + c->stall_s * 1000000000ull;
		int ms = now >= end ? 0 : (int)((end - now + 999999) / 1000000), rc;

		n = poll(&p, 1, ms);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n == 0 && (rc = sl_raw_speed(c, 0)))
			return rc;
	}
}

/* Up to cap bytes into p: how many (0: the server closed), or an error. */
static ssize_t sl_raw_recv(struct sl__http_conn *c, char *p, size_t cap)
{
	for (;;) {
		size_t n = 0;
		CURLcode cc = curl_easy_recv(c->raw, p, cap, &n);
		int rc;

		if (cc == CURLE_OK)
			return n && (rc = sl_raw_speed(c, n)) ? rc : (ssize_t)n;
		if (cc != CURLE_AGAIN) {
			c->raw_cc = cc;
			return sl_errno_of_curl(cc == CURLE_UNSUPPORTED_PROTOCOL ? CURLE_RECV_ERROR : cc);
		}
		if ((rc = sl_raw_wait(c, 0)))
			return rc;
	}
}

static int sl_raw_send(struct sl__http_conn *c, const char *p, size_t len)
{
	while (len) {
		size_t n = 0;
		CURLcode cc = curl_easy_send(c->raw, p, len, &n);
		int rc;

		if (cc == CURLE_AGAIN) {
			if ((rc = sl_raw_wait(c, 1)))
				return rc;
			continue;
		}
		if (cc != CURLE_OK) {
			c->raw_cc = cc;
			return sl_errno_of_curl(cc == CURLE_UNSUPPORTED_PROTOCOL ? CURLE_SEND_ERROR : cc);
		}
		p += n;
		len -= n;
	}
	return 0;
}

/* Where a proxy is set the request line would need another form: curl's path serves those. */
static int sl_proxied(void)
{
	static const char *const v[] = { "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY" };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		if (getenv(v[i]) && *getenv(v[i]))
			return 1;
	return 0;
}

/* The request's text into out: the request line, Host, Range, If-Match, the caller's headers, the signature. */
static int sl_raw_request(const struct sl__http_req *q, const char *path, const char *query, const char *host,
			  char *out, size_t cap, size_t *len)
{
	char auth[512] = "", date[20] = "";
	size_t at;
	int w;

	w = snprintf(out, cap, "GET %s%s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sluice/%d.%d.%d\r\nAccept: */*\r\n"
		     "Range: bytes=%llu-%llu\r\n", path, query ? "?" : "", query ? query : "", host, SLUICE_VERSION_MAJOR,
		     SLUICE_VERSION_MINOR, SLUICE_VERSION_PATCH, (unsigned long long)q->off,
		     (unsigned long long)(q->off + q->len - 1));
	at = w > 0 ? (size_t)w : cap;
	if (q->if_match && *q->if_match && at < cap)
		at += (size_t)snprintf(out + at, cap - at, "If-Match: %s\r\n", q->if_match);
	for (int i = 0; i < SL_HTTP_HDRS && q->hdr[i] && at < cap; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s\r\n", q->hdr[i]);
	if (q->sigv4) {
		/* q->sigv4 is curl's "aws:amz:REGION:SERVICE", q->userpwd "ACCESS:SECRET". */
		char hosth[320], dateh[40], region[64] = "", service[32] = "", access[200] = "", payload[80] = "";
		const char *colon = strchr(q->userpwd, ':');
		struct sl__sigv4_in in = { .method = "GET", .path = path, .query = query, .amz_date = date };
		time_t now = time(NULL);
		struct tm tm;
		int nh = 0, rc;

		if (sscanf(q->sigv4, "aws:amz:%63[^:]:%31s", region, service) != 2 || !colon)
			return SL_DECLINED;
		snprintf(access, sizeof(access), "%.*s", (int)(colon - q->userpwd), q->userpwd);
		strftime(date, sizeof(date), "%Y%m%dT%H%M%SZ", gmtime_r(&now, &tm));
		snprintf(hosth, sizeof(hosth), "Host: %s", host);
		snprintf(dateh, sizeof(dateh), "x-amz-date: %s", date);
		in.hdr[nh++] = hosth;
		in.hdr[nh++] = dateh;
		for (int i = 0; i < SL_HTTP_HDRS && q->hdr[i] && nh < SL_SIGV4_HDRS; i++)
			if (!strncasecmp(q->hdr[i], "x-amz-", 6)) {
				in.hdr[nh++] = q->hdr[i];
				sl_hval(q->hdr[i], strlen(q->hdr[i]), "x-amz-content-sha256", payload, sizeof(payload));
			}
		if (!payload[0]) /* S3 wants the body's hash: here, of no body */
			return SL_DECLINED;
		in.payload_hash = payload;
		in.region = region, in.service = service, in.access = access, in.secret = colon + 1;
		if ((rc = sl__sigv4(&in, auth, sizeof(auth))))
			return rc;
		if (at < cap)
			at += (size_t)snprintf(out + at, cap - at, "%s\r\nAuthorization: %s\r\n", dateh, auth);
	}
	if (at < cap)
		at += (size_t)snprintf(out + at, cap - at, "\r\n");
	if (at >= cap)
		return sl__err(-E2BIG, "%s: the request's headers are too long", q->name);
	*len = at;
	return 0;
}

/*
 * The answer's head in head[0..*hl): its lines through sl_header into k,
 * *end past its blank line.  SL_DECLINED where curl's path should take it.
 */
int sl__http_head_parse(const char *buf, size_t len, struct sl__http_resp *k, size_t *end, int *keep, int follow)
{
	const char *e = len >= 4 ? memmem(buf, len, "\r\n\r\n", 4) : NULL, *nl;
	char status[4] = "";
	int chunked = 0;

	if (!e)
		return -EAGAIN;
	*end = (size_t)(e - buf) + 4;
	/* "HTTP/1.x NNN ": the digits copied out, so nothing is read past the head. */
	if (*end < 13 || strncmp(buf, "HTTP/1.", 7) || buf[7] < '0' || buf[7] > '9' || buf[8] != ' ' ||
	    strspn(buf + 9, "0123456789") != 3 || buf[9] == '0' || (buf[12] != ' ' && buf[12] != '\r'))
		return -EIO;
	memcpy(status, buf + 9, 3);
	*keep = buf[7] != '0';
	for (const char *line = buf; line < e + 2; line = nl + 1) {
		size_t n;
		char v[64];

		nl = memchr(line, '\n', (size_t)(e + 2 - line));
		n = (size_t)(nl - line + 1);
		sl_header((char *)line, 1, n, k);
		if (sl_hval(line, n, "Transfer-Encoding", v, sizeof(v)))
			chunked = 1;
		if (sl_hval(line, n, "Connection", v, sizeof(v)))
			*keep = !strcasecmp(v, "keep-alive") || (*keep && strcasecmp(v, "close"));
	}
	k->status = strtol(status, NULL, 10);
	if (chunked || !k->have_size || (k->status >= 300 && k->status < 400 && follow))
		return 1;
	return 0;
}

/* A failed receive's error, naming the resource, where it was (at) and why (a stall: the rule). */
static int sl_raw_fail(const struct sl__http_conn *c, const struct sl__http_req *q, int rc, const char *at)
{
	if (rc == -ETIMEDOUT)
		return sl__err(rc, "%s: stalled %s (under %d bytes/s for %llu s: SLUICE_HTTP_STALL_TIME)", q->name, at,
			       SL_LOW_SPEED, (unsigned long long)c->stall_s);
	if (c->raw_cc != CURLE_OK)
		return sl__err(rc, "%s: the connection failed %s (%s: %s, curl %d)", q->name, at, strerror(-rc),
			       sl_curl_name(c->raw_cc), (int)c->raw_cc);
	return sl__err(rc, "%s: the connection failed %s (%s)", q->name, at, strerror(-rc));
}

/* The answer's head into head[0..*hl) (NUL after), parsed; *end past its blank line.  SL_DECLINED: curl's path. */
static int sl_raw_head(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k, char *head,
		       size_t *hl, size_t *end, int *keep)
{
	int rc;

	head[*hl] = 0;
	while ((rc = sl__http_head_parse(head, *hl, k, end, keep, q->follow)) == -EAGAIN) {
		ssize_t n;

		if (*hl == SL_HEAD_MAX)
			return SL_DECLINED;
		if ((n = sl_raw_recv(c, head + *hl, SL_HEAD_MAX - *hl)) <= 0)
			return n ? sl_raw_fail(c, q, (int)n, "waiting for the answer")
				 : sl__err(-ECONNRESET, "%s: the server closed the connection", q->name);
		*hl += (size_t)n;
		head[*hl] = 0;
	}
	if (rc == -EIO)
		return sl__err(-EIO, "%s: not an HTTP/1.x answer", q->name);
	return rc ? SL_DECLINED : 0;
}

/* c->raw connected to origin (kept from an earlier request, or new): 0, or SL_DECLINED (curl's path says why). */
static int sl_raw_connect(struct sl__http_conn *c, const char *origin)
{
	if (c->raw && !strcmp(c->raw_origin, origin))
		return 0;
	sl_raw_drop(c);
	if (!(c->raw = curl_easy_init()))
		return -ENOMEM;
	curl_easy_setopt(c->raw, CURLOPT_URL, origin);
	curl_easy_setopt(c->raw, CURLOPT_CONNECT_ONLY, 1L);
	curl_easy_setopt(c->raw, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c->raw, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	sl_ca(c->raw);
	if (curl_easy_perform(c->raw) != CURLE_OK) {
		sl_raw_drop(c);
		return SL_DECLINED;
	}
	snprintf(c->raw_origin, sizeof(c->raw_origin), "%s", origin);
	return 0;
}

/*
 * The request sent and the answer's head read (sl_raw_head); a kept
 * connection the server had closed meanwhile is tried once more on a new one.
 */
static int sl_raw_exchange(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k,
			   const char *origin, const char *req, size_t len, char *head, size_t *hl, size_t *end,
			   int *keep)
{
	for (int tries = 0;; tries++) {
		int reused = c->raw && !strcmp(c->raw_origin, origin), rc;

		if ((rc = sl_raw_connect(c, origin)))
			return rc;
		*hl = 0;
		c->win_t0 = sl__now_ns();
		c->win_bytes = 0;
		rc = sl_raw_send(c, req, len);
		if (!rc)
			rc = sl_raw_head(c, q, k, head, hl, end, keep);
		if (rc < 0 && reused && !*hl && !tries) {
			sl_raw_drop(c);
			continue;
		}
		if (rc)
			sl_raw_drop(c); /* an answer not read to its end leaves the connection unusable */
		return rc;
	}
}

/* An error answer's words (S3's XML) into k->err, read to its end so the connection stays usable. */
static void sl_raw_error_body(struct sl__http_conn *c, struct sl__http_resp *k, const char *body, size_t have,
			      int keep)
{
	size_t want = k->size, took = have < want ? have : want;

	if (want >= sizeof(k->err)) {
		sl_raw_drop(c); /* too long to keep: the status alone says what went wrong */
		return;
	}
	memcpy(k->err, body, took);
	for (ssize_t n = 1; took < want && n > 0; took += (size_t)(n > 0 ? n : 0))
		n = sl_raw_recv(c, k->err + took, want - took);
	k->errlen = took;
	if (took < want || have > want || !keep) /* bytes past the answer: the connection is not clean */
		sl_raw_drop(c);
}

/* The body into q->buf: the bytes that came with the head, then received straight into place. */
static int sl_raw_body(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k,
		       const char *first, size_t have)
{
	k->dst = q->buf;
	memcpy(k->dst, first, have);
	sl_took(k, have);
	while (k->got < k->size) {
		size_t want = k->size - k->got < SL_RECV_STEP ? k->size - k->got : SL_RECV_STEP;
		ssize_t n = sl_raw_recv(c, k->dst + k->got, want);

		if (n <= 0) {
			char at[64];

			sl_raw_drop(c);
			snprintf(at, sizeof(at), "at %zu of %llu bytes", k->got, (unsigned long long)k->size);
			return n ? sl_raw_fail(c, q, (int)n, at)
				 : sl__err(-ECONNRESET, "%s: the server closed the connection %s", q->name, at);
		}
		sl_took(k, (size_t)n);
	}
	sl__debug("http", "%s: %zu bytes received straight into place", q->name, k->got);
	return 0;
}

/* One ranged GET the direct way: 0, an error, or SL_DECLINED (nothing delivered: curl's path takes it). */
static int sl_raw_get(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	char *scheme = NULL, *hostn = NULL, *port = NULL, *eport = NULL, *path = NULL, *query = NULL, *user = NULL;
	char origin[sizeof(c->raw_origin)], host[300], req[8192], head[SL_HEAD_MAX + 1];
	size_t len = 0, hl = 0, end = 0;
	int rc = SL_DECLINED, keep = 0;
	CURLU *u = curl_url();

	c->raw_cc = CURLE_OK;
	/* The path as given, dot segments and all (an S3 key "p/../k" is not "k"), as curl's path sends it. */
	if (!u || curl_url_set(u, CURLUPART_URL, q->url, CURLU_PATH_AS_IS) || curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) ||
	    curl_url_get(u, CURLUPART_HOST, &hostn, 0) || curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) ||
	    curl_url_get(u, CURLUPART_PATH, &path, 0))
		goto out;
	(void)curl_url_get(u, CURLUPART_PORT, &eport, 0);   /* only where the URL names it: Host carries it then */
	(void)curl_url_get(u, CURLUPART_QUERY, &query, 0);
	if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK)
		goto out; /* credentials in the URL: curl's path sends them as it should */
	snprintf(origin, sizeof(origin), "%s://%s:%s/", scheme, hostn, port);
	snprintf(host, sizeof(host), "%s%s%s", hostn, eport ? ":" : "", eport ? eport : "");
	if ((rc = sl_raw_request(q, path, query, host, req, sizeof(req), &len)) ||
	    (rc = sl_raw_exchange(c, q, k, origin, req, len, head, &hl, &end, &keep)))
		goto out;
	if (k->status >= 300) {
		sl_raw_error_body(c, k, head + end, hl - end, keep);
	} else if (k->size > k->cap || hl - end > k->size) {
		sl_raw_drop(c);
		k->overflow = 1; /* reported by sl_answer as curl's path reports it */
	} else if (!(rc = sl_raw_body(c, q, k, head + end, hl - end)) && !keep) {
		sl_raw_drop(c);
	}
out:
	curl_free(scheme);
	curl_free(hostn);
	curl_free(port);
	curl_free(eport);
	curl_free(path);
	curl_free(query);
	curl_free(user);
	curl_url_cleanup(u);
	return rc;
}

/* What an answer comes to, by either path (cc: curl's result, CURLE_OK for the direct receive's). */
static int sl_answer(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k, CURLcode cc)
{
	int rc;

	k->err[k->errlen] = 0;
	if (q->status_of)
		k->status = q->status_of(q, k);
	if (k->status >= 300) {
		char said[400] = "";

		if (q->describe)
			q->describe(k->err, k->errlen, said, sizeof(said));
		if (k->status == 412) /* If-Match or If-Unmodified-Since failed: one message with the client's checks */
			return sl__err(-ESTALE, "%s: changed on the server since it was opened (HTTP 412%s)", q->name, said);
		return sl__err(sl_errno_of_status(k->status), "%s: HTTP %ld%s", q->name, k->status, said);
	}
	if (q->method == SL_HTTP_GET && q->len && (k->status == 200 || k->status == 206) && (rc = sl_check_seen(q, k)))
		return rc;
	/* The whole resource to a ranged GET: right only where the range was the whole of it. */
	if (q->method == SL_HTTP_GET && q->len && k->status == 200 && (q->off || !k->have_size || k->size != q->len))
		return sl__err(-EOPNOTSUPP, "%s: the server does not serve byte ranges (it answered bytes %llu-%llu with "
			       "the whole file, HTTP 200%s)", q->name, (unsigned long long)q->off,
			       (unsigned long long)(q->off + q->len - 1), k->have_size ? "" : " without a Content-Length");
	if (k->overflow && !q->len) /* a whole resource larger than its buffer: no retry makes it fit */
		return sl__err(-EFBIG, "%s: larger than the %zu bytes of its buffer", q->name, k->cap);
	if (k->overflow)
		return sl__err(-EIO, "%s: the server sent more than the %zu bytes asked for", q->name, k->cap);
	if (sl_cert_refused(cc)) /* no retry makes it trusted */
		return sl__err(-EKEYREJECTED, "%s: the server's certificate was refused: %s (%s, curl %d); to trust a "
			       "private CA, set AWS_CA_BUNDLE or SSL_CERT_FILE to its bundle (or SSL_CERT_DIR to a hashed "
			       "directory)", q->name, c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc), sl_curl_name(cc),
			       (int)cc);
	if (cc != CURLE_OK)
		return sl__err(sl_errno_of_curl(cc), "%s: %s (%s, curl %d: %s)", q->name,
			       c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc), sl_curl_name(cc), (int)cc,
			       curl_easy_strerror(cc));
	if (q->method == SL_HTTP_GET && q->len)
		return sl_check_range(q, k);
	return 0;
}

static int sl_request_once(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	char range[64], match[160];
	struct curl_slist *hdr;
	CURL *h = c->h;
	CURLcode cc;

	if (q->method == SL_HTTP_GET && q->len && c->recv_min && q->len >= c->recv_min && !sl_proxied()) {
		const struct sl__http_resp fresh = *k;
		int rc = sl_raw_get(c, q, k);

		if (rc != SL_DECLINED)
			return rc ? rc : sl_answer(c, q, k, CURLE_OK);
		*k = fresh;
	}
	hdr = sl_headers(q, range, match);
	sl_setopts(h, c, q, k);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	cc = curl_easy_perform(h);
	curl_slist_free_all(hdr);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &k->status);
	{
		char *at = NULL;

		/* Where a redirect led: a path ending in '/' (a web server's directory) */
		if (curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &at) == CURLE_OK && at) {
			size_t l = strcspn(at, "?#");

			k->at_dir = l && at[l - 1] == '/';
		}
	}
	return sl_answer(c, q, k, cc);
}

/* Worth another try: the server busy or failing (5xx, 429), the connection lost or stalled. */
static int sl_retryable(int rc, long status)
{
	if (status >= 300)
		return status == 429 || status >= 500;
	/* A name that did not resolve too: a resolver's failure may pass (curl says EAI_AGAIN's the same way). */
	return rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == SLUICE_ERESOLVE || rc == -EIO;
}

int sl__http_request(struct sl__http_conn *c, const struct sl__http_req *q, struct sl__http_resp *k)
{
	const struct sl__http_resp fresh = *k;
	unsigned seed = (unsigned)sl__now_ns() ^ (unsigned)(uintptr_t)c;
	int rc;

	for (unsigned attempt = 0;; attempt++) {
		*k = fresh;
		/* What the failed attempt delivered is void: the receiver starts over (and may not trust it). */
		if (attempt && k->progress)
			k->progress(k->progress_arg, 0);
		rc = sl_request_once(c, q, k);
		if (!rc || attempt >= q->retries || !sl_retryable(rc, k->status))
			break;
		uint64_t cap_ms = 100ull << (attempt < 6 ? attempt : 6), wait_ms;

		if (cap_ms > 5000)
			cap_ms = 5000;
		wait_ms = (uint64_t)rand_r(&seed) % (cap_ms + 1);
		sl__debug("http", "%s: attempt %u failed (%s); again in %llu ms", q->name, attempt + 1,
			  sluice_last_error_detail(), (unsigned long long)wait_ms);
		struct timespec ts = { (time_t)(wait_ms / 1000), (long)(wait_ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	if (rc && q->retries && sl_retryable(rc, k->status))
		sl__err(rc, "%s (after %u attempts)", sluice_last_error_detail(), q->retries + 1);
	return rc;
}
