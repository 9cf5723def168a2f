/*
 * A producer's images on the GPU: JPEGs decoded in one nvJPEG batch (the
 * hardware decoders' backend where the GPU has them, as torchvision
 * does), what nvJPEG's batch cannot take (PNG, WebP, progressive, CMYK)
 * decoded by the CPU's threads and copied beside them, then augment.h's
 * kernel over the whole batch in one launch.  Everything runs on the
 * producer's stream; the host buffers it fills are reused only once the
 * stream is past the previous batch (the event done).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "image/run.h"
#include "image_augment_src.h" /* sl_augment_src: augment.h as text, made by CMake */

struct sl__img_gpu {
	const struct sl__gpu *g;
	const struct sl__nvjpeg_api *nj;     /* NULL: the CPU decodes every image */
	sl_nvjpegHandle_t h;
	sl_nvjpegJpegState_t st;
	sl_nvjpegJpegStream_t js;
	int hw;                              /* a hardware backend */
	int inited;                          /* the batch size nvJPEG's state was initialised for (0: none) */
	sl_CUfunction fn;
	sl_CUevent done;
	int done_set;
	unsigned char *scratch;              /* decoded images (device) */
	size_t scratch_cap;
	struct sl_aug_img *imgs, *imgs_dev;  /* the kernel's per-image table: pinned host, device */
	size_t imgs_cap, imgs_dev_cap;
	int imgs_pinned;
	unsigned char *bits;                 /* pinned: the batch's JPEGs, as nvJPEG reads them */
	size_t bits_cap;
	int bits_pinned;
	unsigned char *host;                 /* pinned: the CPU's decoded images, before their copy */
	size_t host_cap;
	int host_pinned;
	uint64_t n_gpu, n_cpu;
};

#define SL_NJ(call, what) sl_nj_err((call), what)
static int sl_nj_err(int st, const char *what)
{
	return st ? sl__err(SLUICE_ECUDA, "nvJPEG %s: status %d", what, st) : 0;
}

