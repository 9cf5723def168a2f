/*
 * Token packing: documents into rows of `context` tokens by best-fit
 * decreasing over a streaming window (or greedily, in arrival order).
 *
 * Documents gather in a window; when it is full they are placed longest
 * first, each into the open row with the least room that still holds it,
 * a new row when none does: within a window every row stays open, so a
 * larger window never packs worse for want of rows.  After a window, a row
 * is finished once no document seen so far is short enough to fit its room,
 * and beyond SL_OPEN rows the fullest are finished (what carries over to
 * the next window stays bounded).  Finished rows wait in a FIFO until the
 * caller takes them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define SL_OPEN 64

struct sl_row {
	int32_t *tok;
	uint32_t used, ndocs;
	int32_t *cu;          /* ndocs + 1 boundaries */
	struct sl_row *next;  /* finished FIFO or free list */
};

struct sl_doc {
	int32_t *tok;
	uint32_t len;
};

struct sluice_packer {
	struct sluice_packer_options opt;
	struct sl_doc *pending;
	size_t npending;
	struct sl_row **open;
	size_t nopen, open_cap;
	struct sl_row *done, **done_tail, *free_rows;
	uint32_t min_len;     /* shortest document seen */
	uint64_t tokens, capacity;
	int32_t *out;         /* the row handed out: 4 arrays of context (+1) entries */
};

int sluice_packer_new(struct sluice_packer **out, const struct sluice_packer_options *opt)
{
	struct sluice_packer_options o;
	struct sluice_packer *p;
	int rc;

	*out = NULL;
	sl__err_clear();
	if ((rc = SL_SIZED_IN(&o, opt, packer_options)))
		return rc;
	opt = &o;
	if (!opt->context || opt->context > (1u << 24))
		return sl__err(SLUICE_EINVAL_CONFIG, "packer: context %u is outside 1..16M tokens", opt->context);
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->opt = *opt;
	if (!p->opt.window || p->opt.greedy)
		p->opt.window = p->opt.greedy ? 1 : 1024;
	if (!p->opt.ignore_index && !p->opt.ignore_index_set)
		p->opt.ignore_index = -100;
	p->pending = calloc(p->opt.window, sizeof(*p->pending));
	p->out = malloc((4 * (size_t)p->opt.context + 1) * sizeof(int32_t));
	if (!p->pending || !p->out) {
		sluice_packer_free(p);
		return -ENOMEM;
	}
	p->done_tail = &p->done;
	p->min_len = UINT32_MAX;
	*out = p;
	return 0;
}

static void sl_finish(struct sluice_packer *p, size_t i)
{
	struct sl_row *r = p->open[i];

	p->open[i] = p->open[--p->nopen];
	r->next = NULL;
	*p->done_tail = r;
	p->done_tail = &r->next;
}

static struct sl_row *sl_new_row(struct sluice_packer *p)
{
	struct sl_row *r = p->free_rows;

	if (r) {
		p->free_rows = r->next;
	} else {
		r = calloc(1, sizeof(*r));
		if (!r)
			return NULL;
		r->tok = malloc(p->opt.context * sizeof(int32_t));
		r->cu = malloc(((size_t)p->opt.context + 1) * sizeof(int32_t));
		if (!r->tok || !r->cu) {
			free(r->tok);
			free(r->cu);
			free(r);
			return NULL;
		}
	}
	r->used = r->ndocs = 0;
	r->cu[0] = 0;
	if (sl__reserve(&p->open, &p->open_cap, (p->nopen + 1) * sizeof(*p->open))) {
		r->next = p->free_rows;
		p->free_rows = r;
		return NULL;
	}
	p->open[p->nopen++] = r;
	return r;
}

