/*
 * Each image's crop and flip, decided from (seed, epoch, record id) alone,
 * so that an epoch's images are the same on any machine, at any world size
 * and after a resume from state_dict(): no generator carries state from
 * one record to the next.  RandomResizedCrop samples as torchvision's
 * get_params does: up to 10 tries of a scale (uniform) and a log-uniform
 * aspect ratio, each rounded half to even as Python's round(), the first
 * that fits placed uniformly; else the centre crop clamped to the ratios.
 */
#include <math.h>

#include "image/image.h"
#include "sluice.h"

/* splitmix64: the i-th 64-bit value of the stream keyed by key. */
static uint64_t sl_mix(uint64_t key, uint64_t i)
{
	uint64_t z = key + (i + 1) * 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A uniform in [0, 1) with 53 bits. */
static double sl_unit(uint64_t key, uint64_t i)
{
	return (double)(sl_mix(key, i) >> 11) * 0x1.0p-53;
}

void sl__img_rrc_box(const double scale[2], const double ratio[2], uint32_t w, uint32_t h, const double *u,
		     uint32_t *x, uint32_t *y, uint32_t *cw, uint32_t *ch)
{
	const double area = (double)w * h, lr0 = log(ratio[0]), lr1 = log(ratio[1]);
	const double in_ratio = (double)w / h;

	for (int t = 0; t < 10; t++) {
		double target = area * (scale[0] + (scale[1] - scale[0]) * u[4 * t]);
		double ar = exp(lr0 + (lr1 - lr0) * u[4 * t + 1]);
		double fw = nearbyint(sqrt(target * ar)), fh = nearbyint(sqrt(target / ar));

		if (fw > 0 && fw <= w && fh > 0 && fh <= h) {
			*cw = (uint32_t)fw;
			*ch = (uint32_t)fh;
			*y = (uint32_t)floor(u[4 * t + 2] * (h - *ch + 1));
			*x = (uint32_t)floor(u[4 * t + 3] * (w - *cw + 1));
			return;
		}
	}
	*cw = w;
	*ch = h;
	if (in_ratio < ratio[0])
		*ch = (uint32_t)nearbyint(w / ratio[0]);
	else if (in_ratio > ratio[1])
		*cw = (uint32_t)nearbyint(h * ratio[1]);
	if (!*cw)
		*cw = 1;
	if (!*ch)
		*ch = 1;
	*y = (h - *ch) / 2;
	*x = (w - *cw) / 2;
}

int sl__img_plan(const struct sl__img_opts *o, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t w, uint32_t h,
		 struct sl_aug_img *im)
{
	const uint64_t key = sl_mix(sl_mix(seed, epoch), id);
	uint64_t rw, rh;
	double u[41];

	for (int i = 0; i < 41; i++)
		u[i] = sl_unit(key, (uint64_t)i);
	im->fmt = SL_AUG_RGB; /* decoded as RGB unless its decoder says otherwise (gpu.c) */
	im->w = (int)w;
	im->h = (int)h;
	im->cw = im->ch = 0;
	im->offx = im->offy = 0;
	im->flip = o->flip > 0 && u[40] < o->flip;
	if (o->mode == SLUICE_IMAGE_RANDOM_RESIZED_CROP) {
		uint32_t x, y, cw, ch;

		sl__img_rrc_box(o->scale, o->ratio, w, h, u, &x, &y, &cw, &ch);
		im->x0 = (int)x;
		im->y0 = (int)y;
		im->rw = (int)cw;
		im->rh = (int)ch;
		im->rsw = o->ow;
		im->rsh = o->oh;
		return 0;
	}
	im->x0 = im->y0 = 0;
	im->rw = (int)w;
	im->rh = (int)h;
	if (o->mode == SLUICE_IMAGE_RESIZE) {
		im->rsw = o->ow;
		im->rsh = o->oh;
		return 0;
	}
	/* Resize(resize): the shorter side to resize, the longer in proportion (truncated, as torchvision); then
	 * CenterCrop: offsets rounded as torchvision's int(round((size - crop) / 2)). */
	rw = w <= h ? o->resize : (uint64_t)o->resize * w / h;
	rh = w <= h ? (uint64_t)o->resize * h / w : o->resize;
	if (rw > SL_IMG_MAX_RESIZED || rh > SL_IMG_MAX_RESIZED)
		return -1; /* the kernel's coordinates are floats: past this they lose the half pixel */
	im->rsw = (int)rw;
	im->rsh = (int)rh;
	im->offx = (int)nearbyint((im->rsw - o->ow) / 2.0);
	im->offy = (int)nearbyint((im->rsh - o->oh) / 2.0);
	return 0;
}
