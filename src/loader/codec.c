/*
 * The loader's codecs (state.h's struct sl__codec), one table: what turns
 * stored bytes into what the batch holds.  zstd, a window codec: a
 * window's blocks decoded where its reader reads them (by nvCOMP for GPU
 * loaders, dsread/zgpu.c, or the CPU).  Images, a field codec: one
 * field's encoded images become a dense tensor of the options' size,
 * dtype and layout, decoded and augmented by each producer on the GPU
 * (nvJPEG and one kernel launch a batch, on the producer's stream) or by
 * the CPU's threads.  collate.c and window.c call them through the table.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "dsread/dsread.h"
#include "loader/state.h"

/* The image options checked into ld->img (the field among those loaded: ld->codec_f). */
static int sl_image_options(struct sluice_loader *ld, const struct sluice_image_options *in)
{
	struct sluice_image_options io;
	int rc;

	if ((rc = SL_SIZED_IN(&io, in, image_options)) || (rc = sl__img_opts_set(&ld->img, &io)))
		return rc;
	for (unsigned f = 0; f < ld->nf; f++)
		if (!strcmp(ld->ds->fields[ld->fidx[f]].name, io.field))
			ld->codec_f = (int)f;
	if (ld->codec_f < 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: %s has no loaded field '%s'", ld->ds->path,
			       io.field);
	if (ld->ds->fields[ld->fidx[ld->codec_f]].dtype != SLUICE_DTYPE_BYTES || ld->fixed[ld->codec_f])
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: field '%s' is not of variable-size bytes "
			       "(encoded images)", io.field);
	ld->img_decode = io.decode;
	return 0;
}

/*
 * nvJPEG's hardware backend drives each decoder through a dozen streams of
 * its own.  CUDA maps a context's streams onto CUDA_DEVICE_MAX_CONNECTIONS
 * hardware queues (8 unless set before CUDA starts), so with the default
 * the model's stream shares a queue with streams that wait on the JPEG
 * engines, and its kernels wait behind them: on an H100, ResNet-18's
 * training step, 21.5 ms alone, took 27-28 ms beside the decoding with 8
 * queues and 25-26 with 32 (docs/BENCHMARKS.md).  The variable is the
 * user's (some recipes want 1), so it is only asked for here.  (The rest
 * of that slowdown is the CUDA calls of other threads, which hold up the
 * training thread's launches: nvJPEG's hardware path makes about four an
 * image, which is why the producers take turns on one decoder,
 * image/gpu.c.)
 */
static void sl_connections_check(void)
{
	const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");

	if (!v || atoi(v) < 16)
		sl__warn("loader", "images on the GPU: CUDA_DEVICE_MAX_CONNECTIONS is %s: set it to 32 before CUDA "
			 "starts, or nvJPEG's streams share hardware queues with the model's and stall its kernels "
			 "(docs/guides/images.md)", v ? v : "unset (8)");
}

/*
 * zstd: a GPU loader's windows' blocks decoded by nvCOMP as SLUICE_DECODE
 * says (auto: where it loads; gpu: an error where it does not; cpu:
 * never), else by the CPU.  The records' CRCs check nvCOMP's output, so a
 * dataset without them is decoded by the CPU, whose zstd checks each
 * block's own checksum.
 */
static int sl_zstd_open(struct sluice_loader *ld, const struct sluice_loader_options *opt)
{
	const char *why = "the dataset has no record CRCs to check nvCOMP's output with";
	uint64_t w = 0;
	int rc;

	(void)opt;
	ld->znc = NULL;
	if (!ld->ds->compressed)
		return 0;
	if (!ld->opt.gpu)
		return 1;
	if ((rc = sl__setting_u64("SLUICE_DECODE", &w)) < 0)
		return rc;
	if (w == 2) /* cpu */
		return 1;
	if (ld->ds->has_crc)
		ld->znc = sl__nvcomp(&why);
	if (!ld->znc && w == 1)
		return sl__err(SLUICE_ENOGPU, "loader: %s: SLUICE_DECODE=gpu, but %s", ld->ds->path, why);
	if (!ld->znc)
		sl__info("loader", "%s: zstd blocks decoded by the CPU: %s", ld->ds->path, why);
	return 1;
}

