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
	if (b->bad[j])
		return;
	if (!b->nbad++ || j < b->why_j) {
		snprintf(b->why, sizeof(b->why), "%s", why);
		b->why_id = b->rec[j].id;
		b->why_j = j;
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
		if (sl__img_plan(b->o, b->seed, b->epoch, b->rec[j].id, it[j].info.w, it[j].info.h, &it[j].im)) {
			snprintf(why, sizeof(why), "image of %u x %u pixels: resized so its shorter side is %u, a side passes %u",
				 it[j].info.w, it[j].info.h, b->o->resize, SL_IMG_MAX_RESIZED);
			sl__img_mark_bad(b, j, why);
			continue;
		}
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

/*
 * The CPU's threads: each takes the next image and decodes it, into the
 * scratch at its place (for a copy to the GPU), or, augmenting into out,
 * into a buffer of the thread's own, so that memory holds one decoded image
 * a thread, not the batch's.
 */
struct sl_cpu_work {
	struct sl__img_batch *b;
	struct sl__img_item *it;
	unsigned char *scratch; /* with out NULL */
	void *out;              /* NULL: decode only */
	const uint8_t *mine;    /* NULL: every kept image; else those with mine[j] */
	_Atomic uint32_t next;
	pthread_mutex_t lock;   /* b's bad marks, err */
	_Atomic int err;        /* the machine's (memory), not an image's */
};

static void *sl_cpu_worker(void *arg)
{
	struct sl_cpu_work *w = arg;
	unsigned char *own = NULL;
	size_t own_cap = 0;

	for (uint32_t j; !w->err && (j = atomic_fetch_add(&w->next, 1)) < w->b->m;) {
		struct sl__img_item *it = &w->it[j];
		struct sl_aug_img im = it->im;
		size_t need = (size_t)it->info.h * it->info.w * 3;
		unsigned char *dst = w->scratch ? w->scratch + it->im.src : NULL;
		uint32_t row0 = 0, rows = 0;
		char why[256];

		if (w->b->bad[j] || (w->mine && !w->mine[j]))
			continue;
		if (!dst) {
			if (need > own_cap) {
				free(own);
				own_cap = 0;
				if (!(own = malloc(need))) {
					pthread_mutex_lock(&w->lock);
					w->err = sl__err(-ENOMEM, "images: %zu bytes for a decoded image", need);
					pthread_mutex_unlock(&w->lock);
					break;
				}
				own_cap = need;
			}
			dst = own;
			im.src = 0;
		}
		/* Into the thread's buffer, a JPEG's rows the crop reads alone: its region starts at the buffer's. */
		if (!w->scratch && it->info.kind == SL_IMG_JPEG) {
			row0 = (uint32_t)im.y0;
			rows = (uint32_t)im.rh;
			im.y0 = 0;
		}
		if (sl__img_decode_cpu(w->b->rec[j].p, w->b->rec[j].n, &it->info, row0, rows, dst, why, sizeof(why))) {
			pthread_mutex_lock(&w->lock);
			sl__img_mark_bad(w->b, j, why);
			pthread_mutex_unlock(&w->lock);
			continue;
		}
		if (w->out)
			sl__img_augment_cpu(w->scratch ? w->scratch : own, &im, &w->b->o->aug, w->out);
	}
	free(own);
	return NULL;
}

int sl__img_decode_many(struct sl__img_batch *b, struct sl__img_item *it, unsigned char *scratch, const uint8_t *mine,
			void *out)
{
	struct sl_cpu_work w = { .b = b, .it = it, .scratch = scratch, .out = out, .mine = mine };

	pthread_mutex_init(&w.lock, NULL);
	sl__fanout(sl__img_threads(), sl_cpu_worker, &w);
	pthread_mutex_destroy(&w.lock);
	return w.err;
}

int sl__img_run_cpu(struct sl__img_batch *b, void *out)
{
	struct sl__img_item *it = calloc(b->m ? b->m : 1, sizeof(*it));
	uint32_t k = 0;
	int rc;

	if (!it)
		return -ENOMEM;
	sl__img_layout(b, it);
	/* Rows as if every probed image decodes; one that does not leaves a hole, closed below. */
	sl__img_rows(b, it);
	rc = sl__img_decode_many(b, it, NULL, NULL, out);
	for (uint32_t j = 0; j < b->m && !rc; j++) {
		if (b->bad[j])
			continue;
		if ((uint32_t)it[j].im.row != k) /* a hole before it (a failed decode): the image moves up */
			memmove((char *)out + k * b->o->out_bytes, (char *)out + (size_t)it[j].im.row * b->o->out_bytes,
				b->o->out_bytes);
		k++;
	}
	b->kept = k;
	b->n_cpu = k;
	free(it);
	return rc;
}
