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

/* ---- --json: every failure is a JSON object on stdout too (cli.h) */

int cli_json_mode;
static const char *cli_json_inner; /* NULL: no object open; else what closes what is open inside the command's */
static int cli_json_said;          /* a whole document is out (the command's, or an error): nothing more */

/*
 * The error as JSON on stdout, once, where --json was given: inside the command's open object (what is open in it
 * closed first), else an object of its own.  status: the exit status; code: sluice's or -errno; line: what stderr
 * said, "sluice CMD: ..."
 */
static void cli_json_error(const char *cmd, int status, int code, const char *detail, const char *line)
{
	const char *name = sluice_error_name(code);

	if (!cli_json_mode || cli_json_said)
		return;
	if (cli_json_inner)
		printf("%s,\"error\":{\"command\":", cli_json_inner);
	else
		printf("{\"error\":{\"command\":");
	cli_json_str(cmd);
	printf(",\"status\":%d,\"code\":%d,\"name\":", status, code);
	cli_json_str(name);
	printf(",\"message\":");
	cli_json_str(sluice_strerror(code));
	printf(",\"detail\":");
	cli_json_str(detail);
	printf(",\"text\":");
	cli_json_str(line);
	printf("}}\n");
	fflush(stdout);
	cli_json_said = 1;
}

void cli_json_open(const char *inner)
{
	cli_json_inner = inner;
}

void cli_json_close(void)
{
	if (cli_json_inner && !cli_json_said)
		printf("%s}\n", cli_json_inner);
	cli_json_inner = NULL;
	cli_json_said = 1;
}

int cli_json_end(const char *cmd, int status)
{
	char line[256];

	/* A failure that printed neither its document nor an error through these helpers still says it failed. */
	if (status && cli_json_mode && !cli_json_said) {
		snprintf(line, sizeof(line), "sluice %s: failed (exit status %d): what it said is on stderr", cmd, status);
		cli_json_error(cmd, status, -EIO, "", line);
	}
	return status;
}

static int cli_vfail(const char *cmd, int status, int code, const char *fmt, va_list ap)
{
	char line[8192];
	int n = snprintf(line, sizeof(line), *cmd ? "sluice %s: " : "sluice: ", cmd);

	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	fprintf(stderr, "%s\n", line);
	line[strcspn(line, "\n")] = 0; /* JSON gets the message, not the usage text some append after it */
	cli_json_error(cmd, status, code, line + n, line);
	return status;
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = cli_vfail(cmd, 2, -EINVAL, fmt, ap);
	va_end(ap);
	return rc;
}

int cli_failed(const char *cmd, int status, int code, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = cli_vfail(cmd, status, code, fmt, ap);
	va_end(ap);
	return rc;
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
	char d[4096], line[8192];
	const char *shown = cli_shown(what);

	/* Copied first: the detail is valid until the thread's next call into the library. */
	snprintf(d, sizeof(d), "%s", sluice_last_error_detail());
	/* Named as the library's messages name it (no password, no query), and once: the detail may name it already. */
	if (*d && strstr(d, shown))
		snprintf(line, sizeof(line), "sluice %s: %s: %s", cmd, sluice_strerror((int)code), d);
	else
		snprintf(line, sizeof(line), "sluice %s: %s: %s%s%s", cmd, shown, sluice_strerror((int)code), *d ? ": " : "",
			 d);
	fprintf(stderr, "%s\n", line);
	cli_json_error(cmd, 1, (int)code, d, line);
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

/* JSON's grammar (RFC 8259) over s from *p, at most depth levels down: 0, or -1 where s is not JSON there. */
static int cli_json_value(const char *s, size_t *p, int depth);

static void cli_json_ws(const char *s, size_t *p)
{
	while (s[*p] == ' ' || s[*p] == '\t' || s[*p] == '\n' || s[*p] == '\r')
		++*p;
}

static int cli_json_string(const char *s, size_t *p)
{
	if (s[(*p)++] != '"')
		return -1;
	for (;;) {
		unsigned char c = (unsigned char)s[*p];
		int n = cli_utf8_len((const unsigned char *)s + *p);

		if (c == '"')
			return ++*p, 0;
		if (c < 0x20 || !n)
			return -1;
		if (c == '\\') {
			c = (unsigned char)s[++*p];
			if (c == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!strchr("0123456789abcdefABCDEF", s[*p + i]) || !s[*p + i])
						return -1;
				*p += 4;
			} else if (!c || !strchr("\"\\/bfnrt", c)) {
				return -1;
			}
			++*p;
			continue;
		}
		*p += (size_t)n;
	}
}

static int cli_json_number(const char *s, size_t *p)
{
	size_t d;

	if (s[*p] == '-')
		++*p;
	if (s[*p] == '0')
		++*p;
	else if ((d = strspn(s + *p, "0123456789")))
		*p += d;
	else
		return -1;
	if (s[*p] == '.') {
		if (!(d = strspn(s + ++*p, "0123456789")))
			return -1;
		*p += d;
	}
	if (s[*p] == 'e' || s[*p] == 'E') {
		if (s[++*p] == '+' || s[*p] == '-')
			++*p;
		if (!(d = strspn(s + *p, "0123456789")))
			return -1;
		*p += d;
	}
	return 0;
}

static int cli_json_value(const char *s, size_t *p, int depth)
{
	char open, close;

	cli_json_ws(s, p);
	open = s[*p];
	close = open == '{' ? '}' : ']';
	if (open == '"')
		return cli_json_string(s, p);
	if (!strncmp(s + *p, "true", 4) || !strncmp(s + *p, "null", 4))
		return *p += 4, 0;
	if (!strncmp(s + *p, "false", 5))
		return *p += 5, 0;
	if (open != '{' && open != '[')
		return cli_json_number(s, p);
	if (!depth)
		return -1;
	++*p;
	cli_json_ws(s, p);
	if (s[*p] == close)
		return ++*p, 0;
	for (;;) {
		if (open == '{') {
			cli_json_ws(s, p);
			if (cli_json_string(s, p))
				return -1;
			cli_json_ws(s, p);
			if (s[(*p)++] != ':')
				return -1;
		}
		if (cli_json_value(s, p, depth - 1))
			return -1;
		cli_json_ws(s, p);
		if (s[*p] == close)
			return ++*p, 0;
		if (s[(*p)++] != ',')
			return -1;
	}
}

int cli_json_valid(const char *s)
{
	size_t p = 0;

	if (cli_json_value(s, &p, 64))
		return 0;
	cli_json_ws(s, &p);
	return !s[p];
}