int sl__img_gpu_open(struct sl__img_gpu **out, const struct sl__gpu *g, int nvjpeg)
{
	struct sl__img_gpu *ig = calloc(1, sizeof(*ig));
	const char *why = NULL;
	int rc;

	*out = NULL;
	if (!ig)
		return -ENOMEM;
	ig->g = g;
	rc = sl__gpu_bind(g);
	if (!rc)
		rc = sl__nvrtc_kernel(g, sl_augment_src, "sl_augment", &ig->fn);
	if (!rc)
		rc = SL_CU(g->cu->EventCreate(&ig->done, SL_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
	if (!rc && nvjpeg && !(ig->nj = sl__nvjpeg(&why)))
		rc = sl__err(SLUICE_ENOGPU, "%s", why);
	if (!rc && ig->nj) {
		int st = ig->nj->CreateEx(SL_NVJPEG_BACKEND_HARDWARE, NULL, NULL, 0, &ig->h);

		ig->hw = st == 0;
		if (st == SL_NVJPEG_STATUS_ARCH_MISMATCH) /* no hardware decoders: the GPU's hybrid backend */
			st = ig->nj->CreateEx(SL_NVJPEG_BACKEND_DEFAULT, NULL, NULL, 0, &ig->h);
		rc = SL_NJ(st, "nvjpegCreateEx");
		if (!rc)
			rc = SL_NJ(ig->nj->JpegStateCreate(ig->h, &ig->st), "nvjpegJpegStateCreate");
		if (!rc)
			rc = SL_NJ(ig->nj->JpegStreamCreate(ig->h, &ig->js), "nvjpegJpegStreamCreate");
	}
	if (rc) {
		sl__img_gpu_close(ig);
		return rc;
	}
	*out = ig;
	return 0;
}

void sl__img_gpu_close(struct sl__img_gpu *ig)
{
	if (!ig)
		return;
	if (!sl__gpu_bind(ig->g)) {
		if (ig->done_set)
			ig->g->cu->EventSynchronize(ig->done);
		if (ig->done)
			ig->g->cu->EventDestroy(ig->done);
	}
	if (ig->js)
		ig->nj->JpegStreamDestroy(ig->js);
	if (ig->st)
		ig->nj->JpegStateDestroy(ig->st);
	if (ig->h)
		ig->nj->Destroy(ig->h);
	sl__gpu_free(ig->g, ig->scratch);
	sl__gpu_free(ig->g, ig->imgs_dev);
	sl__host_free(ig->g, ig->imgs, ig->imgs_cap, ig->imgs_pinned);
	sl__host_free(ig->g, ig->host, ig->host_cap, ig->host_pinned);
	sl__host_free(ig->g, ig->bits, ig->bits_cap, ig->bits_pinned);
	free(ig);
}

void sl__img_gpu_counts(const struct sl__img_gpu *ig, uint64_t *gpu, uint64_t *cpu)
{
	*gpu = ig->n_gpu;
	*cpu = ig->n_cpu;
}

/* Room for n bytes in pinned host memory *p of *cap (grown by a quarter). */
static int sl_host_room(const struct sl__gpu *g, void **p, size_t *cap, int *pinned, size_t n)
{
	size_t c;

	if (n <= *cap)
		return 0;
	c = sl__align_up(n + n / 4, 1u << 21);
	sl__host_free(g, *p, *cap, *pinned);
	*p = NULL;
	*cap = 0;
	if (sl__host_alloc(g, c, p, pinned))
		return -ENOMEM;
	*cap = c;
	return 0;
}

static int sl_dev_room(const struct sl__gpu *g, void **p, size_t *cap, size_t n)
{
	size_t c;

	if (n <= *cap)
		return 0;
	c = sl__align_up(n + n / 4, 1u << 21);
	sl__gpu_free(g, *p);
	*p = NULL;
	*cap = 0;
	if (sl__gpu_alloc(g, c, p))
		return sl__err(SLUICE_ECUDA, "images: GPU memory for %zu bytes of decoded images: %s", c,
			       sluice_last_error_detail());
	*cap = c;
	return 0;
}

/*
 * 1 if nvJPEG's batch takes record j (a JPEG its backend decodes whole),
 * its image then planned as the planes nvJPEG writes: with the hardware
 * backend JPEG's own (Y, Cb, Cr as sampled), which it writes with copies
 * alone, no kernel of its own an image (bench/nvjpeg_formats.py); the
 * kernel converts them.
 */
static int sl_nvjpeg_takes(struct sl__img_gpu *ig, const struct sl__img_rec *r, const struct sl__img_info *info,
			   struct sl_aug_img *im)
{
	int unsupported = 1, nc = 0, sub = 0, w[4] = { 0 }, h[4] = { 0 };

	/* CMYK, and RGB stored as such, which nvJPEG would take for YCbCr: the CPU's libjpeg knows them. */
	if (!ig->nj || info->kind != SL_IMG_JPEG || info->ncomp == 4 || info->rgb)
		return 0;
	if (!ig->hw)
		return 1;
	if (!info->baseline || ig->nj->JpegStreamParseHeader(ig->h, r->p, r->n, ig->js) ||
	    ig->nj->DecodeBatchedSupported(ig->h, ig->js, &unsupported) || unsupported ||
	    ig->nj->GetImageInfo(ig->h, r->p, r->n, &nc, &sub, w, h))
		return 0;
	if (nc != info->ncomp || (uint32_t)w[0] != info->w || (uint32_t)h[0] != info->h ||
	    (nc == 3 && (w[1] < 1 || h[1] < 1 || w[1] > w[0] || h[1] > h[0] || w[2] != w[1] || h[2] != h[1])))
		return 0; /* nvJPEG reads the header otherwise than sluice: the CPU decodes it */
	im->fmt = nc == 1 ? SL_AUG_GREY : SL_AUG_YCC;
	im->pitch = w[0];
	im->cw = nc == 1 ? 0 : w[1];
	im->ch = nc == 1 ? 0 : h[1];
	return 1;
}

/* Image j back to RGB from the CPU's decoder (nvJPEG refused its batch). */
static void sl_as_rgb(struct sl__img_item *it)
{
	it->im.fmt = SL_AUG_RGB;
	it->im.pitch = (int)it->info.w * 3;
}

/* The JPEGs nvJPEG takes (jpeg[j]) decoded into the scratch in one batch; 0, or nonzero when the batch failed. */
static int sl_nvjpeg_batch(struct sl__img_gpu *ig, struct sl__img_batch *b, struct sl__img_item *it, const uint8_t *jpeg,
			   uint32_t n, sl_CUstream s)
{
	const unsigned char **data = malloc(n * sizeof(*data));
	size_t *len = malloc(n * sizeof(*len)), at = 0;
	struct sl_nvjpegImage *dst = calloc(n, sizeof(*dst));
	uint32_t k = 0;
	int st = -1;

	if (data && len && dst) {
		for (uint32_t j = 0; j < b->m; j++) {
			if (!jpeg[j])
				continue;
			/* From pinned memory, held until the stream is past this batch: nvJPEG may read it later. */
			memcpy(ig->bits + at, b->rec[j].p, b->rec[j].n);
			data[k] = ig->bits + at;
			len[k] = b->rec[j].n;
			at += b->rec[j].n;
			for (int c = 0; c < (it[j].im.fmt == SL_AUG_YCC ? 3 : 1); c++) {
				size_t y = (size_t)it[j].im.pitch * (size_t)it[j].im.h, cc = (size_t)it[j].im.cw * it[j].im.ch;

				dst[k].channel[c] = ig->scratch + it[j].im.src + (c ? y + (size_t)(c - 1) * cc : 0);
				dst[k].pitch[c] = (size_t)(c ? it[j].im.cw : it[j].im.pitch);
			}
			k++;
		}
		st = 0;
		if (ig->inited != (int)n) {
			st = ig->nj->DecodeBatchedInitialize(ig->h, ig->st, (int)n, 1,
							     ig->hw ? SL_NVJPEG_OUTPUT_UNCHANGED : SL_NVJPEG_OUTPUT_RGBI);
			ig->inited = st ? 0 : (int)n;
		}
		if (!st)
			st = ig->nj->DecodeBatched(ig->h, ig->st, data, len, dst, s);
		if (st)
			ig->inited = 0; /* nvJPEG asks for a new initialisation after a failed batch */
	}
	free(data);
	free(len);
	free(dst);
	return st;
}

int sl__img_run_gpu(struct sl__img_gpu *ig, struct sl__img_batch *b, void *out, void *stream)
{
	const struct sl__cuda_api *cu = ig->g->cu;
	sl_CUstream s = stream;
	struct sl__img_item *it = calloc(b->m ? b->m : 1, sizeof(*it));
	uint8_t *jpeg = calloc(b->m ? b->m : 1, 1), *cpu = calloc(b->m ? b->m : 1, 1);
	size_t total, bits = 0, cpu_bytes = 0;
	uint32_t njpeg = 0, ncpu = 0;
	int rc = it && jpeg && cpu ? sl__gpu_bind(ig->g) : -ENOMEM;

	/*
	 * The stream must be past this producer's last batch before anything of
	 * its is written: the host buffers, and the scratch, which nvJPEG's
	 * hardware backend writes when nvjpegDecodeBatched is called, not in the
	 * stream's order (measured by torchcodec's and torchvision's maintainers
	 * on H100, nvJPEG 12.3 to 13.2): only a wait on the host orders it after
	 * the last batch's kernel, which reads the scratch.
	 */
	if (!rc && ig->done_set)
		rc = SL_CU(cu->EventSynchronize(ig->done), "cuEventSynchronize");
	if (rc)
		goto out;
	total = sl__img_layout(b, it);
	for (uint32_t j = 0; j < b->m; j++) {
		if (b->bad[j])
			continue;
		jpeg[j] = (uint8_t)sl_nvjpeg_takes(ig, &b->rec[j], &it[j].info, &it[j].im);
		cpu[j] = !jpeg[j];
		njpeg += jpeg[j];
		ncpu += cpu[j];
		bits += jpeg[j] ? b->rec[j].n : 0;
		cpu_bytes = cpu[j] ? it[j].im.src + (size_t)it[j].info.h * (size_t)it[j].im.pitch : cpu_bytes;
	}
	if ((rc = sl_dev_room(ig->g, (void **)&ig->scratch, &ig->scratch_cap, total ? total : 1)) ||
	    (rc = sl_host_room(ig->g, (void **)&ig->bits, &ig->bits_cap, &ig->bits_pinned, bits + 1)) ||
	    (rc = sl_host_room(ig->g, (void **)&ig->host, &ig->host_cap, &ig->host_pinned, cpu_bytes + 1)) ||
	    (rc = sl_host_room(ig->g, (void **)&ig->imgs, &ig->imgs_cap, &ig->imgs_pinned, b->m * sizeof(*ig->imgs) + 1)) ||
	    (rc = sl_dev_room(ig->g, (void **)&ig->imgs_dev, &ig->imgs_dev_cap, b->m * sizeof(*ig->imgs) + 1)))
		goto out;
	if (njpeg && sl_nvjpeg_batch(ig, b, it, jpeg, njpeg, s)) {
		/* nvJPEG refused the batch: the CPU decodes its images, and finds those that are not whole. */
		rc = SL_CU(cu->StreamSynchronize(s), "cuStreamSynchronize");
		for (uint32_t j = 0; j < b->m && !rc; j++)
			if (jpeg[j]) {
				sl_as_rgb(&it[j]);
				cpu[j] = 1;
				ncpu++;
				cpu_bytes = it[j].im.src + (size_t)it[j].info.h * (size_t)it[j].im.pitch > cpu_bytes
						    ? it[j].im.src + (size_t)it[j].info.h * (size_t)it[j].im.pitch
						    : cpu_bytes;
			}
		njpeg = 0;
		if (!rc)
			rc = sl_host_room(ig->g, (void **)&ig->host, &ig->host_cap, &ig->host_pinned, cpu_bytes + 1);
		if (rc)
			goto out;
	}
	if (ncpu) {
		/* The CPU's images decode into the pinned buffer at their scratch places, then go up. */
		rc = sl__img_decode_many(b, it, ig->host, cpu, NULL);
		for (uint32_t j = 0; j < b->m && !rc; j++)
			if (cpu[j] && !b->bad[j])
				rc = SL_CU(cu->MemcpyHtoDAsync((sl_CUdeviceptr)(uintptr_t)(ig->scratch + it[j].im.src),
							       ig->host + it[j].im.src,
							       (size_t)it[j].info.h * (size_t)it[j].im.pitch, s),
					   "cuMemcpyHtoDAsync");
	}
	ig->n_gpu += njpeg;
	ig->n_cpu += ncpu;
	sl__img_rows(b, it);
	for (uint32_t j = 0, k = 0; j < b->m; j++)
		if (!b->bad[j])
			ig->imgs[k++] = it[j].im;
	if (!rc && b->kept) {
		sl_CUdeviceptr sp = (sl_CUdeviceptr)(uintptr_t)ig->scratch, ip = (sl_CUdeviceptr)(uintptr_t)ig->imgs_dev,
			       op = (sl_CUdeviceptr)(uintptr_t)out;
		struct sl_aug_params p = b->o->aug;
		void *args[] = { &sp, &ip, &p, &op };
		unsigned blocks = (unsigned)(((uint64_t)p.ow * p.oh + 255) / 256);

		rc = SL_CU(cu->MemcpyHtoDAsync(ip, ig->imgs, b->kept * sizeof(*ig->imgs), s), "cuMemcpyHtoDAsync");
		/* One launch a batch; a grid's y is at most 65535 images, so a larger batch takes more. */
		for (uint32_t at = 0; at < b->kept && !rc; at += 65535) {
			unsigned n = b->kept - at < 65535 ? b->kept - at : 65535;

			ip = (sl_CUdeviceptr)(uintptr_t)(ig->imgs_dev + at);
			rc = SL_CU(cu->LaunchKernel(ig->fn, blocks, n, 1, 256, 1, 1, 0, s, args, NULL), "cuLaunchKernel");
		}
	}
	if (!rc)
		rc = SL_CU(cu->EventRecord(ig->done, s), "cuEventRecord");
	ig->done_set = !rc;
	if (rc && it && jpeg && cpu)
		cu->StreamSynchronize(s); /* what was queued reads the host buffers the next batch would write */
out:
	free(it);
	free(jpeg);
	free(cpu);
	return rc;
}
