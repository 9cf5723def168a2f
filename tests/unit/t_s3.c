/*
 * S3 requests (remote/s3.c) against a real S3-compatible server with
 * signatures checked, started by tests/remote/with_s3_server.py: bucket and
 * object PUT, HEAD, ranged GETs byte for byte, an ETag pin, and the
 * server's errors (wrong secret, no such key, no such bucket) named; then
 * s3:// paths through the engine's workers (store/s3store.c).  Scenarios,
 * each a function named for the behaviour it checks.
 * Without the server's variables it skips (77).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"
#include "t_util.h"

static const char *only(const char *name, void *ctx)
{
	(void)name;
	(void)ctx;
	return NULL; /* no AWS_* variable, no ~/.aws: only what the test passes */
}

/* An async transfer's callback: adds its result. */
static void t_add_result(ssize_t result, void *user)
{
	atomic_fetch_add((_Atomic long *)user, (long)result);
}

/* What every scenario shares: the server, a client and its connection, an object's bytes and a buffer. */
static const char *ep, *ak, *sk;
static struct sl__s3_args a;
static size_t n;
static char etag[128], *obj, *got;
static struct sl__s3 *s;
static struct sl__http_conn *c;
static struct sl__s3_meta meta;

static void test_put_and_head_give_back_the_crc32c_sent(void)
{
	T_CHECK(sl__s3_put(s, c, "sluice-test", "", NULL, 0) == 0);
	T_CHECK(sl__s3_put(s, c, "sluice-test", "dir/obj one+%.bin", obj, n) == 0);
	T_CHECK(sl__s3_head(s, c, "sluice-test", "dir/obj one+%.bin", &meta) == 0);
	snprintf(etag, sizeof(etag), "%s", meta.etag);
	T_CHECK(meta.size == n && etag[0] == '"');
	/* The PUT carried its CRC32C; the server keeps it and gives it back for readers to check. */
	T_CHECK(meta.sum_kind == SL_CRC32C && meta.sum == sluice_crc32c(0, obj, n) && !strcmp(meta.sum_name, "crc32c"));
}

static void test_ranged_gets_are_byte_for_byte(void)
{
	/* Ranged GETs on the same connection: the start, an odd middle, the tail, past the end. */
	memset(got, 0xAA, n);
	T_CHECK(sl__s3_get(s, c, "sluice-test", "dir/obj one+%.bin", 0, n, got, NULL) == (ssize_t)n);
	T_CHECK(!memcmp(got, obj, n));
	memset(got, 0xAA, n);
	T_CHECK(sl__s3_get(s, c, "sluice-test", "dir/obj one+%.bin", 777777, 123457, got, etag) == 123457);
	T_CHECK(!memcmp(got, obj + 777777, 123457) && (unsigned char)got[123457] == 0xAA);
	T_CHECK(sl__s3_get(s, c, "sluice-test", "dir/obj one+%.bin", n - 10, 100, got, NULL) == 10);
	T_CHECK(!memcmp(got, obj + n - 10, 10));
	T_CHECK(sl__s3_get(s, c, "sluice-test", "dir/obj one+%.bin", n + 10, 100, got, NULL) == -ERANGE);
}

static void test_a_read_pinned_to_an_old_etag_fails(void)
{
	char etag2[128];

	/* The object changes: a read pinned to the old ETag fails instead of mixing versions. */
	obj[5] ^= 1;
	T_CHECK(sl__s3_put(s, c, "sluice-test", "dir/obj one+%.bin", obj, n) == 0);
	T_CHECK(sl__s3_head(s, c, "sluice-test", "dir/obj one+%.bin", &meta) == 0);
	snprintf(etag2, sizeof(etag2), "%s", meta.etag);
	T_CHECK(strcmp(etag, etag2) != 0);
	T_CHECK(sl__s3_get(s, c, "sluice-test", "dir/obj one+%.bin", 0, 100, got, etag) == -ESTALE);
	T_CHECK(strstr(sluice_last_error_detail(), "412") && strstr(sluice_last_error_detail(), "PreconditionFailed"));
	T_CHECK(sl__s3_get(s, c, "sluice-test", "dir/obj one+%.bin", 0, 100, got, etag2) == 100 && got[5] == obj[5]);
}

