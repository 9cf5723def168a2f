/*
 * A producer's images on the GPU: JPEGs decoded in one nvJPEG batch (the
 * hardware decoders' backend where the GPU has them, as torchvision
 * does), what nvJPEG's batch cannot take (PNG, WebP, progressive, CMYK)
 * decoded by the CPU's threads and copied beside them, then augment.h's
 * kernel over the whole batch in one launch.  Everything runs on the
 * producer's stream; the host buffers it fills are reused only once the
 * stream is past the previous batch (the event done).  nvJPEG reads the
 * JPEGs where the records lie, in the loader's windows (registered with
 * the driver: stage.c asks for it), with no copy of its own; a batch's run
 * returns only once the stream is past nvJPEG's work (the event read), as
 * the windows are read again as soon as the batch is made.
 *
 * The hardware backend's decoder is one a loader, its producers taking
 * turns (each still probes, plans and stages its batch on its own): every
 * thread inside CUDA's driver holds up the training thread's launches, and
 * nvJPEG's hardware path makes about four calls an image (issue #54: with
 * four decoders ResNet-18 trained at 0.78x its speed on a constant batch,
 * with one at 0.89x, docs/BENCHMARKS.md).  It writes RGB, its chroma
 * upsampled as libjpeg's "fancy" upsampling does (the flag below), with a
 * kernel an image rather than JPEG's three planes with a copy each.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "image/run.h"
#include "image_augment_src.h" /* sl_augment_src: augment.h as text, made by CMake */

/*
 * nvJPEG's decoder: a handle and a batched state.  The hardware backend's
 * is shared by a loader's producers, each batch's decode queued under
 * `lane` once the previous one's is done; the hybrid backend's (no JPEG
 * engines: Huffman decoding on the calling thread) is one a producer.
 */
/*
 * The events a producer waits for on the host (its last batch, the shared
 * decoder's): it sleeps in the driver rather than spinning on a core while
 * the JPEG engines work, since the wait is as long as a batch's decoding.
 */
#define SL_HOST_WAITED (SL_CU_EVENT_DISABLE_TIMING | SL_CU_EVENT_BLOCKING_SYNC)

struct sl_jdec {
	const struct sl__nvjpeg_api *nj;
	sl_nvjpegHandle_t h;
	sl_nvjpegJpegState_t st;
	int hw;                              /* a hardware backend */
	int rgb;                             /* it writes RGB (interpolated chroma), not JPEG's planes */
	int inited;                          /* the batch size nvJPEG's state was initialised for (0: none) */
	sl_CUevent done;                     /* the state's last batch decoded (shared: the next one waits for it) */
	int done_set, refs;
	pthread_mutex_t lane;
};

struct sl__img_gpu {
	const struct sl__gpu *g;
	const struct sl__nvjpeg_api *nj;     /* NULL: the CPU decodes every image */
	struct sl_jdec *dec;                 /* its own or shared (NULL: the CPU decodes every image) */
	sl_nvjpegJpegStream_t js;            /* this producer's: the headers it parses */
	sl_CUfunction fn;
	sl_CUevent done;
	int done_set;
	sl_CUevent read;                       /* the stream past nvJPEG's work: it has read the batch's JPEGs */
	struct sl__gbuf scratch;               /* GPU: the decoded images */
	struct sl__gbuf imgs, imgs_dev;        /* the kernel's per-image table (struct sl_aug_img): pinned host, GPU */
	struct sl__gbuf host;                  /* pinned: the CPU's decoded images, before their copy */
};

#define SL_NJ(call, what) sl_nj_err((call), what)
static int sl_nj_err(int st, const char *what)
{
	return st ? sl__err(SLUICE_ECUDA, "nvJPEG %s: status %d", what, st) : 0;
}

/* The time since *t charged to phase ph of b, *t moved on to now. */
static void sl_lap(struct sl__img_batch *b, enum sl__img_phase ph, uint64_t *t)
{
	const uint64_t now = sl__now_ns();

	b->ns[ph] += now - *t;
	*t = now;
}

/* ig's decoder is shared: its GPU work is queued under dec->lane, one producer at a time. */
static int sl_shared(const struct sl__img_gpu *ig)
{
	return ig->dec && ig->dec->refs > 1;
}

static void sl_jdec_put(const struct sl__gpu *g, struct sl_jdec *d)
{
	if (!d || --d->refs > 0)
		return;
	if (d->done && !sl__gpu_bind(g)) {
		if (d->done_set)
			SL_CU_RAW(g->cu->EventSynchronize(d->done));
		SL_CU_RAW(g->cu->EventDestroy(d->done));
	}
	if (d->st)
		d->nj->JpegStateDestroy(d->st);
	if (d->h)
		d->nj->Destroy(d->h);
	pthread_mutex_destroy(&d->lane);
	free(d);
}

