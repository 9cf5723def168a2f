/*
 * The settings file (core.h): SLUICE_* values that hold for every program
 * of one user on the machine, such as those `sluice tune` measured.  The
 * environment wins over the file; the file over the defaults.
 *
 * SLUICE_CONFIG names the file ("" for none); else it is
 * $XDG_CONFIG_HOME/sluice/sluice.conf or ~/.config/sluice/sluice.conf.
 * One section, [sluice], of keys named as the variables without SLUICE_,
 * in lower case:
 *
 *     [sluice]
 *     threads = 8
 *     max_transfer_size = 4M
 *
 * The file is read once per process, at the first setting asked for; a
 * file that does not parse sets nothing, and its error (file and what is
 * wrong) comes back from every sluice_config_new().
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"

static const char *const sl_keys[] = {
	"backend",	"direct",	  "staging",	    "threads",	      "queue_depth", "max_transfer_size",
	"buffer_pool_size", "device_ids", "sqpoll",	    "gpu",	      "s3_retries",  "s3_part_size",
	"s3_concurrency", "cache_dir",	  "cache_limit",    "stats",	      "trace",
	"metrics_port", "run_dir", "decode", "nvcomp_lib", "enable_p2p", "http_retries", NULL,
};
#define SL_NKEYS (sizeof(sl_keys) / sizeof(sl_keys[0]) - 1)

static pthread_once_t sl_once = PTHREAD_ONCE_INIT;
static char sl_path[4096];
static char *sl_vals[SL_NKEYS];
static int sl_rc;
static char sl_detail[1024];

static int sl_key_index(const char *key)
{
	for (unsigned i = 0; i < SL_NKEYS; i++)
		if (!strcasecmp(key, sl_keys[i]))
			return (int)i;
	return -1;
}

int sluice_settings_path(char *buf, size_t cap)
{
	const char *e = getenv("SLUICE_CONFIG"), *base;
	int n;

	if (e)
		n = *e ? snprintf(buf, cap, "%s", e) : -1;
	else if ((base = getenv("XDG_CONFIG_HOME")) && *base)
		n = snprintf(buf, cap, "%s/sluice/sluice.conf", base);
	else if ((base = getenv("HOME")) && *base)
		n = snprintf(buf, cap, "%s/.config/sluice/sluice.conf", base);
	else
		n = -1;
	if (n < 0)
		return -ENOENT;
	return (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

static int sl_take(const char *section, const char *key, const char *value, void *ctx)
{
	int i = sl_key_index(key);

	(void)ctx;
	if (strcmp(section, "sluice"))
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: section [%s]: the file has one section, [sluice]", sl_path,
			       section);
	if (i < 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: '%s' is not a setting (a SLUICE_* variable's name without SLUICE_, as threads)",
			       sl_path, key);
	free(sl_vals[i]);
	sl_vals[i] = strdup(value);
	return sl_vals[i] ? 0 : -ENOMEM;
}

static void sl_load(void)
{
	if (sluice_settings_path(sl_path, sizeof(sl_path))) {
		sl_path[0] = 0;
		return;
	}
	sl_rc = sl__ini_file(sl_path, sl_take, NULL);
	if (!sl_rc)
		return;
	snprintf(sl_detail, sizeof(sl_detail), "%s", sluice_last_error_detail());
	for (unsigned i = 0; i < SL_NKEYS; i++) {
		free(sl_vals[i]);
		sl_vals[i] = NULL;
	}
}

const char *sl__setting(const char *name)
{
	const char *v = getenv(name);
	int i;

	if (v || strncmp(name, "SLUICE_", 7))
		return v;
	pthread_once(&sl_once, sl_load);
	i = sl_key_index(name + 7);
	return i < 0 ? NULL : sl_vals[i];
}

const char *sl__setting_from(const char *name)
{
	if (getenv(name))
		return "the environment";
	pthread_once(&sl_once, sl_load);
	return sl_path;
}

int sl__settings_check(void)
{
	pthread_once(&sl_once, sl_load);
	return sl_rc ? sl__err(sl_rc, "%s", sl_detail) : 0;
}
