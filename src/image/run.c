/*
 * A batch of images, the part every placement shares: each record probed,
 * planned and given its place in a scratch of decoded images; and the
 * CPU's placement, whose threads decode and augment the batch.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/run.h"

void sl__img_mark_bad(struct sl__img_batch *b, uint32_t j, const char *why)
{
	if (!b->bad[j] && !b->nbad++) {
		snprintf(b->why, sizeof(b->why), "%s", why);
		b->why_id = b->rec[j].id;
	}
	b->bad[j] = 1;
}

size_t sl__img_layout(struct sl__img_batch *b, struct sl__img_item *it)
{
	size_t at = 0;

	for (uint32_t j = 0; j < b->m; j++) {
		char why[256];

		if (b->bad[j])
			continue;
		if (sl__img_probe(b->rec[j].p, b->rec[j].n, b->o->max_pixels, &it[j].info, why, sizeof(why))) {
			sl__img_mark_bad(b, j, why);
			continue;
		}
		sl__img_plan(b->o, b->seed, b->epoch, b->rec[j].id, it[j].info.w, it[j].info.h, &it[j].im);
		it[j].im.fmt = SL_AUG_RGB;
		it[j].im.w = (int)it[j].info.w;
		it[j].im.h = (int)it[j].info.h;
		it[j].im.pitch = (int)it[j].info.w * 3;
		it[j].im.src = at; /* room for RGB: nvJPEG's planes take no more */
		at = sl__align_up(at + (size_t)it[j].info.h * (size_t)it[j].im.pitch, 256);
	}
	return at;
}

uint32_t sl__img_rows(struct sl__img_batch *b, struct sl__img_item *it)
{
	uint32_t k = 0;

	for (uint32_t j = 0; j < b->m; j++)
		if (!b->bad[j])
			it[j].im.row = (int)k++;
	return b->kept = k;
}

unsigned sl__img_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 8 ? 8 : (unsigned)n;
}

/* The CPU's threads: each takes the next image, decodes it into scratch at its place (and augments it). */
struct sl_cpu_work {
	struct sl__img_batch *b;
	struct sl__img_item *it;
	unsigned char *scratch;
	void *out;              /* NULL: decode only */
	const uint8_t *mine;    /* NULL: every kept image; else those with mine[j] */
	_Atomic uint32_t next;
	pthread_mutex_t lock;   /* b's bad marks */
};

static void *sl_cpu_worker(void *arg)
{
	struct sl_cpu_work *w = arg;

	for (uint32_t j; (j = atomic_fetch_add(&w->next, 1)) < w->b->m;) {
		struct sl__img_item *it = &w->it[j];
		char why[256];

		if (w->b->bad[j] || (w->mine && !w->mine[j]))
			continue;
		if (sl__img_decode_cpu(w->b->rec[j].p, w->b->rec[j].n, &it->info, w->scratch + it->im.src, why,
				       sizeof(why))) {
			pthread_mutex_lock(&w->lock);
			sl__img_mark_bad(w->b, j, why);
			pthread_mutex_unlock(&w->lock);
			continue;
		}
		if (w->out)
			sl__img_augment_cpu(w->scratch, &it->im, &w->b->o->aug, w->out);
	}
	return NULL;
}

void sl__img_decode_many(struct sl__img_batch *b, struct sl__img_item *it, unsigned char *scratch, const uint8_t *mine,
			 void *out)
{
	struct sl_cpu_work w = { .b = b, .it = it, .scratch = scratch, .out = out, .mine = mine };

	pthread_mutex_init(&w.lock, NULL);
	sl__fanout(sl__img_threads(), sl_cpu_worker, &w);
	pthread_mutex_destroy(&w.lock);
}

int sl__img_run_cpu(struct sl__img_batch *b, void *out)
{
	struct sl__img_item *it = calloc(b->m ? b->m : 1, sizeof(*it));
	unsigned char *scratch = NULL;
	size_t total;
	uint32_t k;

	if (!it)
		return -ENOMEM;
	total = sl__img_layout(b, it);
	if (!(scratch = malloc(total ? total : 1))) {
		free(it);
		return -ENOMEM;
	}
	/* Rows as if every probed image decodes; one that does not leaves a hole, closed below. */
	sl__img_rows(b, it);
	sl__img_decode_many(b, it, scratch, NULL, out);
	k = 0;
	for (uint32_t j = 0; j < b->m; j++) {
		if (b->bad[j])
			continue;
		if ((uint32_t)it[j].im.row != k) /* a hole before it (a failed decode): the image moves up */
			memmove((char *)out + k * b->o->out_bytes, (char *)out + (size_t)it[j].im.row * b->o->out_bytes,
				b->o->out_bytes);
		k++;
	}
	b->kept = k;
	free(scratch);
	free(it);
	return 0;
}
