/*
 * The loader's stages (state.h's struct sl__stage_ops), one table: what
 * turns stored bytes into what the batch holds, each stage with a state of
 * its own, its setup, run, close, stats and error policy.  zstd, a window
 * stage: a window's blocks decoded where its reader reads them (by nvCOMP
 * for GPU loaders, dsread/zgpu.c, or the CPU), each reader its decoder.
 * Images, a field stage: one field's encoded images become a dense tensor
 * of the options' size, dtype and layout, decoded and augmented by each
 * producer on the GPU (nvJPEG and one kernel launch a batch, on the
 * producer's stream) or by the CPU's threads.  collate.c and window.c call
 * them through the table; the fields no stage makes are collated as stored.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "dsread/dsread.h"
#include "loader/state.h"

/* The image stage's state: its options, each producer's GPU pipeline (NULL: the CPU decodes), its counts. */
struct sl_images {
	struct sl__img_opts img;
	int decode;                              /* enum sluice_image_decode */
	struct sl__img_gpu *gpu[SL_PRODUCERS_MAX];
	_Atomic uint64_t n_gpu, n_cpu, nj_calls; /* images decoded by nvJPEG, by the CPU; calls into nvJPEG */
	_Atomic uint64_t batches_gpu, ns[SL_IMG_PHASES]; /* batches through a GPU pipeline, their host time by phase */
};

/* The image options checked into im (the field among those loaded: st->field). */
static int sl_image_options(struct sluice_loader *ld, struct sl__stage *st, struct sl_images *im,
			    const struct sluice_image_options *in)
{
	struct sluice_image_options io;
	int rc;

	if ((rc = SL_SIZED_IN(&io, in, image_options)) || (rc = sl__img_opts_set(&im->img, &io)))
		return rc;
	for (unsigned f = 0; f < ld->nf; f++)
		if (!strcmp(ld->ds->fields[ld->fidx[f]].name, io.field))
			st->field = (int)f;
	if (st->field < 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: %s has no loaded field '%s'", ld->ds->path,
			       io.field);
	if (ld->ds->fields[ld->fidx[st->field]].dtype != SLUICE_DTYPE_BYTES || ld->fixed[st->field])
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: field '%s' is not of variable-size bytes "
			       "(encoded images)", io.field);
	im->decode = io.decode;
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
static int sl_zstd_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	const char *why = "the dataset has no record CRCs to check nvCOMP's output with";
	const struct sl__nvcomp_api *znc = NULL;
	uint64_t w = 0;
	int rc;

	(void)opt;
	if (!ld->ds->compressed)
		return 0;
	if (!ld->opt.gpu)
		return 1;
	if ((rc = sl__setting_u64("SLUICE_DECODE", &w)) < 0)
		return rc;
	if (w == 2) /* cpu */
		return 1;
	if (ld->ds->has_crc)
		znc = sl__nvcomp(&why);
	if (!znc && w == 1)
		return sl__err(SLUICE_ENOGPU, "loader: %s: SLUICE_DECODE=gpu, but %s", ld->ds->path, why);
	if (!znc)
		sl__info("loader", "%s: zstd blocks decoded by the CPU: %s", ld->ds->path, why);
	st->state = (void *)znc; /* the library's table: nothing of the stage's own to free */
	return 1;
}

/* With nvCOMP, a window's read, decode and copies are serial in its reader: more readers. */
static unsigned sl_zstd_readers(const struct sl__stage *st)
{
	return st->state ? SL_READERS_GPU_ZSTD : 0;
}

/* A reader's nvCOMP decoder (its stream and buffers), or none: the CPU decodes. */
static int sl_zstd_reader_open(const struct sl__stage *st, void **state)
{
	struct sl__zgpu *z = NULL;
	int rc = st->state ? sl__zgpu_open(&z, st->ld->gpu, st->state) : 0;

	*state = z;
	return rc ? sl__err(rc, "loader: nvCOMP for the zstd blocks: %s", sluice_last_error_detail()) : 0;
}

static void sl_zstd_reader_close(void *state)
{
	sl__zgpu_close(state);
}

static void sl_image_gpu_close(struct sl_images *im)
{
	for (unsigned p = 0; p < SL_PRODUCERS_MAX; p++) {
		sl__img_gpu_close(im->gpu[p]);
		im->gpu[p] = NULL;
	}
}

static void sl_image_close(struct sl__stage *st)
{
	if (st->state)
		sl_image_gpu_close(st->state);
	free(st->state);
	st->state = NULL;
}