static void test_server_errors_name_the_object_and_code(void)
{
	/* The server's errors, named with the object and the server's code. */
	T_CHECK(sl__s3_get(s, c, "sluice-test", "missing", 0, 10, got, NULL) == -ENOENT);
	T_CHECK(strstr(sluice_last_error_detail(), "s3://sluice-test/missing") &&
		strstr(sluice_last_error_detail(), "NoSuchKey"));
	T_CHECK(sl__s3_head(s, c, "no-such-bucket", "k", &meta) == -ENOENT);
	T_CHECK(strstr(sluice_last_error_detail(), "s3://no-such-bucket/k"));
}

static void test_listings_page_escape_and_group(void)
{
	/* Every page (1000 keys a page), one level with "/" as the delimiter, names that need escaping. */
	{
		struct sl__s3_list l = { 0 };
		char k[64];
		int ok = 1;

		for (int i = 0; i < 1003 && ok; i++) {
			snprintf(k, sizeof(k), "many/%04d &<%s>.bin", i, i % 2 ? "x" : "y");
			ok = sl__s3_put(s, c, "sluice-test", k, "z", 1) == 0;
		}
		T_CHECK(ok);
		T_CHECK(sl__s3_put(s, c, "sluice-test", "many/sub/deeper.bin", "zz", 2) == 0);
		T_CHECK(sl__s3_list(s, c, "sluice-test", "many/", NULL, 0, &l) == 0 && l.n == 1004);
		T_CHECK(l.n == 1004 && !strcmp(l.e[0].key, "many/0000 &<y>.bin") && l.e[0].size == 1 &&
			l.e[0].etag[0] == '"' && !strcmp(l.e[1003].key, "many/sub/deeper.bin") && l.e[1003].size == 2);
		sl__s3_list_free(&l);
		T_CHECK(sl__s3_list(s, c, "sluice-test", "many/", "/", 0, &l) == 0 && l.n == 1004);
		T_CHECK(l.n == 1004 && l.e[1003].is_prefix && !strcmp(l.e[1003].key, "many/sub/"));
		sl__s3_list_free(&l);
		T_CHECK(sl__s3_list(s, c, "sluice-test", "nothing-here/", "/", 0, &l) == 0 && l.n == 0);
		T_CHECK(sl__s3_list(s, c, "no-such-bucket", "", NULL, 0, &l) == -ENOENT &&
			strstr(sluice_last_error_detail(), "NoSuchBucket"));
		sl__s3_list_free(&l);
		/* A page that is not a listing, or is truncated without a token, is an error, not an empty list. */
		{
			char tok[64];
			const char *trunc = "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";

			T_CHECK(sl__s3_list_parse("<a><b>", 6, &l, tok, sizeof(tok)) == SLUICE_EFORMAT);
			T_CHECK(sl__s3_list_parse(trunc, strlen(trunc), &l, tok, sizeof(tok)) == SLUICE_EFORMAT);
			sl__s3_list_free(&l);
		}
	}
}

static void test_a_wrong_secret_is_refused_and_never_shown(void)
{
	struct sl__s3_args wrong = a;
	struct sl__s3 *bad;

	/* A wrong secret: refused by the server's signature check, and the secret is in no message. */
	wrong.secret_key = "wrong-secret-0123456789";
	T_CHECK(sl__s3_open(&bad, &wrong, only, NULL) == 0);
	T_CHECK(sl__s3_get(bad, c, "sluice-test", "dir/obj one+%.bin", 0, 10, got, NULL) == -EACCES);
	T_CHECK(strstr(sluice_last_error_detail(), "SignatureDoesNotMatch") &&
		!strstr(sluice_last_error_detail(), "wrong-secret"));
	sl__s3_close(bad);
}

static void test_nothing_listening_is_a_transport_error_not_a_hang(void)
{
	/* Nothing listens: a transport error, not a hang. */
	struct sl__s3_args none = { .endpoint = "http://127.0.0.1:1", .access_key = ak, .secret_key = sk };
	struct sl__s3 *bad;

	T_CHECK(sl__s3_open(&bad, &none, only, NULL) == 0);
	T_CHECK(sl__s3_get(bad, c, "sluice-test", "k", 0, 10, got, NULL) == -ECONNREFUSED);
	sl__s3_close(bad);
}

