/*
 * The fused augmentation, one source for both places it runs: compiled as C
 * for the CPU (image/cpu.c) and, as text, by NVRTC for the GPU
 * (image/gpu.c), so the two cannot drift apart.  One output pixel of one
 * image: the crop's region resized as torchvision's antialiased bilinear
 * resize does (PyTorch's _upsample_bilinear2d_aa: a triangle filter
 * widened by the scale when shrinking, weights normalised, the window
 * clipped to the region), flipped, scaled to [0, 1], normalised and stored
 * in the output's dtype and layout.  Nothing is rounded between the steps.
 *
 * Keep it to what both C11 and NVRTC's C++ take: no includes (but math.h
 * for C), no library calls but floorf.  The pixels come decoded as RGB (the
 * CPU's decoders) or as JPEG's YCbCr planes (nvJPEG's hardware engines,
 * which write those with copies alone: converting them here, in the one
 * launch, keeps a kernel an image off the GPU the model is using).
 */
#ifndef SL_IMAGE_AUGMENT_H
#define SL_IMAGE_AUGMENT_H

#ifdef __CUDACC_RTC__
#define SL_AUG_FN __device__ static inline
typedef unsigned long long sl_aug_u64;
#else
#include <math.h>
#define SL_AUG_FN static inline
typedef unsigned long long sl_aug_u64;
#endif

/* Output dtypes (sluice_dtype's values). */
#define SL_AUG_U8 1
#define SL_AUG_F16 6
#define SL_AUG_BF16 7
#define SL_AUG_F32 8

/* How a decoded image lies in the scratch. */
#define SL_AUG_RGB 0   /* interleaved R, G, B bytes, pitch a row (the CPU's decoders) */
#define SL_AUG_YCC 1   /* JPEG's planes as nvJPEG's hardware writes them: Y, then Cb and Cr of cw x ch (subsampled) */
#define SL_AUG_GREY 2  /* Y alone */

/*
 * One image: its decoded pixels at src in the scratch (fmt, pitch; for
 * YCC the chroma planes follow Y, each cw x ch with pitch cw), the region
 * [x0, x0 + rw) x [y0, y0 + rh) that is resized to rsw x rsh, of which the
 * output takes the window at (offx, offy), flipped or not, into output
 * row `row`.
 */
struct sl_aug_img {
	sl_aug_u64 src;
	int pitch, x0, y0, rw, rh, rsw, rsh, offx, offy, flip, row;
	int fmt, w, h, cw, ch;
};

/* The batch's shared parameters. */
struct sl_aug_params {
	int ow, oh;           /* output width, height */
	int dtype;            /* SL_AUG_* */
	int nhwc;             /* 1: channels last */
	int normalize;        /* 1: (v / 255 - mean) / std; 0: v / 255 (floats) or v (u8) */
	float mean[3], inv_std[3];
};

/*
 * Along an axis of n input pixels resized to m, output coordinate i reads
 * inputs [*first, *first + return) with weights sl_aug_w(k) / *total.
 */
struct sl_aug_axis {
	float center, inv, total;
	int first, n;
};

SL_AUG_FN float sl_aug_w(const struct sl_aug_axis *a, int k)
{
	float x = ((float)(k + a->first) - a->center + 0.5f) * a->inv;
	float t = 1.0f - (x < 0.0f ? -x : x);

	return t > 0.0f ? t : 0.0f;
}

SL_AUG_FN void sl_aug_axis_at(struct sl_aug_axis *a, int i, int n, int m)
{
	const float scale = (float)n / (float)m;
	const float support = scale >= 1.0f ? scale : 1.0f;
	int lo, hi, k;

	a->inv = scale >= 1.0f ? 1.0f / scale : 1.0f;
	a->center = scale * ((float)i + 0.5f);
	lo = (int)(a->center - support + 0.5f);
	hi = (int)(a->center + support + 0.5f);
	a->first = lo < 0 ? 0 : lo;
	a->n = (hi > n ? n : hi) - a->first;
	a->total = 0.0f;
	for (k = 0; k < a->n; k++)
		a->total += sl_aug_w(a, k);
	if (a->total <= 0.0f)
		a->total = 1.0f;
}

