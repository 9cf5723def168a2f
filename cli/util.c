/*
 * The subcommands' shared helpers (cli.h): option parsing, errors, JSON
 * strings, opening a dataset.  main.c only dispatches.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cli_fail(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "sluice %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

int cli_size(const char *cmd, const char *opt, const char *v, uint64_t *out)
{
	if (!v || sluice_parse_size(v, out))
		return cli_fail(cmd, "%s: '%s' is not a size (digits with an optional K, M, G or T suffix)", opt,
				v ? v : "");
	return 0;
}

int cli_uint(const char *cmd, const char *opt, const char *v, unsigned lo, unsigned hi, unsigned *out)
{
	char *end;
	unsigned long x;

	if (!v || !*v || *v == '-')
		return cli_fail(cmd, "%s: '%s' is not a number", opt, v ? v : "");
	x = strtoul(v, &end, 10);
	if (*end)
		return cli_fail(cmd, "%s: '%s' is not a number", opt, v);
	if (x < lo || x > hi)
		return cli_fail(cmd, "%s: %lu is outside %u..%u", opt, x, lo, hi);
	*out = (unsigned)x;
	return 0;
}

const char *cli_shown(const char *path)
{
	static char buf[4][1024];
	static unsigned next;
	char *b = buf[next++ % 4];

	sluice_url_redact(path, b, sizeof(buf[0]));
	return b;
}

int cli_error(const char *cmd, const char *what, long code)
{
	const char *d = sluice_last_error_detail();
	const char *shown = cli_shown(what);

	/* Named as the library's messages name it (no password, no query), and once: the detail may name it already. */
	if (*d && strstr(d, shown))
		fprintf(stderr, "sluice %s: %s: %s\n", cmd, sluice_strerror((int)code), d);
	else
		fprintf(stderr, "sluice %s: %s: %s%s%s\n", cmd, shown, sluice_strerror((int)code), *d ? ": " : "", d);
	return 1;
}

int cli_evict(const char *const *paths, unsigned n, char *why, size_t cap)
{
	int cold = 1;

	why[0] = 0;
	for (unsigned i = 0; i < n; i++) {
		char w[256];
		uint64_t left = 0;
		int rc = sluice_page_cache_evict(paths[i], &left, w, sizeof(w));

		if (rc == -ENOENT)
			continue;
		if (rc && cold)
			snprintf(why, cap, "%s: %s", sluice_strerror(rc), sluice_last_error_detail());
		else if (w[0] && cold)
			snprintf(why, cap, "%s: %.1f MB still cached: %s", cli_shown(paths[i]), (double)left / 1e6, w);
		cold &= !rc && !w[0];
	}
	return cold;
}

int cli_open_dataset(const char *cmd, int argc, char **argv, const char *usage, const char *opt,
		     const char **opt_val, int *json, const char **path, struct sluice_dataset **ds)
{
	int rc;

	*path = NULL;
	*ds = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			*json = 1;
		} else if (opt && !strcmp(argv[i], opt)) {
			if (i + 1 >= argc)
				return cli_fail(cmd, "%s needs a value", opt);
			*opt_val = argv[++i];
		} else if (!strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return -1;
		} else if (argv[i][0] == '-') {
			return cli_fail(cmd, "unknown option '%s'", argv[i]);
		} else if (*path) {
			return cli_fail(cmd, "more than one DATASET given");
		} else {
			*path = argv[i];
		}
	}
	if (!*path)
		return cli_fail(cmd, "no DATASET given");
	rc = sluice_dataset_open(ds, *path);
	return rc ? cli_error(cmd, *path, rc) : 0;
}

/* Bytes of the UTF-8 sequence at s (1-4), or 0 where s holds none (a stray byte, an overlong or cut one). */
static int cli_utf8_len(const unsigned char *s)
{
	int n = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
									      : s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : 0;

	for (int i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((n == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (n == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
	    (n == 4 && s[0] == 0xf0 && s[1] < 0x90) || (n == 4 && s[0] == 0xf4 && s[1] >= 0x90))
		return 0; /* overlong, a surrogate, past U+10FFFF */
	return n;
}

/* A JSON string of s whatever its bytes: a byte that is not UTF-8 (a setting's value can be any) is U+FFFD. */
void cli_json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *u = (const unsigned char *)s; *u;) {
		int n = cli_utf8_len(u);

		if (*u == '"' || *u == '\\')
			printf("\\%c", *u);
		else if (*u < 0x20 || *u == 0x7f)
			printf("\\u%04x", *u);
		else if (n)
			fwrite(u, 1, (size_t)n, stdout);
		else
			fputs("\\ufffd", stdout);
		u += n ? n : 1;
	}
	putchar('"');
}

const char *cli_python_env(const char *cmd, char *dir, size_t cap)
{
	char exe[PATH_MAX], p[PATH_MAX + 64], pp[2 * PATH_MAX + 64];
	const char *py = sluice_setting("SLUICE_PYTHON"), *old = getenv("PYTHONPATH");
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0) {
		cli_fail(cmd, "cannot find its own program (/proc/self/exe)");
		return NULL;
	}
	exe[n] = 0;
	snprintf(dir, cap, "%s", exe);
	*strrchr(dir, '/') = 0;
	setenv("SLUICE_BIN", exe, 0);
	snprintf(p, sizeof(p), "%s/libsluice.so", dir);
	if (!access(p, R_OK))
		setenv("SLUICE_LIB", p, 0);
	/*
	 * From a build tree, the package beside it; from a wheel's package (sluice/_bin/sluice run by its own path,
	 * not through the entry point), the folder that package is in; otherwise the one pip put on the Python's path.
	 */
	snprintf(p, sizeof(p), "%s/../python/sluice/__init__.py", dir);
	if (!access(p, R_OK)) {
		snprintf(pp, sizeof(pp), "%s/../python%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
		setenv("PYTHONPATH", pp, 1);
		return py && *py ? py : "python3";
	}
	/* Last on the path: what the user's PYTHONPATH names comes first. */
	snprintf(p, sizeof(p), "%s/../__init__.py", dir);
	if (!access(p, R_OK)) {
		snprintf(pp, sizeof(pp), "%s%s%s/../..", old && *old ? old : "", old && *old ? ":" : "", dir);
		setenv("PYTHONPATH", pp, 1);
	}
	return py && *py ? py : "python3";
}