/* Each producer's pipeline on the GPU: nvJPEG unless decode is CPU (AUTO: without it where it does not load). */
static int sl_image_gpu_open(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl_images *im)
{
	uint64_t n = 4, decoders = 1; /* nvJPEG hardware decoders, the producers sharing them in turn (image/gpu.c) */
	int rc;

	if ((rc = sl__setting_u64("SLUICE_IMAGE_PRODUCERS", &n)) < 0 ||
	    (rc = sl__setting_u64("SLUICE_IMAGE_DECODERS", &decoders)) < 0)
		return rc;
	ld->nprod = (unsigned)n;
	for (unsigned p = 0; p < ld->nprod; p++) {
		int nvjpeg = im->decode != SLUICE_IMAGE_DECODE_CPU;
		const char *why = NULL;

		if (nvjpeg && im->decode == SLUICE_IMAGE_DECODE_AUTO && !sl__nvjpeg(&why)) {
			if (p == 0)
				sl__info("loader", "images decoded by the CPU: %s", why);
			nvjpeg = 0;
		}
		if (nvjpeg && p == 0)
			sl_connections_check();
		rc = sl__img_gpu_open(&im->gpu[p], ld->gpu, nvjpeg, opt->batch_size < 4096 ? (unsigned)opt->batch_size : 4096,
				      p >= decoders ? im->gpu[p % decoders] : NULL);
		if (rc && im->decode == SLUICE_IMAGE_DECODE_AUTO && rc != -ENOMEM) {
			/* No NVRTC (or no nvJPEG state): the CPU does it all, and the batch is copied up. */
			sl__info("loader", "images decoded and augmented by the CPU: %s", sluice_last_error_detail());
			sl_image_gpu_close(im);
			ld->nprod = SL_PRODUCERS;
			ld->win_pin = NULL;
			return 0;
		}
		if (rc)
			return sl__err(rc, "loader: images on the GPU: %s", sluice_last_error_detail());
		/* nvJPEG reads the JPEGs from the windows, each DMA'd up from them by the driver: registered memory. */
		if (nvjpeg)
			ld->win_pin = ld->gpu;
	}
	return 0;
}

/* Images: the options checked, then each producer's pipeline on the GPU (GPU loaders; else the CPU decodes). */
static int sl_image_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	struct sl_images *im;
	int rc;

	if (!opt->image)
		return 0;
	if (!(im = calloc(1, sizeof(*im))))
		return -ENOMEM;
	st->state = im;
	rc = sl_image_options(ld, st, im, opt->image);
	if (!rc && im->decode == SLUICE_IMAGE_DECODE_GPU && !ld->opt.gpu)
		rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: decode GPU needs a GPU loader (gpu = 1); "
			     "CPU or AUTO decode on the CPU");
	if (!rc && ld->opt.gpu)
		rc = sl_image_gpu_open(ld, opt, im);
	if (rc) {
		sl_image_close(st);
		return rc;
	}
	return 1;
}

static uint64_t sl_image_bound(const struct sl__stage *st, uint64_t m)
{
	return ((const struct sl_images *)st->state)->img.out_bytes * m;
}

static int sl_image_on_gpu(const struct sl__stage *st, unsigned p)
{
	return ((const struct sl_images *)st->state)->gpu[p] != NULL;
}

/*
 * The batch's images decoded and augmented into their place (GPU memory by
 * the producer's pipeline, else host staging), before the other fields are
 * collated: a record that is not a whole image fails the batch, naming it,
 * or with skip_corrupt (the stage's policy, st->skip_bad) is left out of
 * every field (rec and ids closed up).
 */
static int sl_image_run(struct sl__stage *st, struct sl__producer *p, struct sl__batch_buf *s,
			struct sluice_record *rec, uint32_t *m, uint64_t at)
{
	struct sluice_loader *ld = st->ld;
	struct sl_images *im = st->state;
	struct sl__img_gpu *ig = im->gpu[p - ld->prod];
	const unsigned fi = ld->fidx[st->field];
	struct sl__img_rec *ir = malloc(*m * sizeof(*ir) + 1);
	uint8_t *bad = calloc(*m + 1, 1);
	struct sl__img_batch b = { .o = &im->img, .seed = ld->opt.seed, .epoch = ld->opt.epoch, .m = *m, .rec = ir,
				   .bad = bad };
	uint64_t t0 = sl__now_ns(), cpu0 = sl__ld_cpu(ld);
	int rc = ir && bad ? 0 : -ENOMEM;

