/*
 * S3 settings as AWS tools resolve them (remote/s3conf.c): arguments over
 * AWS_* variables over the shared files, profiles, regions, endpoints and
 * addressing; bad files named by line without their text; s3:// URLs.
 * And the SigV4 signer of the requests sluice writes itself, against AWS's
 * published example.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "remote/remote.h"
#include "t_util.h"

/* The test's environment: NAME=VALUE strings, NULL-terminated. */
static const char *tenv(const char *name, void *ctx)
{
	size_t n = strlen(name);

	for (const char *const *e = ctx; *e; e++)
		if (!strncmp(*e, name, n) && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f)) {
		perror(path);
		exit(1);
	}
}

/*
 * AWS's example of a signed GetObject ("Signature Calculations for the
 * Authorization Header", S3 API reference: the first 10 bytes of test.txt
 * in examplebucket, signed with the hash of the empty body).
 */
static void test_sigv4_matches_awss_published_example(void)
{
	struct sl__sigv4_in in = {
		.method = "GET", .path = "/test.txt", .query = "",
		.hdr = { "Host: examplebucket.s3.amazonaws.com", "Range: bytes=0-9",
			 "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
			 "x-amz-date: 20130524T000000Z" },
		.payload_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		.amz_date = "20130524T000000Z", .region = "us-east-1", .service = "s3",
		.access = "AKIAIOSFODNN7EXAMPLE", .secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
	};
	char auth[400], small[40];

	T_CHECK(sl__sigv4(&in, auth, sizeof(auth)) == 0);
	T_CHECK(!strcmp(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
			      "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
			      "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"));
	/* Header order and case do not change the signature; a changed byte does. */
	in.hdr[0] = "x-amz-date: 20130524T000000Z", in.hdr[3] = "HOST:  examplebucket.s3.amazonaws.com ";
	T_CHECK(sl__sigv4(&in, auth, sizeof(auth)) == 0 && strstr(auth, "Signature=f0e8bdb87c9644"));
	in.hdr[1] = "Range: bytes=0-8";
	T_CHECK(sl__sigv4(&in, auth, sizeof(auth)) == 0 && !strstr(auth, "Signature=f0e8bdb87c9644"));
	T_CHECK(sl__sigv4(&in, small, sizeof(small)) == -E2BIG);
	in.hdr[1] = "no colon";
	T_CHECK(sl__sigv4(&in, auth, sizeof(auth)) == -EINVAL);
}

/* The one-pass object checksums (remote/sum.c) against their published check values. */
static void test_object_checksums_match_their_check_values(void)
{
	static const char nine[] = "123456789";
	/* SHA-256("abc") and SHA-1("abc") (FIPS 180-2's examples), CRC-64/NVME("123456789") (RevEng's catalogue). */
	static const unsigned char sha256_abc[32] = { 0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
						      0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
						      0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad };
	static const unsigned char sha1_abc[20] = { 0xa9, 0x99, 0x3e, 0x36, 0x47, 0x06, 0x81, 0x6a, 0xba, 0x3e,
						    0x25, 0x71, 0x78, 0x50, 0xc2, 0x6c, 0x9c, 0xd0, 0xd8, 0x9d };
	struct sl__s3_meta m = { .size = 9, .osum_kind = SL_OSUM_CRC64NVME, .sum_name = "crc64nvme" };
	unsigned char big[1000];

	T_CHECK(sl__crc64nvme(0, nine, 9) == 0xae8b14860a799888ull);
	T_CHECK(sl__crc64nvme(sl__crc64nvme(0, nine, 4), nine + 4, 5) == 0xae8b14860a799888ull);
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (unsigned char)(i * 7);
	T_CHECK(sl__crc64nvme(sl__crc64nvme(0, big, 333), big + 333, sizeof(big) - 333) == sl__crc64nvme(0, big, sizeof(big)));
	for (int i = 0; i < 8; i++)
		m.osum[i] = (unsigned char)(0xae8b14860a799888ull >> (56 - 8 * i));
	T_CHECK(sl__osum_check(&m, nine, 9, "s3://b/nine") == 1);
	T_CHECK(sl__osum_check(&m, "123456780", 9, "s3://b/nine") == SLUICE_EVERIFY);
	T_CHECK(strstr(sluice_last_error_detail(), "s3://b/nine") && strstr(sluice_last_error_detail(), "crc64nvme"));
	m = (struct sl__s3_meta){ .size = 3, .osum_kind = SL_OSUM_SHA256, .sum_name = "sha256" };
	memcpy(m.osum, sha256_abc, 32);
	T_CHECK(sl__osum_check(&m, "abc", 3, "s3://b/abc") == 1 && sl__osum_check(&m, "abd", 3, "s3://b/abc") == SLUICE_EVERIFY);
	m = (struct sl__s3_meta){ .size = 3, .osum_kind = SL_OSUM_SHA1, .sum_name = "sha1" };
	memcpy(m.osum, sha1_abc, 20);
	T_CHECK(sl__osum_check(&m, "abc", 3, "s3://b/abc") == 1 && sl__osum_check(&m, "abd", 3, "s3://b/abc") == SLUICE_EVERIFY);
	m.osum_kind = SL_OSUM_NONE;
	T_CHECK(sl__osum_check(&m, "abc", 3, "s3://b/abc") == 0);
}