static void test_the_public_client_by_bucket_and_key_sync_and_async(void)
{
	/* Explicit endpoint and keys, bucket and key apart. */
	{
		struct sluice_engine *eng = t_engine();
		struct sluice_s3 *cl, *wrong;
		uint64_t sz = 0;

		T_CHECK(sluice_s3_open(&cl, eng, ep, ak, sk, "us-east-1") == 0);
		T_CHECK(sluice_s3_write_from_gpu(cl, "sluice-test", "client/obj", obj, n, NULL) == (ssize_t)n);
		T_CHECK(sluice_s3_size(cl, "sluice-test", "client/obj", &sz) == 0 && sz == n);
		memset(got, 0xAA, n);
		T_CHECK(sluice_s3_read_to_gpu(cl, "sluice-test", "client/obj", got, 77, 5000, NULL) == 5000 &&
			!memcmp(got, obj + 77, 5000));
		T_CHECK(sluice_s3_read_to_gpu(cl, "sluice-test", NULL, got, 0, 1, NULL) == SLUICE_EINVAL_CONFIG);
		/* Async: futures at once, the callback once each with the result, errors named at the wait. */
		{
			struct sluice_future *fu[3];
			_Atomic long sum = 0;

			memset(got, 0, n);
			T_CHECK(sluice_s3_read_async(cl, "sluice-test", "client/obj", got, 0, n / 2, t_add_result, &sum, &fu[0]) == 0);
			T_CHECK(sluice_s3_read_async(cl, "sluice-test", "client/obj", got + n / 2, n / 2, n - n / 2, t_add_result,
						     &sum, &fu[1]) == 0);
			T_CHECK(sluice_s3_write_async(cl, "sluice-test", "client/obj2", obj, 1000, NULL, NULL, &fu[2]) == 0);
			T_CHECK(sluice_future_wait(fu[0], NULL) == (ssize_t)(n / 2));
			T_CHECK(sluice_future_wait(fu[1], NULL) == (ssize_t)(n - n / 2));
			T_CHECK(sluice_future_wait(fu[2], NULL) == 1000 && atomic_load(&sum) == (long)n);
			T_CHECK(!memcmp(got, obj, n));
			for (int i = 0; i < 3; i++)
				sluice_future_free(fu[i]);
			T_CHECK(sluice_s3_read_async(cl, "sluice-test", "client/none", got, 0, 1, NULL, NULL, &fu[0]) == 0);
			T_CHECK(sluice_future_wait(fu[0], NULL) == -ENOENT &&
				strstr(sluice_last_error_detail(), "client/none"));
			sluice_future_free(fu[0]);
		}
		T_CHECK(sluice_s3_open(&wrong, eng, ep, ak, "wrong-secret-xyz", NULL) == 0);
		T_CHECK(sluice_s3_size(wrong, "sluice-test", "client/obj", &sz) == -EACCES &&
			!strstr(sluice_last_error_detail(), "wrong-secret-xyz"));
		sluice_s3_close(wrong);
		T_CHECK(sluice_s3_open(&wrong, eng, "ftp://x", ak, sk, NULL) == SLUICE_EINVAL_CONFIG && !wrong);
		T_CHECK(sluice_s3_open(&wrong, eng, ep, ak, NULL, NULL) == SLUICE_EINVAL_CONFIG && !wrong);
		sluice_s3_close(cl);
		sluice_s3_close(NULL);
		sluice_engine_close(eng);
	}
}

