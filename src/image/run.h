/* image/: what run.c shares with gpu.c (one batch's images, probed and placed). */
#ifndef SL_IMAGE_RUN_H
#define SL_IMAGE_RUN_H

#include <pthread.h>

#include "image/image.h"

struct sl__img_item {
	struct sl__img_info info;
	struct sl_aug_img im;   /* im.src: the decoded image's place in the scratch */
};

/* Record j is bad (why); the batch's first reason kept. */
SL_HIDDEN void sl__img_mark_bad(struct sl__img_batch *b, uint32_t j, const char *why);
/* Every record probed (bad marked) and planned, its place in a scratch of decoded images; returns the scratch's bytes. */
SL_HIDDEN size_t sl__img_layout(struct sl__img_batch *b, struct sl__img_item *it);
/* Output rows for the records not bad, in order; returns how many. */
SL_HIDDEN uint32_t sl__img_rows(struct sl__img_batch *b, struct sl__img_item *it);
/*
 * The images (those of mine[], or all kept) decoded by the CPU's threads:
 * into scratch at their places, or (scratch NULL) each into its thread's
 * buffer; augmented into out if set.  0, or -ENOMEM (an image's failure
 * marks it bad instead).
 */
SL_HIDDEN int sl__img_decode_many(struct sl__img_batch *b, struct sl__img_item *it, unsigned char *scratch,
				   const uint8_t *mine, void *out);
/* Threads the CPU's decoding uses: the CPUs, at most 8. */
SL_HIDDEN unsigned sl__img_threads(void);

#endif
