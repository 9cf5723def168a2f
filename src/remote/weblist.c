/*
 * A web server's listing of a directory (remote.h): the links of an HTML
 * page (nginx's autoindex, Apache's, Python's http.server, Caddy's "./"
 * ones) that name an entry of that directory.  The page is the server's: nothing in it is
 * trusted to stay inside the directory.
 */
#include <errno.h>
#include <string.h>

#include "remote/remote.h"

/*
 * 1 where href (len bytes) names an entry of the directory listed: a
 * relative link of one segment (a '/' only at its end: a directory), which
 * decoded (%XX) is not empty, ".", "..", and holds no '/', '\\' or NUL;
 * nor a scheme, a query or a fragment.
 */
static int sl_href_ok(const char *href, size_t len)
{
	size_t end = len && href[len - 1] == '/' ? len - 1 : len, n = 0, dots = 0;

	if (!end || len > 1024 || memchr(href, ':', len) || memchr(href, '?', len) || memchr(href, '#', len))
		return 0;
	for (size_t i = 0; i < end; i++, n++) {
		int v = (unsigned char)href[i];

		if (v == '%') {
			if ((v = sl__pct_byte(href + i, end - i)) < 0)
				return 0; /* a '%' that is no escape: not a link a server writes */
			i += 2;
		}
		if (v == '/' || v == '\\' || !v)
			return 0;
		dots += v == '.';
	}
	return !(n == dots && n <= 2);
}

int sl__web_links(const char *page, size_t len, int (*each)(void *arg, const char *href, size_t n, int dir),
		  void *arg)
{
	const char *p = page, *end = page + len;
	int rc = 0;

	while (!rc && (p = memmem(p, (size_t)(end - p), "href=\"", 6))) {
		const char *q;

		p += 6;
		if (!(q = memchr(p, '"', (size_t)(end - p))))
			break;
		if (q - p > 2 && p[0] == '.' && p[1] == '/') /* "./name", as Caddy writes it */
			p += 2;
		if (sl_href_ok(p, (size_t)(q - p)))
			rc = each(arg, p, (size_t)(q - p), q[-1] == '/');
		p = q + 1;
	}
	return rc;
}
