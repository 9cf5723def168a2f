/*
 * ListObjectsV2 answers, parsed by expat: the objects (key, size, ETag)
 * and common prefixes of one page, and the token of the next.  The bytes
 * come from the network: every text is bounded, and the fuzzer
 * (tests/fuzz/fuzz_remote.c) feeds this parser directly.
 */
#include <errno.h>
#include <expat.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote.h"

struct sl_lp {
	XML_Parser p;
	struct sl__s3_list *l;
	char *token;
	size_t token_cap;
	int depth, in_contents, in_prefixes, err;
	char text[2048];
	size_t len;
	int truncated;
	struct sl__s3_entry cur;
};

static void sl_lp_stop(struct sl_lp *lp, int err)
{
	if (!lp->err)
		lp->err = err;
	XML_StopParser(lp->p, XML_FALSE);
}

static void XMLCALL sl_lp_start(void *arg, const XML_Char *name, const XML_Char **attr)
{
	struct sl_lp *lp = arg;

	(void)attr;
	lp->depth++;
	lp->len = 0;
	if (lp->depth == 2 && !strcmp(name, "Contents")) {
		lp->in_contents = 1;
		memset(&lp->cur, 0, sizeof(lp->cur));
	} else if (lp->depth == 2 && !strcmp(name, "CommonPrefixes")) {
		lp->in_prefixes = 1;
		memset(&lp->cur, 0, sizeof(lp->cur));
		lp->cur.is_prefix = 1;
	}
}

static void XMLCALL sl_lp_text(void *arg, const XML_Char *s, int n)
{
	struct sl_lp *lp = arg;

	if (lp->len + (size_t)n >= sizeof(lp->text)) {
		sl_lp_stop(lp, SLUICE_EFORMAT);
		return;
	}
	memcpy(lp->text + lp->len, s, (size_t)n);
	lp->len += (size_t)n;
}

static int sl_lp_add(struct sl_lp *lp)
{
	struct sl__s3_list *l = lp->l;

	if (!lp->cur.key)
		return SLUICE_EFORMAT;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct sl__s3_entry *e = realloc(l->e, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		l->e = e;
		l->cap = cap;
	}
	l->e[l->n++] = lp->cur;
	lp->cur.key = NULL;
	return 0;
}

static void XMLCALL sl_lp_end(void *arg, const XML_Char *name)
{
	struct sl_lp *lp = arg;
	char *end;
	int rc = 0;

	lp->text[lp->len] = 0;
	if (lp->depth == 3 && (lp->in_contents || lp->in_prefixes)) {
		if (!strcmp(name, lp->in_contents ? "Key" : "Prefix")) {
			free(lp->cur.key);
			if (!(lp->cur.key = strdup(lp->text)))
				rc = -ENOMEM;
		} else if (lp->in_contents && !strcmp(name, "Size")) {
			lp->cur.size = strtoull(lp->text, &end, 10);
			if (!lp->len || *end)
				rc = SLUICE_EFORMAT;
		} else if (lp->in_contents && !strcmp(name, "ETag")) {
			if (lp->len >= sizeof(lp->cur.etag))
				rc = SLUICE_EFORMAT;
			else
				memcpy(lp->cur.etag, lp->text, lp->len + 1);
		}
	} else if (lp->depth == 2 && (lp->in_contents || lp->in_prefixes)) {
		rc = sl_lp_add(lp);
		lp->in_contents = lp->in_prefixes = 0;
	} else if (lp->depth == 2 && !strcmp(name, "IsTruncated")) {
		lp->truncated = !strcmp(lp->text, "true");
	} else if (lp->depth == 2 && !strcmp(name, "NextContinuationToken")) {
		if (lp->len >= lp->token_cap)
			rc = SLUICE_EFORMAT;
		else
			memcpy(lp->token, lp->text, lp->len + 1);
	}
	lp->len = 0;
	lp->depth--;
	if (rc)
		sl_lp_stop(lp, rc);
}

int sl__s3_list_parse(const char *xml, size_t len, struct sl__s3_list *l, char *token, size_t token_cap)
{
	struct sl_lp lp = { .l = l, .token = token, .token_cap = token_cap };
	int ok;

	token[0] = 0;
	if (len > INT32_MAX)
		return sl__err(SLUICE_EFORMAT, "a listing of %zu bytes", len);
	if (!(lp.p = XML_ParserCreate("UTF-8")))
		return -ENOMEM;
	XML_SetUserData(lp.p, &lp);
	XML_SetElementHandler(lp.p, sl_lp_start, sl_lp_end);
	XML_SetCharacterDataHandler(lp.p, sl_lp_text);
	ok = XML_Parse(lp.p, xml, (int)len, XML_TRUE) == XML_STATUS_OK;
	if (!ok && !lp.err)
		lp.err = sl__err(SLUICE_EFORMAT, "a listing that is not XML: %s at line %lu",
				 XML_ErrorString(XML_GetErrorCode(lp.p)), (unsigned long)XML_GetCurrentLineNumber(lp.p));
	else if (lp.err == SLUICE_EFORMAT)
		lp.err = sl__err(SLUICE_EFORMAT, "a listing with a malformed or oversized entry");
	else if (!lp.err && lp.truncated && !token[0])
		lp.err = sl__err(SLUICE_EFORMAT, "a truncated listing without a NextContinuationToken");
	if (!lp.truncated)
		token[0] = 0;
	free(lp.cur.key);
	XML_ParserFree(lp.p);
	return lp.err;
}

void sl__s3_list_free(struct sl__s3_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->e[i].key);
	free(l->e);
	memset(l, 0, sizeof(*l));
}