/*
 * nvJPEG's hardware backend where the GPU has its engines, writing RGB with
 * chroma interpolated (NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, nvJPEG
 * 12.1 on; an nvJPEG that refuses the flag writes JPEG's planes, which the
 * kernel converts), else its hybrid one; the hardware one's memory made
 * ahead for a batch of `batch` (nvjpegDecodeBatchedPreAllocate, as
 * nvImageCodec does: it keeps a pool then, and a batch of images of other
 * sizes allocates nothing).
 */
static int sl_jdec_open(const struct sl__gpu *g, const struct sl__nvjpeg_api *nj, unsigned batch, struct sl_jdec **out)
{
	struct sl_jdec *d = calloc(1, sizeof(*d));
	int st, rc;

	if (!d)
		return -ENOMEM;
	d->nj = nj;
	d->refs = 1;
	pthread_mutex_init(&d->lane, NULL);
	st = nj->CreateEx(SL_NVJPEG_BACKEND_HARDWARE, NULL, NULL, SL_NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, &d->h);
	d->rgb = st == 0;
	if (st && st != SL_NVJPEG_STATUS_ARCH_MISMATCH)
		st = nj->CreateEx(SL_NVJPEG_BACKEND_HARDWARE, NULL, NULL, 0, &d->h);
	d->hw = st == 0;
	if (st == SL_NVJPEG_STATUS_ARCH_MISMATCH) /* no hardware decoders: the GPU's hybrid backend */
		st = nj->CreateEx(SL_NVJPEG_BACKEND_DEFAULT, NULL, NULL, 0, &d->h);
	rc = SL_NJ(st, "nvjpegCreateEx");
	if (!rc)
		rc = SL_NJ(nj->JpegStateCreate(d->h, &d->st), "nvjpegJpegStateCreate");
	if (!rc)
		rc = SL_CU(g->cu->EventCreate(&d->done, SL_HOST_WAITED), "cuEventCreate");
	if (!rc && d->hw && nj->DecodeBatchedPreAllocate && batch &&
	    nj->DecodeBatchedPreAllocate(d->h, d->st, (int)batch, 1, 1, SL_NVJPEG_CSS_444, SL_NVJPEG_OUTPUT_RGBI))
		sl__info("loader", "nvJPEG did not pre-allocate for a batch of %u: each batch allocates", batch);
	if (rc) {
		sl_jdec_put(g, d);
		return rc;
	}
	*out = d;
	return 0;
}

int sl__img_gpu_open(struct sl__img_gpu **out, const struct sl__gpu *g, int nvjpeg, unsigned batch,
		     struct sl__img_gpu *share)
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
		rc = SL_CU(g->cu->EventCreate(&ig->done, SL_HOST_WAITED), "cuEventCreate");
	if (!rc)
		rc = SL_CU(g->cu->EventCreate(&ig->read, SL_HOST_WAITED), "cuEventCreate");
	if (!rc && nvjpeg && !(ig->nj = sl__nvjpeg(&why)))
		rc = sl__err(SLUICE_ENOGPU, "%s", why);
	if (!rc && ig->nj && share && share->dec && share->dec->hw) {
		ig->dec = share->dec;
		ig->dec->refs++;
	} else if (!rc && ig->nj) {
		rc = sl_jdec_open(g, ig->nj, batch, &ig->dec);
	}
	if (!rc && ig->dec)
		rc = SL_NJ(ig->nj->JpegStreamCreate(ig->dec->h, &ig->js), "nvjpegJpegStreamCreate");
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
			SL_CU_RAW(ig->g->cu->EventSynchronize(ig->done));
		if (ig->done)
			SL_CU_RAW(ig->g->cu->EventDestroy(ig->done));
		if (ig->read)
			SL_CU_RAW(ig->g->cu->EventDestroy(ig->read));
	}
	if (ig->js)
		ig->nj->JpegStreamDestroy(ig->js);
	sl_jdec_put(ig->g, ig->dec);
	sl__gbuf_free(ig->g, &ig->scratch);
	sl__gbuf_free(ig->g, &ig->imgs_dev);
	sl__gbuf_free(ig->g, &ig->imgs);
	sl__gbuf_free(ig->g, &ig->host);
	free(ig);
}