	for (uint32_t j = 0; j < *m && !rc; j++)
		ir[j] = (struct sl__img_rec){ (const unsigned char *)rec[j].data[fi], rec[j].len[fi], s->ids[j] };
	if (!rc)
		rc = ig ? sl__img_run_gpu(ig, &b, s->dev + at, p->stream) : sl__img_run_cpu(&b, s->host + at);
	atomic_fetch_add(&im->n_gpu, b.n_gpu);
	atomic_fetch_add(&im->n_cpu, b.n_cpu);
	atomic_fetch_add(&im->nj_calls, b.nj_calls);
	atomic_fetch_add(&im->batches_gpu, ig != NULL);
	for (unsigned k = 0; k < SL_IMG_PHASES; k++)
		atomic_fetch_add(&im->ns[k], b.ns[k]);
	if (!rc && b.nbad && !st->skip_bad)
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
static void sl_image_describe(const struct sl__stage *st, uint64_t m, struct sluice_batch_field *bf)
{
	const struct sl__img_opts *o = &((const struct sl_images *)st->state)->img;
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

static void sl_image_counts(const struct sl__stage *st, struct sl__stage_counts *c)
{
	const struct sl_images *im = st->state;

	c->images_gpu += atomic_load(&im->n_gpu);
	c->images_cpu += atomic_load(&im->n_cpu);
	c->nvjpeg_calls += atomic_load(&im->nj_calls);
	c->image_batches_gpu += atomic_load(&im->batches_gpu);
	for (unsigned k = 0; k < SL_IMG_PHASES; k++)
		c->image_ns[k] += atomic_load(&im->ns[k]);
}

static const struct sl__stage_ops sl_stages[] = {
	{ .name = "zstd", .window = 1, .setup = sl_zstd_setup, .readers = sl_zstd_readers,
	  .reader_open = sl_zstd_reader_open, .reader_close = sl_zstd_reader_close },
	{ .name = "images", .setup = sl_image_setup, .close = sl_image_close, .bound = sl_image_bound,
	  .on_gpu = sl_image_on_gpu, .run = sl_image_run, .describe = sl_image_describe, .counts = sl_image_counts },
};

const struct sl__stage_ops *sl__stage_table(size_t *n)
{
	*n = sizeof(sl_stages) / sizeof(sl_stages[0]);
	return sl_stages;
}

int sl__stages_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt,
		     const struct sl__stage_ops *ops, size_t nops)
{
	ld->nstage = 0;
	ld->wstage = NULL;
	for (unsigned f = 0; f < SLUICE_MAX_FIELDS; f++)
		ld->fstage[f] = NULL;
	for (size_t i = 0; i < nops; i++) {
		struct sl__stage *st;
		int rc;

		if (ld->nstage == SL_STAGES_MAX)
			return sl__err(SLUICE_EINVAL_CONFIG, "loader: more than %d stages", SL_STAGES_MAX);
		st = &ld->stage[ld->nstage];
		*st = (struct sl__stage){ .ops = &ops[i], .ld = ld, .field = -1, .skip_bad = ld->opt.skip_corrupt };
		if ((rc = ops[i].setup(ld, opt, st)) < 0) {
			sl__stages_close(ld);
			return rc;
		}
		if (!rc)
			continue;
		ld->nstage++;
		rc = 0;
		if (ops[i].window && ld->wstage) {
			rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: stages %s and %s both decode the windows",
				     ld->wstage->ops->name, ops[i].name);
		} else if (ops[i].window) {
			ld->wstage = st;
		} else if (st->field < 0 || (unsigned)st->field >= ld->nf) {
			rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: stage %s names no loaded field", ops[i].name);
		} else if (ld->fstage[st->field]) {
			rc = sl__err(SLUICE_EINVAL_CONFIG, "loader: field '%s': stages %s and %s both make it",
				     ld->ds->fields[ld->fidx[st->field]].name, ld->fstage[st->field]->ops->name, ops[i].name);
		} else {
			ld->fstage[st->field] = st;
		}
		if (rc) {
			sl__stages_close(ld);
			return rc;
		}
	}
	return 0;
}

void sl__stages_close(struct sluice_loader *ld)
{
	for (unsigned i = 0; i < ld->nstage; i++)
		if (ld->stage[i].ops->close)
			ld->stage[i].ops->close(&ld->stage[i]);
	ld->nstage = 0;
	ld->wstage = NULL;
	for (unsigned f = 0; f < SLUICE_MAX_FIELDS; f++)
		ld->fstage[f] = NULL;
}

void sl__stages_count(const struct sluice_loader *ld, struct sl__stage_counts *c)
{
	memset(c, 0, sizeof(*c));
	for (unsigned i = 0; i < ld->nstage; i++)
		if (ld->stage[i].ops->counts)
			ld->stage[i].ops->counts(&ld->stage[i], c);
}
