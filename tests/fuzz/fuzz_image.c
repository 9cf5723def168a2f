/*
 * libFuzzer target: the image header reader (image/probe.c) and, where it
 * accepts a small image, the CPU's decoders and the augmentation over it.
 * Properties: no crash or sanitizer report; an accepted image is of
 * 1..max pixels, and one that decodes is augmented inside its output.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "sluice.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sl__img_info info;
	struct sl__img_opts o = { .ow = 8, .oh = 6, .mode = SLUICE_IMAGE_RANDOM_RESIZED_CROP, .scale = { 0.08, 1 },
				  .ratio = { 0.75, 4.0 / 3 }, .flip = 0.5, .out_bytes = 8 * 6 * 3 * 4 };
	char why[256];

	o.aug = (struct sl_aug_params){ .ow = 8, .oh = 6, .dtype = SL_AUG_F32 };
	if (sl__img_probe(data, size, 1u << 20, &info, why, sizeof(why)))
		return 0;
	if (!info.w || !info.h || (uint64_t)info.w * info.h > (1u << 20))
		abort();
	{
		unsigned char *rgb = malloc((size_t)info.w * info.h * 3);
		float *out = malloc(o.out_bytes);
		struct sl_aug_img im;

		if (rgb && out && !sl__img_decode_cpu(data, size, &info, 0, 0, rgb, why, sizeof(why)) &&
		    !sl__img_plan(&o, 1, 2, size, info.w, info.h, &im)) {
			im.src = 0;
			im.pitch = (int)info.w * 3;
			im.row = 0;
			if (im.x0 < 0 || im.y0 < 0 || (uint32_t)(im.x0 + im.rw) > info.w || (uint32_t)(im.y0 + im.rh) > info.h)
				abort();
			sl__img_augment_cpu(rgb, &im, &o.aug, out);
		}
		free(rgb);
		free(out);
	}
	return 0;
}