/* Where image j's decoded pixels end in the scratch (and in the host buffer at the same places). */
static size_t sl_end(const struct sl__img_item *it)
{
	return it->im.src + (size_t)it->info.h * (size_t)it->im.pitch;
}

/*
 * 1 if nvJPEG's batch takes record j (a JPEG its backend decodes whole),
 * its image then planned as nvJPEG writes it: RGB, or where the hardware
 * backend refused the interpolation flag JPEG's own planes (Y, Cb, Cr as
 * sampled), written with a copy each, which the kernel converts.
 */
static int sl_nvjpeg_takes(struct sl__img_gpu *ig, const struct sl__img_rec *r, const struct sl__img_info *info,
			   struct sl_aug_img *im)
{
	int unsupported = 1;
	unsigned nc = 0, w[3] = { 0 }, h[3] = { 0 };

	/* CMYK, and RGB stored as such, which nvJPEG would take for YCbCr: the CPU's libjpeg knows them. */
	if (!ig->nj || info->kind != SL_IMG_JPEG || info->ncomp == 4 || info->rgb)
		return 0;
	if (!ig->dec->hw)
		return 1;
	/* The header parsed once: what nvJPEG's batch takes and the sizes it found are the stream's. */
	if (!info->baseline || ig->nj->JpegStreamParseHeader(ig->dec->h, r->p, r->n, ig->js) ||
	    ig->nj->DecodeBatchedSupported(ig->dec->h, ig->js, &unsupported) || unsupported ||
	    ig->nj->JpegStreamGetComponentsNum(ig->js, &nc) || nc != (unsigned)info->ncomp || (nc != 1 && nc != 3))
		return 0;
	for (unsigned c = 0; c < nc; c++)
		if (ig->nj->JpegStreamGetComponentDimensions(ig->js, c, &w[c], &h[c]))
			return 0;
	if (w[0] != info->w || h[0] != info->h ||
	    (nc == 3 && (w[1] < 1 || h[1] < 1 || w[1] > w[0] || h[1] > h[0] || w[2] != w[1] || h[2] != h[1])))
		return 0; /* nvJPEG reads the header otherwise than sluice: the CPU decodes it */
	if (ig->dec->rgb) { /* nvJPEG converts (a kernel an image): RGB as the CPU's decoder writes it */
		im->fmt = SL_AUG_RGB;
		im->pitch = (int)info->w * 3;
		return 1;
	}
	im->fmt = nc == 1 ? SL_AUG_GREY : SL_AUG_YCC;
	im->pitch = (int)w[0];
	im->cw = nc == 1 ? 0 : (int)w[1];
	im->ch = nc == 1 ? 0 : (int)h[1];
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
	size_t *len = malloc(n * sizeof(*len));
	struct sl_nvjpegImage *dst = calloc(n, sizeof(*dst));
	struct sl_jdec *d = ig->dec;
	const int shared = sl_shared(ig);
	sl_CUresult rec;
	uint32_t k = 0;
	int st = -1;
	uint64_t t = sl__now_ns();

	if (data && len && dst) {
		for (uint32_t j = 0; j < b->m; j++) {
			if (!jpeg[j])
				continue;
			data[k] = b->rec[j].p; /* in its window: the batch's run waits until nvJPEG has read it */
			len[k] = b->rec[j].n;
			for (int c = 0; c < (it[j].im.fmt == SL_AUG_YCC ? 3 : 1); c++) {
				size_t y = (size_t)it[j].im.pitch * (size_t)it[j].im.h, cc = (size_t)it[j].im.cw * it[j].im.ch;

				dst[k].channel[c] = (unsigned char *)ig->scratch.p + it[j].im.src + (c ? y + (size_t)(c - 1) * cc : 0);
				dst[k].pitch[c] = (size_t)(c ? it[j].im.cw : it[j].im.pitch);
			}
			k++;
		}
		if (shared)
			pthread_mutex_lock(&d->lane);
		sl_lap(b, SL_IMG_T_LANE, &t);
		/* A shared state: the batch another producer decoded in it is done first (nvImageCodec's order). */
		st = shared && d->done_set ? SL_CU(ig->g->cu->EventSynchronize(d->done), "cuEventSynchronize") : 0;
		sl_lap(b, SL_IMG_T_SHARED, &t);
		if (!st && d->inited != (int)n) {
			st = ig->nj->DecodeBatchedInitialize(d->h, d->st, (int)n, 1,
							     d->hw && !d->rgb ? SL_NVJPEG_OUTPUT_UNCHANGED : SL_NVJPEG_OUTPUT_RGBI);
			d->inited = st ? 0 : (int)n;
			b->nj_calls++;
		}
		if (!st) {
			st = ig->nj->DecodeBatched(d->h, d->st, data, len, dst, s);
			b->nj_calls++;
		}
		if (st)
			d->inited = 0; /* nvJPEG asks for a new initialisation after a failed batch */
		/*
		 * Recorded after a failed batch too: what nvJPEG queued on the shared
		 * state before it failed is waited for by the next producer as well.
		 */
		rec = SL_CU_RAW(ig->g->cu->EventRecord(d->done, s));
		if (rec == SL_CUDA_SUCCESS)
			d->done_set = 1;
		else if (!st)
			st = sl__cuda_err(rec, "cuEventRecord");
		if (shared)
			pthread_mutex_unlock(&d->lane);
		sl_lap(b, SL_IMG_T_DECODE, &t);
		/*
		 * The windows hold the JPEGs until the batch is made, no longer:
		 * the stream past what nvJPEG queued (after a failed batch too),
		 * or, where the event cannot be had, the whole stream.
		 */
		rec = SL_CU_RAW(ig->g->cu->EventRecord(ig->read, s));
		rec = rec == SL_CUDA_SUCCESS ? SL_CU_RAW(ig->g->cu->EventSynchronize(ig->read)) : rec;
		if (rec != SL_CUDA_SUCCESS && (rec = SL_CU_RAW(ig->g->cu->StreamSynchronize(s))) != SL_CUDA_SUCCESS && !st)
			st = sl__cuda_err(rec, "cuStreamSynchronize");
		sl_lap(b, SL_IMG_T_READ, &t);
	}
	free(data);
	free(len);
	free(dst);
	return st;
}

