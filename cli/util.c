/*
 * The subcommands' shared helpers (cli.h): option parsing, errors, JSON
 * strings, opening a dataset.  main.c only dispatches.
 */
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