/* A reader's nvCOMP decoder (its stream and buffers), or none: the CPU decodes. */
static int sl_zstd_reader_open(struct sluice_loader *ld, void **state)
{
	struct sl__zgpu *z = NULL;
	int rc = ld->znc ? sl__zgpu_open(&z, ld->gpu, ld->znc) : 0;

	*state = z;
	return rc ? sl__err(rc, "loader: nvCOMP for the zstd blocks: %s", sluice_last_error_detail()) : 0;
}

static void sl_zstd_reader_close(void *state)
{
	sl__zgpu_close(state);
}

static void sl_image_close(struct sluice_loader *ld);

/* Images: the options checked, then each producer's pipeline on the GPU (GPU loaders; else the CPU decodes). */
static int sl_image_open(struct sluice_loader *ld, const struct sluice_loader_options *opt)
{
	uint64_t decoders = 1; /* nvJPEG hardware decoders, the producers sharing them in turn (image/gpu.c) */
	int rc;

	if (!opt->image)
		return 0;
	if ((rc = sl_image_options(ld, opt->image)))
		return rc;
	if (ld->img_decode == SLUICE_IMAGE_DECODE_GPU && !ld->opt.gpu)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: decode GPU needs a GPU loader (gpu = 1); "
			       "CPU or AUTO decode on the CPU");
	/* The GPU's pipeline for a GPU loader: nvJPEG unless decode is CPU (AUTO: without it where it does not load). */
	if (ld->opt.gpu) {
		uint64_t n = 4;

		if ((rc = sl__setting_u64("SLUICE_IMAGE_PRODUCERS", &n)) < 0 ||
		    (rc = sl__setting_u64("SLUICE_IMAGE_DECODERS", &decoders)) < 0)
			return rc;
		ld->nprod = (unsigned)n;
	}
	for (unsigned p = 0; p < ld->nprod && ld->opt.gpu; p++) {
		int nvjpeg = ld->img_decode != SLUICE_IMAGE_DECODE_CPU;
		const char *why = NULL;
		struct sl__img_gpu *ig = NULL;

		if (nvjpeg && ld->img_decode == SLUICE_IMAGE_DECODE_AUTO && !sl__nvjpeg(&why)) {
			if (p == 0)
				sl__info("loader", "images decoded by the CPU: %s", why);
			nvjpeg = 0;
		}
		if (nvjpeg && p == 0)
			sl_connections_check();
		rc = sl__img_gpu_open(&ig, ld->gpu, nvjpeg, opt->batch_size < 4096 ? (unsigned)opt->batch_size : 4096,
				      p >= decoders ? ld->prod[p % decoders].codec : NULL);
		ld->prod[p].codec = ig;
		if (rc && ld->img_decode == SLUICE_IMAGE_DECODE_AUTO && rc != -ENOMEM) {
			/* No NVRTC (or no nvJPEG state): the CPU does it all, and the batch is copied up. */
			sl__info("loader", "images decoded and augmented by the CPU: %s", sluice_last_error_detail());
			sl_image_close(ld);
			ld->nprod = SL_PRODUCERS;
			return 1;
		}
		if (rc)
			return sl__err(rc, "loader: images on the GPU: %s", sluice_last_error_detail());
	}
	return 1;
}

static void sl_image_close(struct sluice_loader *ld)
{
	for (unsigned p = 0; p < SL_PRODUCERS_MAX; p++) {
		sl__img_gpu_close(ld->prod[p].codec);
		ld->prod[p].codec = NULL;
	}
}

static uint64_t sl_image_bound(const struct sluice_loader *ld, uint64_t m)
{
	return ld->img.out_bytes * m;
}

static int sl_image_on_gpu(const struct sl__producer *p)
{
	return p->codec != NULL;
}

/*
 * The batch's images decoded and augmented into their place (GPU memory by
 * the producer's pipeline, else host staging), before the other fields are
 * collated: a record that is not a whole image fails the batch, naming it,
 * or with skip_corrupt is left out of every field (rec and ids closed up).
 */