/*
 * Which of the batch's images nvJPEG takes (jpeg[j]) and which the CPU
 * decodes (cpu[j]), and room for them all: the scratch, the JPEGs for
 * nvJPEG, the CPU's decoded images, the kernel's table.
 */
static int sl_route(struct sl__img_gpu *ig, struct sl__img_batch *b, struct sl__img_item *it, uint8_t *jpeg, uint8_t *cpu)
{
	size_t total = sl__img_layout(b, it), cpu_bytes = 0;
	const char *what = "images";
	int rc;

	for (uint32_t j = 0; j < b->m; j++) {
		if (b->bad[j])
			continue;
		jpeg[j] = (uint8_t)sl_nvjpeg_takes(ig, &b->rec[j], &it[j].info, &it[j].im);
		cpu[j] = !jpeg[j];
		cpu_bytes = cpu[j] ? sl_end(&it[j]) : cpu_bytes;
	}
	if (!(rc = sl__gbuf_room(ig->g, &ig->scratch, total + 1, 1, what)) &&
	    !(rc = sl__gbuf_room(ig->g, &ig->host, cpu_bytes + 1, 0, what)) &&
	    !(rc = sl__gbuf_room(ig->g, &ig->imgs, b->m * sizeof(struct sl_aug_img) + 1, 0, what)))
		rc = sl__gbuf_room(ig->g, &ig->imgs_dev, b->m * sizeof(struct sl_aug_img) + 1, 1, what);
	return rc;
}

/*
 * nvJPEG refused the batch of jpeg[]: the CPU decodes those images too, and
 * finds any that are not whole, once the stream is past what nvJPEG queued.
 */
static int sl_to_cpu(struct sl__img_gpu *ig, struct sl__img_batch *b, struct sl__img_item *it, uint8_t *jpeg,
		     uint8_t *cpu, sl_CUstream s)
{
	size_t cpu_bytes = 0;
	int rc = SL_CU(ig->g->cu->StreamSynchronize(s), "cuStreamSynchronize");

	for (uint32_t j = 0; j < b->m; j++) {
		if (jpeg[j]) {
			sl_as_rgb(&it[j]);
			cpu[j] = 1;
			jpeg[j] = 0;
		}
		cpu_bytes = cpu[j] && sl_end(&it[j]) > cpu_bytes ? sl_end(&it[j]) : cpu_bytes;
	}
	return rc ? rc : sl__gbuf_room(ig->g, &ig->host, cpu_bytes + 1, 0, "images");
}

