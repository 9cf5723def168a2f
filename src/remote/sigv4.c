/*
 * AWS Signature Version 4 for the requests sluice writes itself (the
 * direct receive of http.c): the canonical request, the string to sign,
 * the derived key and the Authorization header, as AWS's "Signature
 * Calculations for the Authorization Header" describes them.  SHA-256 and
 * HMAC are OpenSSL's.  The other requests are signed by curl
 * (CURLOPT_AWS_SIGV4); both are checked by the S3 test server, and this
 * one against AWS's published example too (t_sigv4).
 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "remote/remote.h"

static void sl_hex(const unsigned char *d, size_t n, char *out)
{
	static const char x[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = x[d[i] >> 4];
		out[2 * i + 1] = x[d[i] & 15];
	}
	out[2 * n] = 0;
}

static int sl_hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
	unsigned len = 32;

	return HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &len) ? 0 : -EIO;
}

/* The headers to sign, "name:value" with lower-case names and trimmed values, sorted by name. */
static int sl_hdr_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Query parameters in byte order (sluice's are already encoded as AWS wants them). */
static void sl_canonical_query(const char *q, char *out, size_t cap)
{
	char buf[2048], *parts[64], *save = NULL;
	size_t n = 0, at = 0;

	out[0] = 0;
	if (!q || !*q)
		return;
	snprintf(buf, sizeof(buf), "%s", q);
	for (char *p = strtok_r(buf, "&", &save); p && n < 64; p = strtok_r(NULL, "&", &save))
		parts[n++] = p;
	qsort(parts, n, sizeof(*parts), sl_hdr_cmp);
	for (size_t i = 0; i < n && at < cap; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s%s%s", i ? "&" : "", parts[i], strchr(parts[i], '=') ? "" : "=");
}

int sl__sigv4(const struct sl__sigv4_in *in, char *auth, size_t cap)
{
	char lines[SL_SIGV4_HDRS][600], *sorted[SL_SIGV4_HDRS], signed_names[512] = "", query[2048];
	char creq[8192], sts[512], hash[65], sig[65], scope[160], key0[200];
	unsigned char h[32], k[32];
	size_t n = 0, at = 0, sn = 0;
	int w;

	for (size_t i = 0; i < SL_SIGV4_HDRS && in->hdr[i]; i++) {
		const char *c = strchr(in->hdr[i], ':'), *v;
		size_t nl, e;

		if (!c || c == in->hdr[i])
			return sl__err(-EINVAL, "sigv4: header '%s' is not 'Name: value'", in->hdr[i]);
		nl = (size_t)(c - in->hdr[i]);
		for (v = c + 1; *v == ' ' || *v == '\t'; v++)
			;
		for (e = strlen(v); e && (v[e - 1] == ' ' || v[e - 1] == '\t'); e--)
			;
		if (nl + e + 2 > sizeof(lines[0]))
			return sl__err(-E2BIG, "sigv4: header '%.40s...' is too long", in->hdr[i]);
		for (size_t j = 0; j < nl; j++)
			lines[n][j] = (char)(in->hdr[i][j] >= 'A' && in->hdr[i][j] <= 'Z' ? in->hdr[i][j] + 32 : in->hdr[i][j]);
		snprintf(lines[n] + nl, sizeof(lines[0]) - nl, ":%.*s", (int)e, v);
		sorted[n] = lines[n];
		n++;
	}
	qsort(sorted, n, sizeof(*sorted), sl_hdr_cmp);
	sl_canonical_query(in->query, query, sizeof(query));
	w = snprintf(creq, sizeof(creq), "%s\n%s\n%s\n", in->method, in->path && *in->path ? in->path : "/", query);
	at = w > 0 ? (size_t)w : 0;
	for (size_t i = 0; i < n && at < sizeof(creq) && sn < sizeof(signed_names); i++) {
		size_t nl = (size_t)(strchr(sorted[i], ':') - sorted[i]);

		at += (size_t)snprintf(creq + at, sizeof(creq) - at, "%s\n", sorted[i]);
		sn += (size_t)snprintf(signed_names + sn, sizeof(signed_names) - sn, "%s%.*s", i ? ";" : "", (int)nl,
				       sorted[i]);
	}
	if (at >= sizeof(creq) || sn >= sizeof(signed_names))
		return sl__err(-E2BIG, "sigv4: the request's headers are too long to sign");
	at += (size_t)snprintf(creq + at, sizeof(creq) - at, "\n%s\n%s", signed_names, in->payload_hash);
	if (at >= sizeof(creq))
		return sl__err(-E2BIG, "sigv4: the request's headers are too long to sign");
	SHA256((const unsigned char *)creq, at, h);
	sl_hex(h, 32, hash);
	snprintf(scope, sizeof(scope), "%.8s/%s/%s/aws4_request", in->amz_date, in->region, in->service);
	snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s\n%s", in->amz_date, scope, hash);
	/* The key: HMAC of the date, region, service and "aws4_request", from "AWS4" + the secret. */
	snprintf(key0, sizeof(key0), "AWS4%s", in->secret);
	char day[9];

	snprintf(day, sizeof(day), "%.8s", in->amz_date);
	if (sl_hmac(key0, strlen(key0), day, k) || sl_hmac(k, 32, in->region, k) || sl_hmac(k, 32, in->service, k) ||
	    sl_hmac(k, 32, "aws4_request", k) || sl_hmac(k, 32, sts, h))
		return sl__err(-EIO, "sigv4: HMAC-SHA256 failed");
	OPENSSL_cleanse(key0, sizeof(key0));
	OPENSSL_cleanse(k, sizeof(k));
	sl_hex(h, 32, sig);
	w = snprintf(auth, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", in->access, scope,
		     signed_names, sig);
	return w > 0 && (size_t)w < cap ? 0 : sl__err(-E2BIG, "sigv4: the Authorization header is too long");
}
