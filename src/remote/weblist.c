/*
 * A web server's listing of a directory (remote.h): the links of an HTML
 * page (nginx's autoindex, Apache's, Python's http.server, Caddy's "./"
 * ones) that name an entry of that directory, read as a browser reads
 * them: the attribute's character references decoded (Apache writes
 * "a&amp;b.bin" for the file a&b.bin), then the URL's escapes.  The page is
 * the server's: nothing in it is trusted to stay inside the directory, and
 * every link handed on is rewritten in one canonical escaped form, so that
 * a name is one string however the page spelt it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "remote/remote.h"

/* The longest name of a file (NAME_MAX) and the longest attribute value looked at. */
#define SL_NAME_MAX 255
#define SL_HREF_MAX 8192

/*
 * What HTML's numeric references make of 128..159: windows-1252's
 * characters; 0 where it has none (the code point stays itself).
 */
static const unsigned short sl_c1[32] = {
	0x20ac, 0,	0x201a, 0x0192, 0x201e, 0x2026, 0x2020, 0x2021, 0x02c6, 0x2030, 0x0160,
	0x2039, 0x0152, 0,	0x017d, 0,	0,	0x2018, 0x2019, 0x201c, 0x201d, 0x2022,
	0x2013, 0x2014, 0x02dc, 0x2122, 0x0161, 0x203a, 0x0153, 0,	0x017e, 0x0178,
};

/* Code point c as UTF-8 at out (4 bytes of room); the bytes written. */
static size_t sl_utf8(unsigned long c, unsigned char *out)
{
	if (c < 0x80)
		return out[0] = (unsigned char)c, 1;
	if (c < 0x800)
		return out[0] = (unsigned char)(0xc0 | c >> 6), out[1] = (unsigned char)(0x80 | (c & 0x3f)), 2;
	if (c < 0x10000) {
		out[0] = (unsigned char)(0xe0 | c >> 12);
		out[1] = (unsigned char)(0x80 | (c >> 6 & 0x3f));
		out[2] = (unsigned char)(0x80 | (c & 0x3f));
		return 3;
	}
	out[0] = (unsigned char)(0xf0 | c >> 18);
	out[1] = (unsigned char)(0x80 | (c >> 12 & 0x3f));
	out[2] = (unsigned char)(0x80 | (c >> 6 & 0x3f));
	out[3] = (unsigned char)(0x80 | (c & 0x3f));
	return 4;
}

/*
 * The character reference at p[0, n) (p[0] is '&') decoded into out (4
 * bytes of room): *used the bytes of p it takes, the bytes written
 * returned; 0 where p holds none (the '&' is itself).  Named ones: amp,
 * lt, gt, quot, apos, with their ';' (in an attribute a browser decodes no
 * other without it); numeric ones decimal or hex, ';' optional, as HTML's
 * tokenizer takes them: 0, a surrogate or past U+10FFFF is U+FFFD, 128..159
 * windows-1252's.  Never more bytes out than it takes in.
 */
