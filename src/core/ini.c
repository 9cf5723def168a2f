/*
 * INI files (core.h): the AWS shared credentials and config files, and
 * sluice's own settings file.  Error details name the file and line, never
 * a value (values may be secrets).  The text is UTF-8: a byte-order mark
 * at its start is skipped (editors write one); any other byte that is not
 * UTF-8 is an error naming its line and column, a UTF-16 file named so.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

#define SL_INI_MAX (1u << 20) /* bytes of a config file read at most */

static int sl_space(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r';
}

/* [a, b) without surrounding white space, into out (cap bytes); 0 or -1 if it does not fit. */
static int sl_trim_copy(const char *a, const char *b, char *out, size_t cap)
{
	while (a < b && sl_space(*a))
		a++;
	while (b > a && sl_space(b[-1]))
		b--;
	if ((size_t)(b - a) >= cap)
		return -1;
	memcpy(out, a, (size_t)(b - a));
	out[b - a] = 0;
	return 0;
}

/* Bytes of the UTF-8 sequence at s (1-4, within n), or 0 where s holds none (a stray byte, an overlong or cut one). */
static size_t sl_utf8_len(const unsigned char *s, size_t n)
{
	size_t k = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
								 : s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : 0;

	if (k > n)
		return 0;
	for (size_t i = 1; i < k; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((k == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (k == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
	    (k == 4 && s[0] == 0xf0 && s[1] < 0x90) || (k == 4 && s[0] == 0xf4 && s[1] >= 0x90))
		return 0; /* overlong, a surrogate, past U+10FFFF */
	return k;
}

/* The line [s, e) is UTF-8 text: 0, or the error naming file, line and the first byte that is not. */
static int sl_line_utf8(const char *s, const char *e, const char *name, unsigned line, int first)
{
	for (const char *c = s; c < e;) {
		size_t k = sl_utf8_len((const unsigned char *)c, (size_t)(e - c));

		if (k) {
			c += k;
			continue;
		}
		/* A file saved as UTF-16 (Windows' "Unicode") starts with its byte-order mark: say so. */
		if (first && c == s && e - s >= 2 && ((unsigned char)s[0] == 0xff || (unsigned char)s[0] == 0xfe) &&
		    (unsigned char)s[1] == ((unsigned char)s[0] ^ 0x01))
			return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: the file is UTF-16 (it starts with its byte-order "
				       "mark): save it as UTF-8", name, line);
		return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: byte 0x%02x at column %zu is not UTF-8 (save the file as "
			       "UTF-8)", name, line, (unsigned char)*c, (size_t)(c - s) + 1);
	}
	return 0;
}

int sl__ini_parse(const char *text, size_t len, const char *name,
		  int (*fn)(const char *section, const char *key, const char *value, void *ctx), void *ctx)
{
	char section[256] = "", block[128] = "", key[256], full[400], value[4096];
	const char *p = text, *end = text + len;
	unsigned line = 0;

	/* A UTF-8 byte-order mark, as some editors write one (Notepad): not part of the first line. */
	if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
		p += 3;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end, *s = p;
		int indented = s < e && sl_space(*s);
		const char *eq;
		int rc;

		p = nl ? nl + 1 : end;
		line++;
		if ((rc = sl_line_utf8(s, e, name, line, line == 1)))
			return rc;
		while (s < e && sl_space(*s))
			s++;
		if (s == e || *s == '#' || *s == ';')
			continue;
		if (memchr(s, 0, (size_t)(e - s)))
			return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: a NUL byte in the line", name, line);
		if (*s == '[') {
			const char *close = e;

			while (close > s && sl_space(close[-1]))
				close--;
			if (close - s < 2 || close[-1] != ']' || sl_trim_copy(s + 1, close - 1, section, sizeof(section)))
				return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: a section header is [NAME], up to 255 characters",
					       name, line);
			block[0] = 0;
			continue;
		}
		eq = memchr(s, '=', (size_t)(e - s));
		if (!eq)
			return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: the line is neither [section] nor key = value", name,
				       line);
		if (sl_trim_copy(s, eq, key, sizeof(key)) || !key[0] || sl_trim_copy(eq + 1, e, value, sizeof(value)))
			return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: a key of 1-255 characters, a value under 4096", name,
				       line);
		if (!section[0])
			return sl__err(SLUICE_EINVAL_CONFIG, "%s:%u: a setting before any [section]", name, line);
		/* "s3 =" with nothing after it opens a block of indented settings. */
		if (indented && block[0]) {
			snprintf(full, sizeof(full), "%s.%s", block, key);
		} else {
			snprintf(full, sizeof(full), "%s", key);
			block[0] = 0;
			if (!value[0] && strlen(key) < sizeof(block)) {
				memcpy(block, key, strlen(key) + 1);
				continue;
			}
		}
		rc = fn(section, full, value, ctx);
		if (rc)
			return rc;
	}
	return 0;
}


int sl__ini_file(const char *path, int (*fn)(const char *section, const char *key, const char *value, void *ctx),
		 void *ctx)
{
	struct stat st;
	char *buf;
	ssize_t got;
	int fd = sl__open_file(path, O_RDONLY, 0), rc;

	if (fd == -ENOENT || fd == -ENOTDIR) {
		sl__err_clear();
		return 0;
	}
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > SL_INI_MAX) {
		close(fd);
		return sl__err(SLUICE_EINVAL_CONFIG, "%s: not a regular file of at most %u bytes", path, SL_INI_MAX);
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	got = read(fd, buf, (size_t)st.st_size);
	rc = got < 0 ? sl__err(-errno, "%s: %s", path, strerror(errno))
		     : sl__ini_parse(buf, (size_t)got, path, fn, ctx);
	/* The buffer may hold secrets: clear it before it goes back to the allocator. */
	memset(buf, 0, (size_t)st.st_size);
	free(buf);
	close(fd);
	return rc;
}

