/*
 * S3 settings the way AWS tools take them (remote.h): explicit arguments,
 * AWS_* variables, the shared credentials and config files, and s3:// URLs.
 * Error details name files, lines and settings, never their values.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "remote/remote.h"

/* The settings of one profile, gathered from both files. */
struct sl_profile {
	const char *want_cred;    /* section name in the credentials file */
	const char *want_conf;    /* and in the config file ("profile NAME", or "default") */
	int in_config;            /* parsing the config file */
	char access_key[128], secret_key[256], session_token[4096];
	char region[64], endpoint[512], addressing[16];
};

static void sl_set(char *dst, size_t cap, const char *v)
{
	if (!dst[0])
		snprintf(dst, cap, "%s", v);
}

static int sl_profile_setting(const char *section, const char *key, const char *value, void *ctx)
{
	struct sl_profile *pr = ctx;

	if (strcmp(section, pr->in_config ? pr->want_conf : pr->want_cred) &&
	    !(pr->in_config && !strcmp(pr->want_cred, "default") && !strcmp(section, "profile default")))
		return 0;
	if (!strcmp(key, "aws_access_key_id"))
		sl_set(pr->access_key, sizeof(pr->access_key), value);
	else if (!strcmp(key, "aws_secret_access_key"))
		sl_set(pr->secret_key, sizeof(pr->secret_key), value);
	else if (!strcmp(key, "aws_session_token"))
		sl_set(pr->session_token, sizeof(pr->session_token), value);
	else if (!strcmp(key, "region") && pr->in_config)
		sl_set(pr->region, sizeof(pr->region), value);
	else if ((!strcmp(key, "endpoint_url") || !strcmp(key, "s3.endpoint_url")) && pr->in_config)
		sl_set(pr->endpoint, sizeof(pr->endpoint), value);
	else if (!strcmp(key, "s3.addressing_style") && pr->in_config)
		sl_set(pr->addressing, sizeof(pr->addressing), value);
	return 0;
}


static const char *sl_env(sl__env_fn env, void *ctx, const char *name)
{
	const char *v = env ? env(name, ctx) : getenv(name);

	return v && *v ? v : NULL;
}

/* A file named by variable var, or $HOME/.aws/dflt; a leading "~/" is $HOME. */
static void sl_file_path(char *out, size_t cap, sl__env_fn env, void *ctx, const char *var, const char *dflt)
{
	const char *v = sl_env(env, ctx, var), *home = sl_env(env, ctx, "HOME");

	if (v && !strncmp(v, "~/", 2))
		snprintf(out, cap, "%s/%s", home ? home : "", v + 2);
	else if (v)
		snprintf(out, cap, "%s", v);
	else
		snprintf(out, cap, "%s/.aws/%s", home ? home : "", dflt);
}

/* The profile's key pair, where no earlier place gave one. */
static void sl_take_keys(struct sl__s3_conf *c, const struct sl_profile *pr, const char *source)
{
	if (c->cred_source || !pr->access_key[0] || !pr->secret_key[0])
		return;
	memcpy(c->access_key, pr->access_key, sizeof(c->access_key));
	memcpy(c->secret_key, pr->secret_key, sizeof(c->secret_key));
	memcpy(c->session_token, pr->session_token, sizeof(c->session_token));
	c->cred_source = source;
}