/* A read back (from GPU memory, in the engine) stood in for by host bytes; fails at fail_at where set. */
struct t_back {
	const unsigned char *p;
	uint64_t fail_at, calls;
};

static int t_copy_back(void *ctx, void *dst, uint64_t off, size_t len)
{
	struct t_back *b = ctx;

	b->calls++;
	if (b->fail_at && off + len > b->fail_at)
		return sl__err(SLUICE_ECUDA, "cuMemcpyDtoH: CUDA_ERROR_ILLEGAL_ADDRESS (700)");
	memcpy(dst, b->p + off, len);
	return 0;
}

/*
 * An object's SHA checked over bytes brought back in chunks, in order (the
 * engine's read back from GPU memory): the same answer as over them in
 * one piece, a flipped byte a mismatch, and a failed copy that error
 * (never a match, never a mismatch).
 */
static void test_object_checksums_over_bytes_read_back(void)
{
	const size_t n = (9u << 20) + 3;
	unsigned char *data = malloc(n), sha[32];
	struct sl__s3_meta m = { .size = n, .osum_kind = SL_OSUM_SHA256, .sum_name = "sha256" };
	struct t_back b;
	unsigned len = 0;

	T_CHECK(data != NULL);
	if (!data)
		return;
	for (size_t i = 0; i < n; i++)
		data[i] = (unsigned char)(i * 131 + (i >> 12));
	EVP_Digest(data, n, sha, &len, EVP_sha256(), NULL);
	memcpy(m.osum, sha, 32);
	b = (struct t_back){ .p = data };
	T_CHECK(sl__osum_check_copy(&m, n, t_copy_back, &b, "s3://b/big") == 1 && b.calls == 3);
	T_CHECK(sl__osum_check(&m, data, n, "s3://b/big") == 1);
	data[n - 1] ^= 1;
	b = (struct t_back){ .p = data };
	T_CHECK(sl__osum_check_copy(&m, n, t_copy_back, &b, "s3://b/big") == SLUICE_EVERIFY);
	T_CHECK(strstr(sluice_last_error_detail(), "s3://b/big") && strstr(sluice_last_error_detail(), "sha256"));
	data[n - 1] ^= 1;
	b = (struct t_back){ .p = data, .fail_at = 5u << 20 };
	T_CHECK(sl__osum_check_copy(&m, n, t_copy_back, &b, "s3://b/big") == SLUICE_ECUDA);
	T_CHECK(strstr(sluice_last_error_detail(), "s3://b/big") && strstr(sluice_last_error_detail(), "CUDA_ERROR_ILLEGAL"));
	T_CHECK(b.calls == 2);
	/* The empty object: nothing to copy, and SHA-256 of nothing. */
	EVP_Digest("", 0, m.osum, &len, EVP_sha256(), NULL);
	b = (struct t_back){ .p = data };
	T_CHECK(sl__osum_check_copy(&m, 0, t_copy_back, &b, "s3://b/empty") == 1 && b.calls == 0);
	free(data);
}

/* The CA bundle: curl's own where readable, else the first readable of the distributions' paths. */
static void test_ca_bundle_is_found_where_the_distribution_keeps_it(const char *d)
{
	char there[700], missing[700];
	const char *list[3] = { missing, there, NULL };
	FILE *f;

	snprintf(there, sizeof(there), "%s/ca.pem", d);
	snprintf(missing, sizeof(missing), "%s/none.pem", d);
	f = fopen(there, "w");
	T_CHECK(f != NULL);
	if (f)
		fclose(f);
	T_CHECK(sl__ca_pick(there, list) == NULL);      /* curl's own is there: curl uses it */
	T_CHECK(sl__ca_pick(missing, list) == list[1]); /* curl's is absent: the first that is there */
	T_CHECK(sl__ca_pick(NULL, list) == list[1]);
	list[1] = NULL;
	T_CHECK(sl__ca_pick(missing, list) == NULL);    /* none anywhere: curl's error says so */
}