static size_t sl_charref(const char *p, size_t n, size_t *used, unsigned char *out)
{
	static const struct {
		const char *name;
		char c;
	} named[] = { { "amp;", '&' }, { "lt;", '<' }, { "gt;", '>' }, { "quot;", '"' }, { "apos;", '\'' } };
	unsigned long c = 0;
	size_t i, digits = 0;
	int hex;

	for (size_t k = 0; k < sizeof(named) / sizeof(named[0]); k++) {
		size_t l = strlen(named[k].name);

		if (n > l && !memcmp(p + 1, named[k].name, l)) {
			*used = 1 + l;
			out[0] = (unsigned char)named[k].c;
			return 1;
		}
	}
	if (n < 3 || p[1] != '#')
		return 0;
	hex = p[2] == 'x' || p[2] == 'X';
	for (i = 2 + (size_t)hex; i < n; i++, digits++) {
		int d = p[i] >= '0' && p[i] <= '9' ? p[i] - '0'
			: hex && (p[i] | 0x20) >= 'a' && (p[i] | 0x20) <= 'f' ? (p[i] | 0x20) - 'a' + 10 : -1;

		if (d < 0)
			break;
		if (c <= 0x10ffff) /* past it the value is U+FFFD whatever follows: no wrap */
			c = c * (hex ? 16 : 10) + (unsigned long)d;
	}
	if (!digits)
		return 0;
	*used = i + (i < n && p[i] == ';');
	if (c >= 0x80 && c <= 0x9f && sl_c1[c - 0x80])
		c = sl_c1[c - 0x80];
	else if (!c || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		c = 0xfffd;
	return sl_utf8(c, out);
}

/* 1 for the bytes a name keeps unescaped in its canonical form (RFC 3986's unreserved ones). */
static int sl_unreserved(unsigned char b)
{
	return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '-' || b == '.' ||
	       b == '_' || b == '~';
}

struct sl_link {
	char out[3 * SL_NAME_MAX + 2]; /* canonical: every byte of the name but unreserved ones as %XX; '/' for a directory */
	size_t n;
	int dir;
	const char *why; /* an entry whose name cannot be a file's: why (warned, skipped) */
};

/*
 * One link's attribute value v (vn bytes, as the page holds it) as a
 * browser reads it: character references decoded, then (the URL parser's
 * rules) white space and C0 controls at its ends cut, tabs and newlines in
 * it removed, '\\' a '/'.  1: an entry, l filled; 0: a link that names no
 * entry (navigation: "", ".", "..", "../"; absolute, another scheme or
 * host, a query, a fragment; a path below); -1: an entry whose name, its
 * %XX decoded, cannot be a file's name (l->why says why).
 */
static int sl_link_parse(const char *v, size_t vn, struct sl_link *l)
{
	char d[SL_HREF_MAX];
	unsigned char name[SL_NAME_MAX];
	size_t dn = 0, n = 0, dots = 0, at = 0, lo = 0;
	const char *slash, *colon;

	l->why = NULL;
	for (size_t i = 0; i < vn;) {
		unsigned char ref[4];
		size_t used = 1, k = v[i] == '&' ? sl_charref(v + i, vn - i, &used, ref) : 0;

		if (!k)
			ref[0] = (unsigned char)v[i], k = 1;
		for (size_t j = 0; j < k; j++)
			if (ref[j] != '\t' && ref[j] != '\n' && ref[j] != '\r')
				d[dn++] = (char)ref[j];
		i += used;
	}
	while (lo < dn && (unsigned char)d[lo] <= 0x20)
		lo++;
	while (dn > lo && (unsigned char)d[dn - 1] <= 0x20)
		dn--;
	for (size_t i = lo; i < dn; i++)
		if (d[i] == '\\') /* a browser reads it as '/': the file's name held one, unescaped */
			return l->why = "a '\\', which a browser reads as '/'", -1;
	slash = memchr(d + lo, '/', dn - lo);
	colon = memchr(d + lo, ':', dn - lo);
	if (colon && (!slash || colon < slash))
		return 0; /* another scheme */
	if (dn - lo > 2 && d[lo] == '.' && d[lo + 1] == '/') /* "./name", as Caddy (and Apache for names with ':') write */
		lo += 2, slash = memchr(d + lo, '/', dn - lo);
	if (dn == lo || d[lo] == '/' || memchr(d + lo, '?', dn - lo) || memchr(d + lo, '#', dn - lo))
		return 0; /* absolute, a query or a fragment */
	l->dir = d[dn - 1] == '/';
	if (slash && slash != d + dn - 1)
		return 0; /* a link further down, not an entry of this directory */
	dn -= (size_t)l->dir;
	for (size_t i = lo; i < dn; i++) {
		int b = (unsigned char)d[i];

		if (b == '%' && (b = sl__pct_byte(d + i, dn - i)) < 0)
			return l->why = "a '%' that is no escape", -1;
		i += d[i] == '%' ? 2 : 0;
		if (b == '/' || !b)
			return l->why = b ? "a '/' inside one name" : "a NUL byte", -1;
		if (n == SL_NAME_MAX)
			return l->why = "longer than a file name can be, 255 bytes", -1;
		dots += b == '.';
		name[n++] = (unsigned char)b;
	}
	if (n == dots && n <= 2)
		return 0; /* "", ".", "..": the directory itself or its parent */
	for (size_t j = 0; j < n; j++)
		at += sl_unreserved(name[j]) ? (size_t)snprintf(l->out + at, 2, "%c", name[j])
					     : (size_t)snprintf(l->out + at, 4, "%%%02X", name[j]);
	if (l->dir)
		l->out[at++] = '/';
	l->out[at] = 0;
	l->n = at;
	return 1;
}

/* The link as the page spelt it, for a warning: its first 120 bytes, each that is not printable ASCII as \xNN. */
static void sl_shown(const char *v, size_t n, char *out, size_t cap)
{
	size_t at = 0;

	for (size_t i = 0; i < n && i < 120 && at + 5 < cap; i++)
		at += (unsigned char)v[i] >= 0x20 && (unsigned char)v[i] < 0x7f && v[i] != '\\'
			      ? (size_t)snprintf(out + at, cap - at, "%c", v[i])
			      : (size_t)snprintf(out + at, cap - at, "\\x%02x", (unsigned char)v[i]);
	out[at] = 0;
}

static int sl_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f';
}

