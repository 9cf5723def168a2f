/*
 * libFuzzer target: what remote/ parses from outside.  The first byte
 * modulo 4 picks: 0, AWS shared config and credentials files
 * (sl__ini_parse): every setting handed out has a non-empty section and
 * key, and a failure is SLUICE_EINVAL_CONFIG naming "fuzz.ini:LINE"; 1, an
 * S3 error body (sl__s3_error_parse): what it extracts is printable ASCII
 * that fits; 2, a ListObjectsV2 page (sl__s3_list_parse): every entry has
 * a key, the token fits, a failure is SLUICE_EFORMAT or -ENOMEM; 3, an
 * HTTP answer's head as the direct receive reads it (sl__http_head_parse):
 * -EAGAIN, -EIO, 0 or 1; its end inside the bytes; an answer taken has a
 * length and a status of three digits; every string kept fits.  With bit
 * 3 of the first byte set instead, a web server's listing page
 * (sl__web_links): every link handed out is one name in the canonical
 * escaped form (link_ok), however the page spelt it.  All: no
 * crash, no leak, no sanitizer report.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"

static int check(const char *section, const char *key, const char *value, void *ctx)
{
	(void)value;
	(void)ctx;
	if (!*section || !*key)
		abort();
	return 0;
}

/*
 * A listing's entry: one name in the canonical form (unreserved bytes and
 * uppercase %XX escapes only, a '/' only at its end, for a directory),
 * which decoded is not ".", ".." or empty, holds no '/' or NUL and is at
 * most 255 bytes.
 */
static int link_ok(void *arg, const char *href, size_t n, int dir)
{
	size_t end = n && href[n - 1] == '/' ? n - 1 : n, bytes = 0, dots = 0;

	(void)arg;
	if (!end || dir != (end < n))
		abort();
	for (size_t i = 0; i < end; i++, bytes++) {
		unsigned char c = (unsigned char)href[i];

		if (c == '%') {
			int v = sl__pct_byte(href + i, end - i);

			if (v <= 0 || v == '/' || (href[i + 1] >= 'a' && href[i + 1] <= 'f') ||
			    (href[i + 2] >= 'a' && href[i + 2] <= 'f'))
				abort();
			i += 2;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("-._~", c))))
			abort();
		dots += c == '.';
	}
	if (bytes > 255 || (bytes == dots && bytes <= 2))
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char code[16], msg[64];
	int rc;

	if (!size)
		return 0;
	if (data[0] & 8) {
		if (sl__web_links((const char *)data + 1, size - 1, "fuzz", link_ok, NULL))
			abort();
		return 0;
	}
	if (data[0] % 4 == 3) {
		struct sl__http_resp k = { .keep = "x-amz-checksum-" };
		char *buf = malloc(size);
		size_t end = 0;
		int keep = 0;

		if (!buf)
			return 0;
		memcpy(buf, data + 1, size - 1);
		buf[size - 1] = 0;
		rc = sl__http_head_parse(buf, size - 1, &k, &end, &keep, data[0] & 4);
		if (rc != -EAGAIN && rc != -EIO && rc != 0 && rc != 1)
			abort();
		if (rc >= 0 && (end > size - 1 || k.status < 100 || k.status > 999))
			abort();
		if (rc == 0 && !k.have_size)
			abort();
		if (strlen(k.etag) >= sizeof(k.etag) || strlen(k.range) >= sizeof(k.range) || k.nkept > SL_HTTP_KEPT)
			abort();
		free(buf);
		return 0;
	}
	if (data[0] % 4 == 2) {
		struct sl__s3_list l = { 0 };
		char token[64];

		rc = sl__s3_list_parse((const char *)data + 1, size - 1, &l, token, sizeof(token));
		if (rc && rc != SLUICE_EFORMAT && rc != -ENOMEM)
			abort();
		for (size_t i = 0; i < l.n; i++)
			if (!l.e[i].key || strlen(l.e[i].etag) >= sizeof(l.e[i].etag))
				abort();
		if (strlen(token) >= sizeof(token))
			abort();
		sl__s3_list_free(&l);
		return 0;
	}
	if (data[0] % 4 == 1) {
		rc = sl__s3_error_parse((const char *)data + 1, size - 1, code, sizeof(code), msg, sizeof(msg));
		for (const char *p = code; rc & 1 && *p; p++)
			if (*p < 0x20 || *p >= 0x7f)
				abort();
		if (strlen(code) >= sizeof(code) || strlen(msg) >= sizeof(msg))
			abort();
		return 0;
	}
	rc = sl__ini_parse((const char *)data + 1, size - 1, "fuzz.ini", check, NULL);
	if (rc && (rc != SLUICE_EINVAL_CONFIG || strncmp(sluice_last_error_detail(), "fuzz.ini:", 9)))
		abort();
	return 0;
}
