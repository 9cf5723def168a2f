/*
 * The image options a user gives (struct sluice_image_options) checked
 * into the pipeline's, and the public plan of one image.
 */
#include <math.h>
#include <string.h>

#include "image/image.h"
#include "sluice.h"

#define SL_BAD(...) sl__err(SLUICE_EINVAL_CONFIG, "image options: " __VA_ARGS__)

int sl__img_opts_set(struct sl__img_opts *o, const struct sluice_image_options *in)
{
	struct sluice_image_options io = *in;
	uint64_t maxpix = 0;
	int rc, norm = 0;
	size_t es;

	memset(o, 0, sizeof(*o));
	if (!io.field)
		return SL_BAD("field is required (the field of encoded images)");
	if (!io.height || !io.width || io.height > 16384 || io.width > 16384)
		return SL_BAD("height and width must be 1..16384 (got %u x %u)", io.height, io.width);
	if (io.mode < SLUICE_IMAGE_RANDOM_RESIZED_CROP || io.mode > SLUICE_IMAGE_RESIZE)
		return SL_BAD("mode %d is not one of RANDOM_RESIZED_CROP (0), CENTER_CROP (1), RESIZE (2)", io.mode);
	if (!io.dtype)
		io.dtype = SLUICE_DTYPE_F32;
	if (io.dtype != SLUICE_DTYPE_U8 && io.dtype != SLUICE_DTYPE_F16 && io.dtype != SLUICE_DTYPE_BF16 &&
	    io.dtype != SLUICE_DTYPE_F32)
		return SL_BAD("dtype must be u8, f16, bf16 or f32");
	if (io.decode < SLUICE_IMAGE_DECODE_AUTO || io.decode > SLUICE_IMAGE_DECODE_CPU)
		return SL_BAD("decode %d is not AUTO (0), GPU (1) or CPU (2)", io.decode);
	o->scale[0] = io.scale[0] || io.scale[1] ? io.scale[0] : 0.08;
	o->scale[1] = io.scale[0] || io.scale[1] ? io.scale[1] : 1.0;
	o->ratio[0] = io.ratio[0] || io.ratio[1] ? io.ratio[0] : 3.0 / 4.0;
	o->ratio[1] = io.ratio[0] || io.ratio[1] ? io.ratio[1] : 4.0 / 3.0;
	if (!(o->scale[0] > 0 && o->scale[0] <= o->scale[1] && o->scale[1] <= 1))
		return SL_BAD("scale must satisfy 0 < scale[0] <= scale[1] <= 1 (got %g, %g)", o->scale[0], o->scale[1]);
	if (!(o->ratio[0] > 0 && o->ratio[0] <= o->ratio[1] && isfinite(o->ratio[1])))
		return SL_BAD("ratio must satisfy 0 < ratio[0] <= ratio[1] (got %g, %g)", o->ratio[0], o->ratio[1]);
	if (!(io.flip >= 0 && io.flip <= 1))
		return SL_BAD("flip is a probability, 0..1 (got %g)", io.flip);
	for (int c = 0; c < 3; c++) {
		if (!isfinite(io.mean[c]) || !isfinite(io.std[c]) || io.std[c] < 0 || (io.std[c] && !isfinite(1.0f / io.std[c])))
			return SL_BAD("mean and std must be finite, std >= 0 and its inverse finite (channel %d: %g, %g)", c,
				      io.mean[c], io.std[c]);
		norm |= io.std[c] != 0;
	}
	for (int c = 0; c < 3 && norm; c++)
		if (io.std[c] == 0)
			return SL_BAD("std must be set for every channel, or none (channel %d is 0)", c);
	if (norm && io.dtype == SLUICE_DTYPE_U8)
		return SL_BAD("u8 images cannot be normalised (mean, std): ask for f16, bf16 or f32");
	if (io.resize > 16384)
		return SL_BAD("resize must be at most 16384 (got %u)", io.resize);
	o->resize = io.resize ? io.resize : (uint32_t)((uint64_t)(io.height > io.width ? io.height : io.width) * 8 / 7);
	if (io.mode == SLUICE_IMAGE_CENTER_CROP && (o->resize < io.height || o->resize < io.width))
		return SL_BAD("resize %u is smaller than the %u x %u crop", o->resize, io.width, io.height);
	if ((rc = sl__setting_u64("SLUICE_MAX_IMAGE_PIXELS", &maxpix)) < 0)
		return rc;
	o->max_pixels = maxpix;
	o->ow = (int)io.width;
	o->oh = (int)io.height;
	o->mode = io.mode;
	o->flip = io.flip;
	o->aug = (struct sl_aug_params){ .ow = o->ow, .oh = o->oh, .dtype = (int)io.dtype, .nhwc = io.channels_last != 0,
					 .normalize = norm };
	for (int c = 0; c < 3; c++) {
		o->aug.mean[c] = io.mean[c];
		o->aug.inv_std[c] = norm ? 1.0f / io.std[c] : 1.0f;
	}
	es = sluice_dtype_size(io.dtype);
	o->out_bytes = (size_t)o->ow * (size_t)o->oh * 3 * es;
	return 0;
}

int sluice_image_plan(const struct sluice_image_options *opt, uint64_t seed, uint64_t epoch, uint64_t id,
		      uint32_t width, uint32_t height, struct sluice_image_box *box)
{
	struct sluice_image_options io;
	struct sl__img_opts o;
	struct sl_aug_img im;
	int rc;

	sl__err_clear();
	if ((rc = SL_SIZED_IN(&io, opt, image_options)) || (rc = sl__img_opts_set(&o, &io)))
		return rc;
	if (!width || !height || width > 65535 || height > 65535)
		return sl__err(SLUICE_EINVAL_CONFIG, "sluice_image_plan: an image of %u x %u pixels (1 to 65535 a side)",
			       width, height);
	if (sl__img_plan(&o, seed, epoch, id, width, height, &im))
		return sl__err(SLUICE_EINVAL_CONFIG, "sluice_image_plan: %u x %u resized so its shorter side is %u passes %u a side",
			       width, height, o.resize, SL_IMG_MAX_RESIZED);
	*box = (struct sluice_image_box){ im.x0, im.y0, im.rw, im.rh, im.rsw, im.rsh, im.offx, im.offy, im.flip };
	return 0;
}
