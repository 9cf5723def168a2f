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
 * for C), no library calls but floorf.
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

/*
 * One image: its decoded pixels (interleaved RGB, pitch bytes a row) at
 * src in the scratch, the region [x0, x0 + rw) x [y0, y0 + rh) that is
 * resized to rsw x rsh, of which the output takes the window at (offx,
 * offy), flipped or not, into output row `row`.
 */
struct sl_aug_img {
	sl_aug_u64 src;
	int pitch, x0, y0, rw, rh, rsw, rsh, offx, offy, flip, row;
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
		const unsigned char *row = src + (sl_aug_u64)(im->y0 + ay.first + y) * (sl_aug_u64)im->pitch +
					   3 * (sl_aug_u64)(im->x0 + ax.first);
		float h[3] = { 0.0f, 0.0f, 0.0f }, wy = sl_aug_w(&ay, y) / ay.total;

		for (x = 0; x < ax.n; x++) {
			float wx = sl_aug_w(&ax, x);

			for (c = 0; c < 3; c++)
				h[c] += wx * (float)row[3 * x + c];
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
		v = v / 255.0f;
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