/* The CPU's images decoded into the pinned buffer at their scratch places, then copied up beside nvJPEG's. */
static int sl_cpu_images(struct sl__img_gpu *ig, struct sl__img_batch *b, struct sl__img_item *it, const uint8_t *cpu,
			 sl_CUstream s)
{
	unsigned char *host = ig->host.p, *scratch = ig->scratch.p;
	int rc = 0, any = 0;

	for (uint32_t j = 0; j < b->m; j++)
		any |= cpu[j];
	if (any)
		rc = sl__img_decode_many(b, it, host, cpu, NULL);

	for (uint32_t j = 0; j < b->m && !rc; j++)
		if (cpu[j] && !b->bad[j])
			rc = SL_CU(ig->g->cu->MemcpyHtoDAsync((sl_CUdeviceptr)(uintptr_t)(scratch + it[j].im.src),
							      host + it[j].im.src, sl_end(&it[j]) - it[j].im.src, s),
				   "cuMemcpyHtoDAsync");
	return rc;
}

/* The kept images' table up, and the kernel over them into out: one launch (a grid's y holds 65535 images). */
static int sl_augment(struct sl__img_gpu *ig, struct sl__img_batch *b, struct sl__img_item *it, void *out,
		      sl_CUstream s)
{
	const struct sl__cuda_api *cu = ig->g->cu;
	struct sl_aug_img *imgs = ig->imgs.p;
	sl_CUdeviceptr sp = (sl_CUdeviceptr)(uintptr_t)ig->scratch.p, ip = (sl_CUdeviceptr)(uintptr_t)ig->imgs_dev.p,
		       op = (sl_CUdeviceptr)(uintptr_t)out;
	struct sl_aug_params p = b->o->aug;
	void *args[] = { &sp, &ip, &p, &op };
	const unsigned blocks = (unsigned)(((uint64_t)p.ow * p.oh + 255) / 256);
	int rc;

	sl__img_rows(b, it);
	for (uint32_t j = 0, k = 0; j < b->m; j++)
		if (!b->bad[j])
			imgs[k++] = it[j].im;
	if (!b->kept)
		return 0;
	rc = SL_CU(cu->MemcpyHtoDAsync(ip, imgs, b->kept * sizeof(*imgs), s), "cuMemcpyHtoDAsync");
	for (uint32_t at = 0; at < b->kept && !rc; at += 65535) {
		unsigned n = b->kept - at < 65535 ? b->kept - at : 65535;

		ip = (sl_CUdeviceptr)(uintptr_t)((struct sl_aug_img *)ig->imgs_dev.p + at);
		rc = SL_CU(cu->LaunchKernel(ig->fn, blocks, n, 1, 256, 1, 1, 0, s, args, NULL), "cuLaunchKernel");
	}
	return rc;
}

int sl__img_run_gpu(struct sl__img_gpu *ig, struct sl__img_batch *b, void *out, void *stream)
{
	const struct sl__cuda_api *cu = ig->g->cu;
	sl_CUstream s = stream;
	struct sl__img_item *it = calloc(b->m ? b->m : 1, sizeof(*it));
	uint8_t *jpeg = calloc(b->m ? b->m : 1, 1), *cpu = calloc(b->m ? b->m : 1, 1);
	uint32_t njpeg = 0;
	uint64_t t = sl__now_ns();
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
	sl_lap(b, SL_IMG_T_LAST, &t);
	if (!rc)
		rc = sl_route(ig, b, it, jpeg, cpu);
	for (uint32_t j = 0; j < b->m && !rc; j++)
		njpeg += jpeg[j];
	sl_lap(b, SL_IMG_T_PARSE, &t);
	if (!rc && njpeg && sl_nvjpeg_batch(ig, b, it, jpeg, njpeg, s))
		rc = sl_to_cpu(ig, b, it, jpeg, cpu, s);
	t = sl__now_ns();
	if (!rc)
		rc = sl_cpu_images(ig, b, it, cpu, s);
	sl_lap(b, SL_IMG_T_CPU, &t);
	if (sl_shared(ig))
		pthread_mutex_lock(&ig->dec->lane);
	sl_lap(b, SL_IMG_T_LANE, &t);
	if (!rc)
		rc = sl_augment(ig, b, it, out, s);
	if (!rc)
		rc = SL_CU(cu->EventRecord(ig->done, s), "cuEventRecord");
	if (sl_shared(ig))
		pthread_mutex_unlock(&ig->dec->lane);
	sl_lap(b, SL_IMG_T_AUGMENT, &t);
	ig->done_set = !rc;
	if (rc && it && jpeg && cpu)
		SL_CU_RAW(cu->StreamSynchronize(s)); /* what was queued reads the host buffers the next batch would write */
	for (uint32_t j = 0; j < b->m && !rc; j++) {
		b->n_gpu += jpeg[j] && !b->bad[j];
		b->n_cpu += cpu[j] && !b->bad[j];
	}
	free(it);
	free(jpeg);
	free(cpu);
	return rc;
}
