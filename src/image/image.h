/*
 * image: encoded images (JPEG, PNG, WebP) into the batched, augmented
 * tensors a model takes.  probe.c reads a header (kind, size, what a
 * decoder must support) and checks the bytes are whole; crop.c decides
 * each image's crop and flip from (seed, epoch, record) alone, as
 * torchvision's RandomResizedCrop samples them; cpu.c decodes with
 * libjpeg-turbo, libpng and libwebp and runs augment.h's pixel on the CPU;
 * gpu.c decodes batches with nvJPEG (its hardware engines where the GPU
 * has them) and runs augment.h compiled by NVRTC, one launch a batch.
 * Depends on core and gpu.
 */
#ifndef SL_IMAGE_H
#define SL_IMAGE_H

#include "core/core.h"
#include "image/augment.h"

enum { SL_IMG_JPEG = 1, SL_IMG_PNG, SL_IMG_WEBP };

struct sl__img_info {
	int kind;            /* SL_IMG_* */
	uint32_t w, h;
	int ncomp;           /* JPEG: components (1 grey, 3 YCbCr/RGB, 4 CMYK/YCCK) */
	int baseline;        /* JPEG: baseline sequential (SOF0/SOF1), which nvJPEG's hardware engines decode */
	int rgb;             /* JPEG: 3 components stored as RGB, not YCbCr (Adobe's transform 0, or ids R, G, B) */
};

/*
 * The header of an encoded image of n bytes: 0 and *info, or
 * SLUICE_EFORMAT with why (cap bytes) saying what is wrong: not an image
 * sluice decodes, a size of 0 or over max_pixels, a JPEG without its end
 * (truncated), components or precision no decoder here takes, a side over
 * 65535 pixels (JPEG's most; the kernel's float coordinates stay exact).
 */
SL_HIDDEN int sl__img_probe(const unsigned char *p, size_t n, uint64_t max_pixels, struct sl__img_info *info, char *why,
			    size_t cap);

/* The pipeline's choices, from struct sluice_image_options, checked. */
struct sl__img_opts {
	int ow, oh;
	int mode;            /* SLUICE_IMAGE_RANDOM_RESIZED_CROP, _CENTER_CROP, _RESIZE */
	double scale[2], ratio[2];
	double flip;
	uint32_t resize;     /* center crop: the shorter side resized to this first */
	struct sl_aug_params aug;
	size_t out_bytes;    /* one image's output */
	uint64_t max_pixels;
};

/* The user's options checked into o: 0 or SLUICE_EINVAL_CONFIG naming the option. */
struct sluice_image_options;
SL_HIDDEN int sl__img_opts_set(struct sl__img_opts *o, const struct sluice_image_options *in);

/*
 * Image (w x h) of record id: its region, resize and flip into *im, its
 * pixels taken as RGB (src, pitch and row are left to the caller, and a
 * decoder that writes planes says so), from (seed, epoch, id) alone.
 * Returns 0, or -1 when a centre crop's resize of so long and thin an
 * image passes SL_IMG_MAX_RESIZED a side.
 */
#define SL_IMG_MAX_RESIZED (1u << 22)
SL_HIDDEN int sl__img_plan(const struct sl__img_opts *o, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t w,
			    uint32_t h, struct sl_aug_img *im);
/* RandomResizedCrop's box for a w x h image and 10 tries' uniforms u[20]: *x, *y, *cw, *ch. */
SL_HIDDEN void sl__img_rrc_box(const double scale[2], const double ratio[2], uint32_t w, uint32_t h, const double *u,
			       uint32_t *x, uint32_t *y, uint32_t *cw, uint32_t *ch);

/*
 * Decodes the image (probed as info) into rgb (w * h * 3 bytes, interleaved
 * RGB): 0 or SLUICE_EFORMAT with why.  A JPEG's rows [row0, row0 + rows)
 * alone when rows is not 0, from rgb's start (the other kinds decode whole).
 */
SL_HIDDEN int sl__img_decode_cpu(const unsigned char *p, size_t n, const struct sl__img_info *info, uint32_t row0,
				 uint32_t rows, unsigned char *rgb, char *why, size_t cap);
/* augment.h's pixels of image im for every output pixel, on this thread. */
SL_HIDDEN void sl__img_augment_cpu(const unsigned char *scratch, const struct sl_aug_img *im,
				   const struct sl_aug_params *p, void *out);


/* ---- a batch of images (run.c) ---- */

struct sl__img_rec {
	const unsigned char *p;
	size_t n;
	uint64_t id;
};

/*
 * m records' images into one batch: the kept ones (not bad) fill output
 * rows 0, 1, ... in order.  A record that is not a whole image gets
 * bad[j] = 1 and, the first of them, why and why_id; what then happens
 * (an error, a skip) is the caller's choice.  Errors returned are the
 * machine's (memory, CUDA), never an image's.
 */
/*
 * Where a producer's GPU batch spends its time on the host (ns), in the
 * order it runs: its last batch waited for, the headers parsed and the
 * batch routed, the shared decoder waited for (its lane, then the batch
 * another producer decoded in it), nvJPEG's calls, nvJPEG's reading of the
 * JPEGs waited for (they are in the windows), the CPU's images, the
 * kernel's launch.
 */
enum sl__img_phase {
	SL_IMG_T_LAST, SL_IMG_T_PARSE, SL_IMG_T_LANE, SL_IMG_T_SHARED, SL_IMG_T_DECODE, SL_IMG_T_READ, SL_IMG_T_CPU,
	SL_IMG_T_AUGMENT, SL_IMG_PHASES
};

struct sl__img_batch {
	const struct sl__img_opts *o;
	uint64_t seed, epoch;
	uint32_t m;
	const struct sl__img_rec *rec;
	uint8_t *bad;
	uint32_t kept;
	char why[256];
	uint64_t why_id;        /* the first bad record in the batch's order (whichever thread met it) */
	uint32_t why_j;
	int nbad;
	uint32_t n_gpu, n_cpu;  /* the kept images nvJPEG decoded, and the CPU */
	uint32_t nj_calls;      /* calls into nvJPEG that queue GPU work (its own CUDA calls are not sluice's to count) */
	uint64_t ns[SL_IMG_PHASES]; /* the GPU pipeline's host time by phase (enum sl__img_phase) */
};

/* A batch on the CPU's threads into out (host memory), rows kept dense. */
SL_HIDDEN int sl__img_run_cpu(struct sl__img_batch *b, void *out);

/* One producer's GPU pipeline: nvJPEG's state, the scratch, the kernel. */
struct sl__img_gpu;
struct sl__gpu;
/*
 * nvjpeg 0: every image decoded by the CPU's threads, augmented on the GPU.
 * batch: the images a batch holds at most (nvJPEG's memory is made for
 * them); share: another producer's pipeline whose nvJPEG decoder this one
 * shares (NULL: one of its own).
 */
SL_HIDDEN int sl__img_gpu_open(struct sl__img_gpu **out, const struct sl__gpu *g, int nvjpeg, unsigned batch,
			       struct sl__img_gpu *share);
SL_HIDDEN void sl__img_gpu_close(struct sl__img_gpu *ig);
/* A batch into out (GPU memory) on stream s: decoded by nvJPEG (the CPU for what it cannot), one launch. */
SL_HIDDEN int sl__img_run_gpu(struct sl__img_gpu *ig, struct sl__img_batch *b, void *out, void *stream);

#endif