/* float to bfloat16 and to IEEE half, rounded to nearest even (finite inputs). */
SL_AUG_FN unsigned short sl_aug_bf16(float f)
{
	union { float f; unsigned u; } v;

	v.f = f;
	return (unsigned short)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

SL_AUG_FN unsigned short sl_aug_f16(float f)
{
	union { float f; unsigned u; } v;
	unsigned sign, exp, man, r;

	v.f = f;
	sign = (v.u >> 16) & 0x8000u;
	exp = (v.u >> 23) & 0xffu;
	man = v.u & 0x7fffffu;
	if (exp >= 143) /* |f| >= 65520: infinity (normalised pixels never come near) */
		return (unsigned short)(sign | 0x7c00u);
	if (exp < 113) { /* subnormal half, or zero */
		unsigned shift;

		if (exp < 102)
			return (unsigned short)sign;
		man |= 0x800000u;
		shift = 126 - exp;
		r = man >> shift;
		if ((man & ((1u << shift) - 1)) > (1u << (shift - 1)) ||
		    ((man & ((1u << shift) - 1)) == (1u << (shift - 1)) && (r & 1u)))
			r++;
		return (unsigned short)(sign | r);
	}
	r = ((exp - 112) << 10) | (man >> 13);
	if ((man & 0x1fffu) > 0x1000u || ((man & 0x1fffu) == 0x1000u && (r & 1u)))
		r++;
	return (unsigned short)(sign | r);
}

/* A byte of a plane, its coordinates clamped to the plane (JPEG's edges replicate). */
SL_AUG_FN float sl_aug_at(const unsigned char *plane, int pitch, int w, int h, int x, int y)
{
	x = x < 0 ? 0 : x >= w ? w - 1 : x;
	y = y < 0 ? 0 : y >= h ? h - 1 : y;
	return (float)plane[(sl_aug_u64)y * (sl_aug_u64)pitch + (sl_aug_u64)x];
}

/*
 * Pixel (x, y) of the image as R, G, B of 0..255, rounded as a decoder's
 * bytes are.  YCC: chroma upsampled as libjpeg's "fancy" upsampling does
 * (linear between the samples' centres, edges replicated), then JFIF's
 * YCbCr to RGB.
 */
SL_AUG_FN void sl_aug_rgb(const unsigned char *src, const struct sl_aug_img *im, int x, int y, float *rgb)
{
	const unsigned char *cb, *cr;
	float fx, fy, ax, ay, b, r, yy;
	int x0, y0, c;

	if (im->fmt == SL_AUG_RGB) {
		const unsigned char *p = src + (sl_aug_u64)y * (sl_aug_u64)im->pitch + 3 * (sl_aug_u64)x;

		rgb[0] = (float)p[0];
		rgb[1] = (float)p[1];
		rgb[2] = (float)p[2];
		return;
	}
	yy = (float)src[(sl_aug_u64)y * (sl_aug_u64)im->pitch + (sl_aug_u64)x];
	if (im->fmt == SL_AUG_GREY) {
		rgb[0] = rgb[1] = rgb[2] = yy;
		return;
	}
	cb = src + (sl_aug_u64)im->pitch * (sl_aug_u64)im->h;
	cr = cb + (sl_aug_u64)im->cw * (sl_aug_u64)im->ch;
	/* The sampling factors (1, 2, ...): the planes cover whole MCUs, so cw is w / factor rounded up. */
	fx = ((float)x + 0.5f) / (float)((im->w + im->cw - 1) / im->cw) - 0.5f;
	fy = ((float)y + 0.5f) / (float)((im->h + im->ch - 1) / im->ch) - 0.5f;
	x0 = (int)floorf(fx);
	y0 = (int)floorf(fy);
	ax = fx - (float)x0;
	ay = fy - (float)y0;
	b = (1.0f - ay) * ((1.0f - ax) * sl_aug_at(cb, im->cw, im->cw, im->ch, x0, y0) +
			   ax * sl_aug_at(cb, im->cw, im->cw, im->ch, x0 + 1, y0)) +
	    ay * ((1.0f - ax) * sl_aug_at(cb, im->cw, im->cw, im->ch, x0, y0 + 1) +
		  ax * sl_aug_at(cb, im->cw, im->cw, im->ch, x0 + 1, y0 + 1)) - 128.0f;
	r = (1.0f - ay) * ((1.0f - ax) * sl_aug_at(cr, im->cw, im->cw, im->ch, x0, y0) +
			   ax * sl_aug_at(cr, im->cw, im->cw, im->ch, x0 + 1, y0)) +
	    ay * ((1.0f - ax) * sl_aug_at(cr, im->cw, im->cw, im->ch, x0, y0 + 1) +
		  ax * sl_aug_at(cr, im->cw, im->cw, im->ch, x0 + 1, y0 + 1)) - 128.0f;
	rgb[0] = yy + 1.402f * r;
	rgb[1] = yy - 0.344136f * b - 0.714136f * r;
	rgb[2] = yy + 1.772f * b;
	for (c = 0; c < 3; c++) {
		float v = floorf(rgb[c] + 0.5f);

		rgb[c] = v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
	}
}

/* Output pixel (ox, oy) of image im into out. */
SL_AUG_FN void sl_aug_pixel(const unsigned char *scratch, const struct sl_aug_img *im, const struct sl_aug_params *p,
			    int ox, int oy, void *out)
{
	struct sl_aug_axis ax, ay;
	float acc[3] = { 0.0f, 0.0f, 0.0f };
	int c, x, y;
	const unsigned char *src = scratch + im->src;
	sl_aug_u64 plane = (sl_aug_u64)p->oh * (sl_aug_u64)p->ow, at;

	sl_aug_axis_at(&ax, (im->flip ? p->ow - 1 - ox : ox) + im->offx, im->rw, im->rsw);
	sl_aug_axis_at(&ay, oy + im->offy, im->rh, im->rsh);
	for (y = 0; y < ay.n; y++) {
		float h[3] = { 0.0f, 0.0f, 0.0f }, wy = sl_aug_w(&ay, y) / ay.total, px[3];

		for (x = 0; x < ax.n; x++) {
			float wx = sl_aug_w(&ax, x);

			sl_aug_rgb(src, im, im->x0 + ax.first + x, im->y0 + ay.first + y, px);
			for (c = 0; c < 3; c++)
				h[c] += wx * px[c];
		}
		for (c = 0; c < 3; c++)
			acc[c] += wy * h[c] / ax.total;
	}
	for (c = 0; c < 3; c++) {
		float v = acc[c];

		at = p->nhwc ? (((sl_aug_u64)im->row * plane + (sl_aug_u64)oy * p->ow + ox) * 3 + c)
			     : (((sl_aug_u64)im->row * 3 + c) * plane + (sl_aug_u64)oy * p->ow + ox);
		if (p->dtype == SL_AUG_U8) {
			v = floorf(v + 0.5f);
			((unsigned char *)out)[at] = (unsigned char)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
			continue;
		}
		/* The weights are positive and sum to 1, so only rounding takes v past 255 (255.00002 is 1 + 2^-23 after). */
		v = (v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v) / 255.0f;
		if (p->normalize)
			v = (v - p->mean[c]) * p->inv_std[c];
		if (p->dtype == SL_AUG_F32)
			((float *)out)[at] = v;
		else if (p->dtype == SL_AUG_BF16)
			((unsigned short *)out)[at] = sl_aug_bf16(v);
		else
			((unsigned short *)out)[at] = sl_aug_f16(v);
	}
}

#ifdef __CUDACC_RTC__
/* The whole batch in one launch: blockIdx.y the image, x and threads its output pixels. */
extern "C" __global__ void sl_augment(const unsigned char *scratch, const struct sl_aug_img *imgs, struct sl_aug_params p,
				      void *out)
{
	const int pix = blockIdx.x * blockDim.x + threadIdx.x;

	if (pix < p.ow * p.oh)
		sl_aug_pixel(scratch, &imgs[blockIdx.y], &p, pix % p.ow, pix / p.ow, out);
}
#endif

#endif