static void test_s3_paths_through_the_engine(void)
{
	/* Through the engine, as any path: the object read by the workers' ranged GETs, byte for byte. */
	{
		const char *url = "s3://sluice-test/dir/obj one+%.bin";
		struct sluice_range r[3];
		struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
		struct sluice_engine *eng;
		struct sluice_file *f;
		char *got2 = malloc(n);

		/* The engine's client takes what AWS tools take: the variables, and no ~/.aws here. */
		setenv("HOME", t_dir("t_s3_home"), 1);
		setenv("AWS_ENDPOINT_URL", ep, 1);
		setenv("AWS_ACCESS_KEY_ID", ak, 1);
		setenv("AWS_SECRET_ACCESS_KEY", sk, 1);
		setenv("AWS_REGION", "us-east-1", 1);
		setenv("SLUICE_MAX_TRANSFER_SIZE", "1M", 1); /* several segments, so several workers' GETs */
		setenv("SLUICE_S3_PART_SIZE", "5M", 1);      /* the 12 MiB object below: three parts */
		setenv("SLUICE_S3_CONCURRENCY", "3", 1);
		eng = t_engine();
		T_CHECK(sluice_file_open(&f, eng, url, SLUICE_RDONLY) == 0);
		T_CHECK(sluice_file_size(f) == n);
		memset(got, 0xAA, n);
		T_CHECK(sluice_file_read(f, 0, n, got, &rep) == (ssize_t)n);
		T_CHECK(!memcmp(got, obj, n) && rep.bytes == n && strstr(rep.path, "s3:buffered"));
		/* A whole object is matched against its checksum; a range of it has none to match. */
		T_CHECK(rep.bytes_verified == n);
		T_CHECK(sluice_file_read(f, 10, n - 10, got, &rep) == (ssize_t)(n - 10) && rep.bytes_verified == 0);
		/* Batched ranges, odd offsets and lengths, into odd host addresses. */
		r[0] = (struct sluice_range){ f, 1, 1000, got2 + 3 };
		r[1] = (struct sluice_range){ f, 2000000, 777777, got2 + 5000 };
		r[2] = (struct sluice_range){ f, n - 4097, 4097, got2 + 900000 };
		T_CHECK(sluice_read_batch(eng, r, 3, NULL) == 1000 + 777777 + 4097);
		T_CHECK(!memcmp(got2 + 3, obj + 1, 1000) && !memcmp(got2 + 5000, obj + 2000000, 777777) &&
			!memcmp(got2 + 900000, obj + n - 4097, 4097));
		T_CHECK(sluice_file_read(f, n - 10, 11, got, NULL) == SLUICE_ERANGE);
		/* The object is replaced: reads of the open file fail, naming it, instead of mixing versions. */
		obj[6] ^= 1;
		T_CHECK(sl__s3_put(s, c, "sluice-test", "dir/obj one+%.bin", obj, n) == 0);
		T_CHECK(sluice_file_read(f, 0, n, got, NULL) == -ESTALE);
		T_CHECK(strstr(sluice_last_error_detail(), "s3://sluice-test/dir/obj one+%.bin"));
		sluice_file_close(f);
		/* Reopened, the new version; the one-shot call too. */
		memset(got, 0xAA, n);
		T_CHECK(sluice_read_to_gpu(eng, url, 0, n, got, NULL) == (ssize_t)n && !memcmp(got, obj, n));
		/* Errors named as for files. */
		T_CHECK(sluice_file_open(&f, eng, "s3://sluice-test/nothing-here", SLUICE_RDONLY) == -ENOENT && !f);
		T_CHECK(strstr(sluice_last_error_detail(), "s3://sluice-test/nothing-here"));
		T_CHECK(sluice_file_open(&f, eng, url, SLUICE_RDWR) == -EROFS && !f);
		/* Writes under the 5 MiB part size: one PUT each, read back byte for byte (multipart: below). */
		T_CHECK(sluice_write_from_gpu(eng, "s3://sluice-test/small", obj + 1, 100, NULL) == 100);
		T_CHECK(sluice_read_to_gpu(eng, "s3://sluice-test/small", 0, 100, got, NULL) == 100 &&
			!memcmp(got, obj + 1, 100));
		T_CHECK(sluice_write_from_gpu(eng, "s3://sluice-test/big", obj, n, &rep) == (ssize_t)n);
		T_CHECK(strstr(rep.path, "s3:upload") != NULL);
		memset(got, 0xAA, n);
		T_CHECK(sluice_read_to_gpu(eng, "s3://sluice-test/big", 0, n, got, NULL) == (ssize_t)n &&
			!memcmp(got, obj, n));
		T_CHECK(sluice_write_from_gpu(eng, "s3://sluice-test/", obj, 10, NULL) == -EISDIR);
		T_CHECK(sluice_file_open(&f, eng, "s3://sluice-test/", SLUICE_RDONLY) == -EISDIR && !f);
		T_CHECK(sluice_file_open(&f, eng, "s3://x/k", SLUICE_RDONLY) == SLUICE_EINVAL_CONFIG && !f);
		sluice_engine_close(eng);
		free(got2);
	}
}