static int sl_copy_arg(char *dst, size_t cap, const char *v, const char *what)
{
	if (strlen(v) >= cap)
		return sl__err(SLUICE_EINVAL_CONFIG, "S3 %s longer than %zu characters", what, cap - 1);
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* Credentials from the arguments, else the environment: the first place that has a key pair gives all of it. */
static int sl_creds(struct sl__s3_conf *c, const struct sl__s3_args *args, sl__env_fn env, void *ctx)
{
	const char *ak = args->access_key && *args->access_key ? args->access_key : NULL;
	const char *sk = args->secret_key && *args->secret_key ? args->secret_key : NULL, *v;
	int rc;

	if (ak || sk) {
		if (!ak || !sk)
			return sl__err(SLUICE_EINVAL_CONFIG, "S3 credentials: an access key needs its secret key, and back");
		if ((rc = sl_copy_arg(c->access_key, sizeof(c->access_key), ak, "access key")) ||
		    (rc = sl_copy_arg(c->secret_key, sizeof(c->secret_key), sk, "secret key")) ||
		    (rc = sl_copy_arg(c->session_token, sizeof(c->session_token),
				      args->session_token ? args->session_token : "", "session token")))
			return rc;
		c->cred_source = "arguments";
	} else if ((ak = sl_env(env, ctx, "AWS_ACCESS_KEY_ID")) && (sk = sl_env(env, ctx, "AWS_SECRET_ACCESS_KEY"))) {
		v = sl_env(env, ctx, "AWS_SESSION_TOKEN");
		if ((rc = sl_copy_arg(c->access_key, sizeof(c->access_key), ak, "AWS_ACCESS_KEY_ID")) ||
		    (rc = sl_copy_arg(c->secret_key, sizeof(c->secret_key), sk, "AWS_SECRET_ACCESS_KEY")) ||
		    (rc = sl_copy_arg(c->session_token, sizeof(c->session_token), v ? v : "", "AWS_SESSION_TOKEN")))
			return rc;
		c->cred_source = "environment";
	}
	return 0;
}

/* The endpoint (arguments, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's, else AWS's for the region) and its addressing. */
static int sl_endpoint(struct sl__s3_conf *c, const struct sl__s3_args *args, sl__env_fn env, void *ctx,
		       const struct sl_profile *pr)
{
	const char *v = args->endpoint && *args->endpoint ? args->endpoint : sl_env(env, ctx, "AWS_ENDPOINT_URL_S3");
	size_t n;

	if (!v)
		v = sl_env(env, ctx, "AWS_ENDPOINT_URL");
	if (!v && pr->endpoint[0])
		v = pr->endpoint;
	if (v) {
		if (strncmp(v, "http://", 7) && strncmp(v, "https://", 8))
			return sl__err(SLUICE_EINVAL_CONFIG, "S3 endpoint '%s': want http://HOST[:PORT] or https://...", v);
		for (n = strlen(v); n > 8 && v[n - 1] == '/'; n--)
			;
		if (n >= sizeof(c->endpoint))
			return sl__err(SLUICE_EINVAL_CONFIG, "S3 endpoint longer than %zu characters", sizeof(c->endpoint) - 1);
		memcpy(c->endpoint, v, n);
		c->endpoint[n] = 0;
		c->path_style = 1; /* custom endpoints (MinIO, Ceph, ...) rarely have per-bucket host names */
	} else {
		snprintf(c->endpoint, sizeof(c->endpoint), "https://s3.%s.amazonaws.com", c->region);
	}
	if (!strcmp(pr->addressing, "path"))
		c->path_style = 1;
	else if (!strcmp(pr->addressing, "virtual"))
		c->path_style = 0;
	return 0;
}

int sl__s3_conf_resolve(struct sl__s3_conf *c, const struct sl__s3_args *args, sl__env_fn env, void *ctx)
{
	static const struct sl__s3_args none;
	struct sl_profile *pr = calloc(1, sizeof(*pr));
	char want_conf[160], cred_path[1024], conf_path[1024];
	const char *v;
	int rc;

	if (!pr)
		return -ENOMEM;
	if (!args)
		args = &none;
	memset(c, 0, sizeof(*c));
	v = args->profile && *args->profile ? args->profile : sl_env(env, ctx, "AWS_PROFILE");
	if ((rc = sl_copy_arg(c->profile, sizeof(c->profile), v ? v : "default", "profile name")))
		goto out;
	snprintf(want_conf, sizeof(want_conf), strcmp(c->profile, "default") ? "profile %s" : "%s", c->profile);
	pr->want_cred = c->profile;
	pr->want_conf = want_conf;
	sl_file_path(cred_path, sizeof(cred_path), env, ctx, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
	sl_file_path(conf_path, sizeof(conf_path), env, ctx, "AWS_CONFIG_FILE", "config");
	if ((rc = sl_creds(c, args, env, ctx)))
		goto out;
	/* The files: always read, for the region, endpoint and addressing. */
	if ((rc = sl__ini_file(cred_path, sl_profile_setting, pr)))
		goto out;
	sl_take_keys(c, pr, "credentials file");
	pr->in_config = 1;
	pr->access_key[0] = pr->secret_key[0] = pr->session_token[0] = 0;
	if ((rc = sl__ini_file(conf_path, sl_profile_setting, pr)))
		goto out;
	sl_take_keys(c, pr, "config file");
	if (!c->cred_source) {
		c->anonymous = 1;
		c->cred_source = "none";
	}
	v = args->region && *args->region ? args->region : sl_env(env, ctx, "AWS_REGION");
	if (!v)
		v = sl_env(env, ctx, "AWS_DEFAULT_REGION");
	if (!v)
		v = pr->region[0] ? pr->region : "us-east-1";
	if (!(rc = sl_copy_arg(c->region, sizeof(c->region), v, "region")))
		rc = sl_endpoint(c, args, env, ctx, pr);
out:
	if (rc) /* nothing half-resolved, secrets included, is left behind */
		memset(c, 0, sizeof(*c));
	memset(pr, 0, sizeof(*pr));
	free(pr);
	return rc;
}

int sl__is_s3_url(const char *path)
{
	return path && !strncmp(path, "s3://", 5);
}

int sl__s3_parse_url(const char *url, char *bucket, size_t bucket_cap, char *key, size_t key_cap)
{
	const char *b, *slash;
	size_t n;

	if (!sl__is_s3_url(url))
		return sl__err(SLUICE_EINVAL_CONFIG, "'%s' is not an s3://BUCKET/KEY URL", url ? url : "(null)");
	b = url + 5;
	slash = strchr(b, '/');
	n = slash ? (size_t)(slash - b) : strlen(b);
	/* Bucket names: 3-63 of a-z 0-9 . -, starting and ending with a letter or digit. */
	if (n < 3 || n > 63 || n >= bucket_cap)
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: a bucket name has 3 to 63 characters", url);
	for (size_t i = 0; i < n; i++) {
		char ch = b[i];
		int alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');

		if (!alnum && (ch != '.' && ch != '-'))
			return sl__err(SLUICE_EINVAL_CONFIG, "%s: a bucket name holds only a-z, 0-9, '.' and '-'", url);
		if (!alnum && (i == 0 || i == n - 1))
			return sl__err(SLUICE_EINVAL_CONFIG, "%s: a bucket name starts and ends with a letter or digit",
				       url);
	}
	memcpy(bucket, b, n);
	bucket[n] = 0;
	b = slash ? slash + 1 : b + n;
	n = strlen(b);
	if (n >= key_cap || n > 1024)
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: an object key has at most 1024 bytes", url);
	memcpy(key, b, n + 1);
	return 0;
}