/*
 * The value of the href attribute at p (its name: "href" in any case, a
 * word of its own) into *v, *vn, and where the scan goes on; NULL where p
 * starts none.  Quoted by '"' or '\'', or unquoted up to white space or
 * '>'; an attribute left open ends the page.
 */
static const char *sl_href_at(const char *page, const char *p, const char *end, const char **v, size_t *vn)
{
	const char *q;

	if (end - p < 5 || strncasecmp(p, "href", 4) || (p > page && !sl_space(p[-1]) && p[-1] != '"' && p[-1] != '\''))
		return NULL;
	for (p += 4; p < end && sl_space(*p); p++)
		;
	if (p == end || *p != '=')
		return NULL;
	for (p++; p < end && sl_space(*p); p++)
		;
	if (p < end && (*p == '"' || *p == '\'')) {
		if (!(q = memchr(p + 1, *p, (size_t)(end - p - 1))))
			return *v = NULL, end;
		*v = p + 1;
	} else {
		for (q = *v = p; q < end && !sl_space(*q) && *q != '>'; q++)
			;
	}
	*vn = (size_t)(q - *v);
	return q;
}

int sl__web_links(const char *page, size_t len, const char *where,
		  int (*each)(void *arg, const char *href, size_t n, int dir), void *arg)
{
	const char *p = page, *end = page + len, *next, *v;
	size_t vn;
	int rc = 0;

	for (; !rc && p < end; p = next) {
		struct sl_link l;
		int r;

		if ((*p | 0x20) != 'h' || !(next = sl_href_at(page, p, end, &v, &vn))) {
			next = p + 1;
			continue;
		}
		if (!v)
			break;
		if (vn > SL_HREF_MAX) {
			sl__warn("http", "%s: its listing links to a name of %zu bytes, longer than any file's; skipped", where, vn);
			continue;
		}
		if ((r = sl_link_parse(v, vn, &l)) > 0) {
			rc = each(arg, l.out, l.n, l.dir);
		} else if (r < 0) {
			char shown[120 * 4 + 1];

			sl_shown(v, vn, shown, sizeof(shown));
			sl__warn("http", "%s: its listing links to \"%s\", which cannot be a file's name here (%s); skipped",
				 where, shown, l.why);
		}
	}
	return rc;
}