static int sl_image_decode(struct sl__producer *p, struct sl__batch_buf *s, struct sluice_record *rec, uint32_t *m,
			   uint64_t at)
{
	struct sluice_loader *ld = p->ld;
	const unsigned fi = ld->fidx[ld->codec_f];
	struct sl__img_rec *ir = malloc(*m * sizeof(*ir) + 1);
	uint8_t *bad = calloc(*m + 1, 1);
	struct sl__img_batch b = { .o = &ld->img, .seed = ld->opt.seed, .epoch = ld->opt.epoch, .m = *m, .rec = ir,
				   .bad = bad };
	uint64_t t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld);
	int rc = ir && bad ? 0 : -ENOMEM;

	for (uint32_t j = 0; j < *m && !rc; j++)
		ir[j] = (struct sl__img_rec){ (const unsigned char *)rec[j].data[fi], rec[j].len[fi], s->ids[j] };
	if (!rc)
		rc = p->codec ? sl__img_run_gpu(p->codec, &b, s->dev + at, p->stream) : sl__img_run_cpu(&b, s->host + at);
	atomic_fetch_add(&ld->img_gpu, b.n_gpu);
	atomic_fetch_add(&ld->img_cpu, b.n_cpu);
	atomic_fetch_add(&ld->nj_calls, b.nj_calls);
	if (!rc && b.nbad && !ld->opt.skip_corrupt)
		rc = sl__err(SLUICE_EFORMAT, "%s: record %llu: field '%s': %s", ld->ds->path, (unsigned long long)b.why_id,
			     ld->ds->fields[fi].name, b.why);
	if (!rc && b.nbad) {
		uint32_t k = 0;

		atomic_fetch_add(&ld->skipped, (uint64_t)b.nbad);
		for (uint32_t j = 0; j < *m; j++)
			if (!bad[j]) {
				rec[k] = rec[j];
				s->ids[k++] = s->ids[j];
			}
		*m = k;
	}
	free(ir);
	free(bad);
	sl__ld_span(ld, "images", t0, cpu0, s->g);
	return rc;
}

/* m images of the options' size as a 4-d tensor: NCHW, or NHWC (channels_last). */
static void sl_image_describe(const struct sluice_loader *ld, uint64_t m, struct sluice_batch_field *bf)
{
	const struct sl__img_opts *o = &ld->img;
	const int64_t n = (int64_t)m, h = o->oh, w = o->ow, nhwc = o->aug.nhwc;

	bf->dtype = (enum sluice_dtype)o->aug.dtype;
	bf->offsets = NULL;
	bf->host_offsets = NULL;
	bf->item_bytes = o->out_bytes;
	bf->ndim = 4;
	memcpy(bf->shape, nhwc ? (int64_t[]){ n, h, w, 3 } : (int64_t[]){ n, 3, h, w }, 4 * sizeof(int64_t));
	memcpy(bf->strides, nhwc ? (int64_t[]){ 3 * h * w, 3 * w, 3, 1 } : (int64_t[]){ 3 * h * w, h * w, w, 1 },
	       4 * sizeof(int64_t));
}

static const struct sl__codec sl_codecs[] = {
	{ .name = "zstd", .field = 0, .open = sl_zstd_open, .reader_open = sl_zstd_reader_open,
	  .reader_close = sl_zstd_reader_close },
	{ .name = "image", .field = 1, .open = sl_image_open, .close = sl_image_close, .bound = sl_image_bound,
	  .on_gpu = sl_image_on_gpu, .decode = sl_image_decode, .describe = sl_image_describe },
};

int sl__loader_codecs_open(struct sluice_loader *ld, const struct sluice_loader_options *opt)
{
	ld->codec_f = -1;
	ld->wcodec = ld->fcodec = NULL;
	for (size_t i = 0; i < sizeof(sl_codecs) / sizeof(sl_codecs[0]); i++) {
		const struct sl__codec *c = &sl_codecs[i];
		int rc = c->open(ld, opt);

		if (rc < 0) {
			sl__loader_codecs_close(ld);
			return rc;
		}
		if (rc && c->field)
			ld->fcodec = c; /* one field codec a loader (the image options name one field) */
		else if (rc)
			ld->wcodec = c;
	}
	return 0;
}

void sl__loader_codecs_close(struct sluice_loader *ld)
{
	for (size_t i = 0; i < sizeof(sl_codecs) / sizeof(sl_codecs[0]); i++)
		if (sl_codecs[i].close)
			sl_codecs[i].close(ld);
	ld->wcodec = ld->fcodec = NULL;
}