static void test_faults_on_first_attempts_are_retried_and_named_without_retries(void)
{
	/*
	 * Through a proxy that breaks the first attempt of every request (503
	 * SlowDown, a body cut off halfway, a 2 s stall): with retries every
	 * read and write is whole; without, the breakage comes back named.
	 */
	{
		const char *faulty = getenv("SLUICE_TEST_S3_FAULTY_ENDPOINT");
		struct sl__s3_args fa = { .endpoint = faulty, .access_key = ak, .secret_key = sk, .region = "us-east-1" };
		struct sluice_engine *eng;
		struct sluice_file *f;
		struct sl__s3 *fs;
		int failed = 0;

		T_CHECK(faulty != NULL);
		T_CHECK(sl__s3_open(&fs, &fa, only, NULL) == 0);
		for (int i = 0; i < 4; i++) {
			memset(got, 0xAA, 300000);
			T_CHECK(sl__s3_get(fs, c, "sluice-test", "dir/obj one+%.bin", (uint64_t)i * 1000, 300000, got,
					   NULL) == 300000);
			T_CHECK(!memcmp(got, obj + i * 1000, 300000));
		}
		T_CHECK(sl__s3_put(fs, c, "sluice-test", "through-proxy", obj, 100000) == 0);
		T_CHECK(sl__s3_head(fs, c, "sluice-test", "through-proxy", &meta) == 0 && meta.size == 100000);
		sl__s3_close(fs);

		setenv("AWS_ENDPOINT_URL", faulty, 1);
		eng = t_engine();
		T_CHECK(sluice_file_open(&f, eng, "s3://sluice-test/dir/obj one+%.bin", SLUICE_RDONLY) == 0);
		memset(got, 0xAA, n);
		T_CHECK(f && sluice_file_read(f, 0, n, got, NULL) == (ssize_t)n && !memcmp(got, obj, n));
		sluice_file_close(f);
		{
			/* 12 MiB + 1: three parts, each of them and the upload's own calls through the faults. */
			const size_t m = (12u << 20) + 1;
			char *big = malloc(m), *back = malloc(m);

			t_fill(big, m, 12);
			T_CHECK(sluice_write_from_gpu(eng, "s3://sluice-test/faulty-big", big, m, NULL) == (ssize_t)m);
			T_CHECK(sluice_read_to_gpu(eng, "s3://sluice-test/faulty-big", 0, m, back, NULL) == (ssize_t)m &&
				!memcmp(back, big, m));
			free(big);
			free(back);
		}
		sluice_engine_close(eng);

		setenv("SLUICE_S3_RETRIES", "0", 1);
		T_CHECK(sl__s3_open(&fs, &fa, NULL, NULL) == 0);
		for (int i = 0; i < 6; i++) {
			/* Each a new request, so each meets the proxy's fault of its turn. */
			ssize_t r = sl__s3_get(fs, c, "sluice-test", "dir/obj one+%.bin", 50000 + (uint64_t)i, 1000, got, NULL);

			if (r == -EIO && strstr(sluice_last_error_detail(), "HTTP 503 SlowDown"))
				failed |= 1;
			else if (r == -ECONNRESET && strstr(sluice_last_error_detail(), "s3://sluice-test/dir/obj one+%.bin"))
				failed |= 2;
			else
				T_CHECK(r == 1000);
		}
		T_CHECK(failed == 3);
		sl__s3_close(fs);
		setenv("SLUICE_S3_RETRIES", "x", 1);
		T_CHECK(sl__s3_open(&fs, &fa, NULL, NULL) == SLUICE_EINVAL_CONFIG && strstr(sluice_last_error_detail(),
											 "SLUICE_S3_RETRIES"));
		unsetenv("SLUICE_S3_RETRIES");
	}
}

/*
 * sluice_s3_get_many: whole objects, many in flight: each its bytes and size;
 * one larger than its buffer -EFBIG with its size; a missing one -ENOENT
 * and the call's error naming it; no objects, nothing done; the arguments
 * checked.  Twice, so the second call runs on the connections kept.
 */