static int sl_cmp_len(const void *a, const void *b)
{
	const struct sl_doc *x = a, *y = b;

	return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

/* Places the gathered documents (see the top of the file). */
static int sl_place(struct sluice_packer *p)
{
	const uint32_t L = p->opt.context;

	if (!p->opt.greedy)
		qsort(p->pending, p->npending, sizeof(*p->pending), sl_cmp_len);
	for (size_t k = 0; k < p->npending; k++) {
		struct sl_doc *d = &p->pending[k];
		struct sl_row *r = NULL;

		for (size_t i = 0; i < p->nopen; i++) {
			struct sl_row *o = p->open[i];

			if (L - o->used >= d->len && (!r || o->used > r->used))
				r = o;
		}
		if (!r && p->opt.greedy)
			while (p->nopen)
				sl_finish(p, 0);
		if (!r && !(r = sl_new_row(p)))
			return -ENOMEM;
		memcpy(r->tok + r->used, d->tok, d->len * sizeof(int32_t));
		r->used += d->len;
		r->cu[++r->ndocs] = (int32_t)r->used;
		free(d->tok);
		d->tok = NULL;
	}
	p->npending = 0;
	/* Rows that nothing seen so far could still fill are done. */
	for (size_t i = 0; i < p->nopen;)
		if (L - p->open[i]->used < p->min_len)
			sl_finish(p, i);
		else
			i++;
	/* At most SL_OPEN rows wait for the next window: the fullest of the rest are done. */
	while (p->nopen > SL_OPEN) {
		size_t best = 0;

		for (size_t i = 1; i < p->nopen; i++)
			if (p->open[i]->used > p->open[best]->used)
				best = i;
		sl_finish(p, best);
	}
	return 0;
}

int sluice_packer_add(struct sluice_packer *p, const int32_t *tokens, size_t n)
{
	while (n) {
		uint32_t len = n > p->opt.context ? p->opt.context : (uint32_t)n;
		struct sl_doc *d = &p->pending[p->npending];
		int rc;

		d->tok = malloc(len * sizeof(int32_t));
		if (!d->tok)
			return -ENOMEM;
		memcpy(d->tok, tokens, len * sizeof(int32_t));
		d->len = len;
		p->npending++;
		if (len < p->min_len)
			p->min_len = len;
		tokens += len;
		n -= len;
		if (p->npending == p->opt.window && (rc = sl_place(p)))
			return rc;
	}
	return 0;
}

int sluice_packer_row(struct sluice_packer *p, struct sluice_packed_row *row, int flush)
{
	const uint32_t L = p->opt.context;
	struct sl_row *r;
	int32_t *ids = p->out, *pos = ids + L, *lab = pos + L, *cu = lab + L;

	if (!p->done && flush) {
		if (sl_place(p))
			return -ENOMEM;
		while (p->nopen)
			sl_finish(p, 0);
	}
	r = p->done;
	if (!r)
		return 0;
	p->done = r->next;
	if (!p->done)
		p->done_tail = &p->done;
	/* Documents, then the padding as one more run of positions. */
	memcpy(ids, r->tok, r->used * sizeof(int32_t));
	for (uint32_t d = 0; d < r->ndocs; d++)
		for (int32_t i = r->cu[d]; i < r->cu[d + 1]; i++) {
			pos[i] = i - r->cu[d];
			lab[i] = i == r->cu[d] ? p->opt.ignore_index : ids[i];
		}
	for (uint32_t i = r->used; i < L; i++) {
		ids[i] = p->opt.pad_id;
		pos[i] = (int32_t)(i - r->used);
		lab[i] = p->opt.ignore_index;
	}
	memcpy(cu, r->cu, ((size_t)r->ndocs + 1) * sizeof(int32_t));
	*row = (struct sluice_packed_row){ ids, pos, lab, cu, r->ndocs, r->used };
	p->tokens += r->used;
	p->capacity += L;
	r->next = p->free_rows;
	p->free_rows = r;
	return 1;
}

void sluice_packer_stats(const struct sluice_packer *p, uint64_t *tokens, uint64_t *capacity)
{
	*tokens = p->tokens;
	*capacity = p->capacity;
}

static void sl_free_rows(struct sl_row *r)
{
	while (r) {
		struct sl_row *n = r->next;

		free(r->tok);
		free(r->cu);
		free(r);
		r = n;
	}
}

void sluice_packer_free(struct sluice_packer *p)
{
	if (!p)
		return;
	for (size_t k = 0; p->pending && k < p->npending; k++)
		free(p->pending[k].tok);
	for (size_t i = 0; i < p->nopen; i++) {
		p->open[i]->next = NULL;
		sl_free_rows(p->open[i]);
	}
	sl_free_rows(p->done);
	sl_free_rows(p->free_rows);
	free(p->open);
	free(p->pending);
	free(p->out);
	free(p);
}