int main(void)
{
	const char *d = t_dir("t_s3conf");
	char home[600], aws[640], cred[700], conf[700], henv[700], bucket[64], key[1100];
	struct sl__s3_conf c;

	test_ca_bundle_is_found_where_the_distribution_keeps_it(d);
	snprintf(home, sizeof(home), "%s", d);
	snprintf(aws, sizeof(aws), "%s/.aws", home);
	snprintf(cred, sizeof(cred), "%s/credentials", aws);
	snprintf(conf, sizeof(conf), "%s/config", aws);
	snprintf(henv, sizeof(henv), "HOME=%s", home);
	T_CHECK(mkdir(aws, 0700) == 0);

	/* Nothing anywhere: anonymous, us-east-1, AWS's endpoint, virtual-host addressing. */
	{
		const char *e[] = { henv, NULL };

		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == 0);
		T_CHECK(c.anonymous && !strcmp(c.cred_source, "none") && !c.access_key[0]);
		T_CHECK(!strcmp(c.region, "us-east-1") && !strcmp(c.endpoint, "https://s3.us-east-1.amazonaws.com"));
		T_CHECK(!c.path_style && !strcmp(c.profile, "default"));
	}

	put(cred, "# comment\n[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = sk-default\n\n"
		  "[train]\r\naws_access_key_id=AKTRAIN\r\n  aws_secret_access_key =  sk-train  \r\naws_session_token = tok\r\n");
	put(conf, "[default]\nregion = eu-west-1\n; comment\n[profile train]\nregion = us-west-2\n"
		  "endpoint_url = http://127.0.0.1:9000/\ns3 =\n  addressing_style = path\n  max_concurrent_requests = 20\n"
		  "[profile keysonly]\naws_access_key_id = AKCONF\naws_secret_access_key = sk-conf\ns3 =\n  addressing_style = virtual\n"
		  "endpoint_url = https://minio.example:9000\n");

	/* The default profile from the files. */
	{
		const char *e[] = { henv, NULL };

		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == 0);
		T_CHECK(!c.anonymous && !strcmp(c.access_key, "AKDEFAULT") && !strcmp(c.secret_key, "sk-default"));
		T_CHECK(!strcmp(c.cred_source, "credentials file") && !c.session_token[0]);
		T_CHECK(!strcmp(c.region, "eu-west-1") && !strcmp(c.endpoint, "https://s3.eu-west-1.amazonaws.com"));
	}
	/* AWS_PROFILE: its keys (trimmed, CRLF lines), token, region, endpoint (trailing / cut), path style. */
	{
		const char *e[] = { henv, "AWS_PROFILE=train", NULL };

		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == 0);
		T_CHECK(!strcmp(c.access_key, "AKTRAIN") && !strcmp(c.secret_key, "sk-train") &&
			!strcmp(c.session_token, "tok"));
		T_CHECK(!strcmp(c.region, "us-west-2") && !strcmp(c.endpoint, "http://127.0.0.1:9000") && c.path_style);
	}
	/* Keys from the config file; addressing_style = virtual wins over the custom endpoint's default. */
	{
		const char *e[] = { henv, NULL };
		struct sl__s3_args a = { .profile = "keysonly" };

		T_CHECK(sl__s3_conf_resolve(&c, &a, tenv, e) == 0);
		T_CHECK(!strcmp(c.access_key, "AKCONF") && !strcmp(c.cred_source, "config file"));
		T_CHECK(!strcmp(c.endpoint, "https://minio.example:9000") && !c.path_style);
		T_CHECK(!strcmp(c.region, "us-east-1"));
	}
	/* Variables over the files; AWS_REGION over AWS_DEFAULT_REGION; AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL. */
	{
		const char *e[] = { henv, "AWS_PROFILE=train", "AWS_ACCESS_KEY_ID=AKENV", "AWS_SECRET_ACCESS_KEY=sk-env",
				    "AWS_REGION=ap-south-1", "AWS_DEFAULT_REGION=sa-east-1",
				    "AWS_ENDPOINT_URL=http://a:1", "AWS_ENDPOINT_URL_S3=http://b:2", NULL };

		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == 0);
		T_CHECK(!strcmp(c.access_key, "AKENV") && !strcmp(c.secret_key, "sk-env") && !c.session_token[0]);
		T_CHECK(!strcmp(c.cred_source, "environment") && !strcmp(c.region, "ap-south-1"));
		T_CHECK(!strcmp(c.endpoint, "http://b:2") && c.path_style);
	}
	/* Arguments over everything; a key without its secret is refused. */
	{
		const char *e[] = { henv, "AWS_ACCESS_KEY_ID=AKENV", "AWS_SECRET_ACCESS_KEY=sk-env", "AWS_DEFAULT_REGION=sa-east-1",
				    NULL };
		struct sl__s3_args a = { .endpoint = "http://127.0.0.1:9123", .access_key = "AKARG", .secret_key = "sk-arg",
					 .region = "local" };

		T_CHECK(sl__s3_conf_resolve(&c, &a, tenv, e) == 0);
		T_CHECK(!strcmp(c.access_key, "AKARG") && !strcmp(c.cred_source, "arguments") &&
			!strcmp(c.region, "local") && !strcmp(c.endpoint, "http://127.0.0.1:9123"));
		a.secret_key = NULL;
		T_CHECK(sl__s3_conf_resolve(&c, &a, tenv, e) == SLUICE_EINVAL_CONFIG && !c.access_key[0]);
		a = (struct sl__s3_args){ .endpoint = "127.0.0.1:9000" };
		T_CHECK(sl__s3_conf_resolve(&c, &a, tenv, e) == SLUICE_EINVAL_CONFIG);
		T_CHECK(strstr(sluice_last_error_detail(), "127.0.0.1:9000") && !c.secret_key[0]);
	}
	/* Files named by variables, "~/" as HOME. */
	{
		char alt[700];
		const char *e[] = { henv, "AWS_SHARED_CREDENTIALS_FILE=~/alt", "AWS_CONFIG_FILE=/nonexistent/config", NULL };

		snprintf(alt, sizeof(alt), "%s/alt", home);
		put(alt, "[default]\naws_access_key_id = AKALT\naws_secret_access_key = sk-alt\n");
		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == 0);
		T_CHECK(!strcmp(c.access_key, "AKALT") && !strcmp(c.region, "us-east-1"));
	}
	/* A malformed file: named with its line, and none of its text (a secret may be on that line). */
	{
		const char *e[] = { henv, NULL };

		put(cred, "[default]\naws_access_key_id = AKBAD\naws_secret_access_key sk-very-secret\n");
		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == SLUICE_EINVAL_CONFIG);
		T_CHECK(strstr(sluice_last_error_detail(), "credentials:3:") != NULL);
		T_CHECK(!strstr(sluice_last_error_detail(), "sk-very-secret") && !c.access_key[0]);
		put(cred, "aws_access_key_id = AKBAD\n");
		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == SLUICE_EINVAL_CONFIG &&
			strstr(sluice_last_error_detail(), "credentials:1: a setting before any [section]"));
		put(cred, "[default\n");
		T_CHECK(sl__s3_conf_resolve(&c, NULL, tenv, e) == SLUICE_EINVAL_CONFIG);
	}

	/* URLs. */
	T_CHECK(sl__is_s3_url("s3://b/k") && !sl__is_s3_url("/data/s3://x") && !sl__is_s3_url(NULL));
	T_CHECK(sl__s3_parse_url("s3://train-data/shards/shard-000001.sls", bucket, sizeof(bucket), key, sizeof(key)) == 0);
	T_CHECK(!strcmp(bucket, "train-data") && !strcmp(key, "shards/shard-000001.sls"));
	T_CHECK(sl__s3_parse_url("s3://my.bucket.01", bucket, sizeof(bucket), key, sizeof(key)) == 0 &&
		!strcmp(bucket, "my.bucket.01") && !key[0]);
	T_CHECK(sl__s3_parse_url("s3://abc/", bucket, sizeof(bucket), key, sizeof(key)) == 0 && !key[0]);
	T_CHECK(sl__s3_parse_url("s3://ab/k", bucket, sizeof(bucket), key, sizeof(key)) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "s3://ab/k"));
	T_CHECK(sl__s3_parse_url("s3://Upper/k", bucket, sizeof(bucket), key, sizeof(key)) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sl__s3_parse_url("s3://-abc/k", bucket, sizeof(bucket), key, sizeof(key)) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sl__s3_parse_url("s3://abc-/k", bucket, sizeof(bucket), key, sizeof(key)) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sl__s3_parse_url("http://abc/k", bucket, sizeof(bucket), key, sizeof(key)) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sl__s3_parse_url("s3://abc/k", bucket, 3, key, sizeof(key)) == SLUICE_EINVAL_CONFIG);
	test_sigv4_matches_awss_published_example();
	test_object_checksums_match_their_check_values();
	test_object_checksums_over_bytes_read_back();
	return t_done("t_s3conf");
}
