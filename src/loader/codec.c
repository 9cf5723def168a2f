/*
 * The loader's codecs: what turns stored bytes into what the batch holds.
 * zstd blocks, decoded where the windows are read (by nvCOMP for GPU
 * loaders, dsread/zgpu.c, or the CPU); and the images (image/): one
 * field's encoded images become a dense tensor of the options' size,
 * dtype and layout, decoded and augmented by each producer on the GPU
 * (nvJPEG and one kernel launch a batch, on the producer's stream) or by
 * the CPU's threads.  This file picks the zstd decoder, checks the image
 * options and opens each producer's pipeline; collate.c runs it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "loader/state.h"

/* The image options checked into ld->img (the field among those loaded: ld->img_f). */
static int sl_image_options(struct sluice_loader *ld, const struct sluice_image_options *in)
{
	struct sluice_image_options io;
	int rc;

	if ((rc = SL_SIZED_IN(&io, in, image_options)) || (rc = sl__img_opts_set(&ld->img, &io)))
		return rc;
	for (unsigned f = 0; f < ld->nf; f++)
		if (!strcmp(ld->ds->fields[ld->fidx[f]].name, io.field))
			ld->img_f = (int)f;
	if (ld->img_f < 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "loader: image options: %s has no loaded field '%s'", ld->ds->path,
			       io.field);
	if (ld->ds->fields[ld->fidx[ld->img_f]].dtype != SLUICE_DTYPE_BYTES || ld->fixed[ld->img_f])
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
 * of that slowdown is the CUDA driver's: nvJPEG makes about five calls an
 * image, and the model's launches wait on the driver behind them;
 * bench/driver_contention.py.)
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
 * A GPU loader over a zstd dataset: its windows' blocks decoded by nvCOMP
 * as SLUICE_DECODE says (auto: where it loads; gpu: an error where it does
 * not; cpu: never).  The records' CRCs check nvCOMP's output, so a dataset
 * without them is decoded by the CPU, whose zstd checks each block's own
 * checksum.
 */
static int sl_zstd_decoder(struct sluice_loader *ld)
{
	const char *why = "the dataset has no record CRCs to check nvCOMP's output with";
	uint64_t w = 0;
	int rc;

	ld->znc = NULL;
	if (!ld->ds->compressed || !ld->opt.gpu)
		return 0;
	if ((rc = sl__setting_u64("SLUICE_DECODE", &w)) < 0)
		return rc;
	if (w == 2) /* cpu */
		return 0;
	if (ld->ds->has_crc)
		ld->znc = sl__nvcomp(&why);
	if (!ld->znc && w == 1)
		return sl__err(SLUICE_ENOGPU, "loader: %s: SLUICE_DECODE=gpu, but %s", ld->ds->path, why);
	if (!ld->znc)
		sl__info("loader", "%s: zstd blocks decoded by the CPU: %s", ld->ds->path, why);
	return 0;
}

int sl__loader_codecs_open(struct sluice_loader *ld, const struct sluice_image_options *img)
{
	int rc;

	ld->img_f = -1;
	if ((rc = sl_zstd_decoder(ld)))
		return rc;
	if (!img)
		return 0;
	if ((rc = sl_image_options(ld, img)))
		return rc;
	/* The GPU's pipeline for a GPU loader: nvJPEG unless decode is CPU (AUTO: without it where it does not load). */
	if (ld->opt.gpu) {
		uint64_t n = 4;

		if ((rc = sl__setting_u64("SLUICE_IMAGE_PRODUCERS", &n)) < 0)
			return rc;
		ld->nprod = (unsigned)n;
	}
	for (unsigned p = 0; p < ld->nprod && ld->opt.gpu; p++) {
		int nvjpeg = ld->img_decode != SLUICE_IMAGE_DECODE_CPU;
		const char *why = NULL;

		if (nvjpeg && ld->img_decode == SLUICE_IMAGE_DECODE_AUTO && !sl__nvjpeg(&why)) {
			if (p == 0)
				sl__info("loader", "images decoded by the CPU: %s", why);
			nvjpeg = 0;
		}
		if (nvjpeg && p == 0)
			sl_connections_check();
		rc = sl__img_gpu_open(&ld->prod[p].img, ld->gpu, nvjpeg);
		if (rc && ld->img_decode == SLUICE_IMAGE_DECODE_AUTO && rc != -ENOMEM) {
			/* No NVRTC (or no nvJPEG state): the CPU does it all, and the batch is copied up. */
			sl__info("loader", "images decoded and augmented by the CPU: %s", sluice_last_error_detail());
			sl__loader_codecs_close(ld);
			ld->nprod = SL_PRODUCERS;
			return 0;
		}
		if (rc)
			return sl__err(rc, "loader: images on the GPU: %s", sluice_last_error_detail());
	}
	return 0;
}

void sl__loader_codecs_close(struct sluice_loader *ld)
{
	for (unsigned p = 0; p < SL_PRODUCERS_MAX; p++) {
		sl__img_gpu_close(ld->prod[p].img);
		ld->prod[p].img = NULL;
	}
}