/* Is the line [s, e) the header of section (case as written)? */
static int sl_is_section(const char *s, const char *e, const char *section)
{
	char name[256];
	const char *close = e;

	while (s < e && sl_space(*s))
		s++;
	while (close > s && sl_space(close[-1]))
		close--;
	return close - s >= 2 && *s == '[' && close[-1] == ']' && !sl_trim_copy(s + 1, close - 1, name, sizeof(name)) &&
	       !strcmp(name, section);
}

/* Is the line [s, e) "key = ..." for one of keys[0..n), or a note of the writer's ("# " note_tag)? */
static int sl_is_replaced(const char *s, const char *e, const char *const *keys, unsigned n, const char *note_tag)
{
	const char *eq = memchr(s, '=', (size_t)(e - s));
	char key[256];

	while (s < e && sl_space(*s))
		s++;
	if (*s == '#')
		return note_tag && (size_t)(e - s) > strlen(note_tag) + 2 && !strncmp(s + 2, note_tag, strlen(note_tag));
	if (!eq || sl_trim_copy(s, eq, key, sizeof(key)))
		return 0;
	for (unsigned i = 0; i < n; i++)
		if (!strcasecmp(key, keys[i]))
			return 1;
	return 0;
}

/* What the update checks the rewritten text against: each key reads back as its value. */
struct sl_readback {
	const char *section;
	const char *const *keys, *const *vals;
	unsigned n, seen;
};

static int sl_readback(const char *section, const char *key, const char *value, void *ctx)
{
	struct sl_readback *r = ctx;

	for (unsigned i = 0; i < r->n; i++)
		if (!strcmp(section, r->section) && !strcasecmp(key, r->keys[i]))
			r->seen |= (unsigned)!strcmp(value, r->vals[i]) << i;
	return 0;
}

int sl__ini_update(const char *path, const char *section, const char *const *keys, const char *const *vals,
		   unsigned n, const char *note, const char *note_tag)
{
	char tmp[4200], *old = NULL;
	size_t len = 0, cap = 0;
	FILE *in = NULL, *out;
	struct sl_readback rb = { section, keys, vals, n, 0 };
	int placed = 0, in_sec = 0, rc = 0, fd;

	if (n > 16)
		return sl__err(-EINVAL, "%s: at most 16 settings at once", path);
	/* A file to update must be a regular one: a FIFO there would hold fgets forever. */
	fd = sl__open_file(path, O_RDONLY, 0);
	if (fd >= 0 && !(in = fdopen(fd, "r"))) {
		close(fd);
		return -ENOMEM;
	}
	if (fd < 0 && fd != -ENOENT)
		return fd;
	sl__err_clear();
	for (char buf[4096]; in && fgets(buf, sizeof(buf), in);) {
		if (sl__reserve(&old, &cap, len + strlen(buf) + 1)) {
			fclose(in);
			free(old);
			return -ENOMEM;
		}
		memcpy(old + len, buf, strlen(buf) + 1);
		len += strlen(buf);
	}
	if (in)
		fclose(in);
	snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
	if (!(out = fopen(tmp, "we"))) {
		free(old);
		return sl__err(-errno, "%s: cannot write: %s", tmp, strerror(errno));
	}
	for (const char *p = old, *end = old + len; p && p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end;
		/* The first line after a byte-order mark, as the reader reads it (the mark itself is kept). */
		const char *q = p == old && len >= 3 && !memcmp(p, "\xef\xbb\xbf", 3) ? p + 3 : p;
		int header = sl_is_section(q, e, section), other = !header && *(q + strspn(q, " \t")) == '[';

		in_sec = header ? 1 : other ? 0 : in_sec;
		if (!(in_sec && !header && sl_is_replaced(q, e, keys, n, note_tag)))
			fprintf(out, "%.*s\n", (int)(e - p), p);
		if (header && !placed++) {
			fprintf(out, "# %s\n", note);
			for (unsigned i = 0; i < n; i++)
				fprintf(out, "%s = %s\n", keys[i], vals[i]);
		}
		p = nl ? nl + 1 : end;
	}
	if (!placed) {
		fprintf(out, "[%s]\n# %s\n", section, note);
		for (unsigned i = 0; i < n; i++)
			fprintf(out, "%s = %s\n", keys[i], vals[i]);
	}
	free(old);
	if (fflush(out) || fsync(fileno(out)))
		rc = sl__err(-errno, "%s: %s", tmp, strerror(errno));
	if (fclose(out) && !rc)
		rc = sl__err(-errno, "%s: %s", tmp, strerror(errno));
	/* What was written reads back, through the reader, as meant; only then does it replace the file. */
	if (!rc && (rc = sl__ini_file(tmp, sl_readback, &rb)) == 0 && rb.seen != (1u << n) - 1)
		rc = sl__err(SLUICE_EINVAL_CONFIG, "%s: a value did not read back as written", path);
	if (!rc && rename(tmp, path))
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
	if (rc)
		unlink(tmp);
	return rc;
}