static void test_many_small_objects_whole_and_each_checked(void)
{
	struct sluice_engine *eng = t_engine();
	struct sluice_s3 *cl;
	enum { N = 40 };
	struct sluice_s3_object o[N + 2];
	char keys[N][32], *bufs = malloc((size_t)N * 4096);

	T_CHECK(sluice_s3_open(&cl, eng, ep, ak, sk, "us-east-1") == 0);
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "many/%03d", i);
		T_CHECK(sl__s3_put(s, c, "sluice-test", keys[i], obj + i, (size_t)i * 97) == 0);
	}
	for (int round = 0; round < 2; round++) {
		memset(o, 0, sizeof(o));
		memset(bufs, 0xAA, (size_t)N * 4096);
		for (int i = 0; i < N; i++)
			o[i] = (struct sluice_s3_object){ .key = keys[i], .buf = bufs + (size_t)i * 4096, .cap = 4096 };
		o[N] = (struct sluice_s3_object){ .key = "many/none", .buf = got, .cap = 10 };
		o[N + 1] = (struct sluice_s3_object){ .key = "client/obj", .buf = got, .cap = 1000 }; /* n bytes: too large */
		T_CHECK(sluice_s3_get_many(cl, "sluice-test", o, N + 2, round ? 3 : 0) < 0);
		for (int i = 0; i < N; i++)
			T_CHECK(o[i].result == i * 97 && o[i].size == (uint64_t)i * 97 &&
				!memcmp(bufs + (size_t)i * 4096, obj + i, (size_t)i * 97) &&
				(unsigned char)bufs[(size_t)i * 4096 + (size_t)i * 97] == 0xAA);
		T_CHECK(o[N].result == -ENOENT && o[N + 1].result == -EFBIG && o[N + 1].size == n);
	}
	T_CHECK(sluice_s3_get_many(cl, "sluice-test", o, N, 8) == 0);
	T_CHECK(sluice_s3_get_many(cl, "sluice-test", o + N, 1, 1) == -ENOENT && strstr(sluice_last_error_detail(), "many/none"));
	T_CHECK(sluice_s3_get_many(cl, "sluice-test", NULL, 0, 0) == 0);
	T_CHECK(sluice_s3_get_many(cl, NULL, o, 1, 0) == -EINVAL && sluice_s3_get_many(NULL, "b", o, 1, 0) == -EINVAL);
	sluice_s3_close(cl);
	sluice_engine_close(eng);
	free(bufs);
}

int main(void)
{
	ep = getenv("SLUICE_TEST_S3_ENDPOINT");
	ak = getenv("SLUICE_TEST_S3_ACCESS_KEY");
	sk = getenv("SLUICE_TEST_S3_SECRET_KEY");
	if (!ep || !ak || !sk) {
		printf("t_s3: SKIP (no S3 test server: run through tests/remote/with_s3_server.py)\n");
		return T_SKIP;
	}
	a = (struct sl__s3_args){ .endpoint = ep, .access_key = ak, .secret_key = sk, .region = "us-east-1" };
	n = (3u << 20) + 12345;
	obj = malloc(n);
	got = malloc(n);
	t_fill(obj, n, 11);
	T_CHECK(sl__s3_open(&s, &a, only, NULL) == 0);
	T_CHECK(sl__http_conn_open(&c) == 0);
	T_CHECK(sl__s3_conf(s)->path_style && !sl__s3_conf(s)->anonymous);
	/* In this order: each scenario leaves the object as the next expects it. */
	test_put_and_head_give_back_the_crc32c_sent();
	test_ranged_gets_are_byte_for_byte();
	test_a_read_pinned_to_an_old_etag_fails();
	test_server_errors_name_the_object_and_code();
	test_listings_page_escape_and_group();
	test_a_wrong_secret_is_refused_and_never_shown();
	test_nothing_listening_is_a_transport_error_not_a_hang();
	test_the_public_client_by_bucket_and_key_sync_and_async();
	test_many_small_objects_whole_and_each_checked();
	test_s3_paths_through_the_engine();
	test_faults_on_first_attempts_are_retried_and_named_without_retries();
	sl__http_conn_close(c);
	sl__s3_close(s);
	free(obj);
	free(got);
	return t_done("t_s3");
}
