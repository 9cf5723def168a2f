/*
 * Images on the CPU: decoded by libjpeg-turbo, libpng (its simplified
 * API) and libwebp into interleaved RGB, and augment.h's pixel run over
 * the output.  A decoder's warning (libjpeg's "premature end of data",
 * a corrupt Huffman code) is an error here: a decoder that warns fills
 * what it could not decode, and that image would be wrong.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "image/image.h"

struct sl_jerr {
	struct jpeg_error_mgr mgr;
	jmp_buf jump;
	char msg[JMSG_LENGTH_MAX];
};

static void sl_jerr_exit(j_common_ptr c)
{
	struct sl_jerr *e = (struct sl_jerr *)(void *)c->err;

	c->err->format_message(c, e->msg);
	longjmp(e->jump, 1);
}

/* Warnings (level -1) are errors; trace messages (level >= 0) are not. */
static void sl_jerr_emit(j_common_ptr c, int level)
{
	if (level < 0)
		sl_jerr_exit(c);
}

/* CMYK (Adobe's, stored inverted, or plain) to RGB as PIL converts it: each of R, G, B is 255 less C, M, Y scaled by K. */
static void sl_cmyk_row(const unsigned char *in, unsigned char *out, uint32_t w, int inverted)
{
	for (uint32_t x = 0; x < w; x++) {
		unsigned k = inverted ? in[4 * x + 3] : 255u - in[4 * x + 3];

		for (int c = 0; c < 3; c++) {
			unsigned v = inverted ? in[4 * x + c] : 255u - in[4 * x + c];

			out[3 * x + c] = (unsigned char)((v * k + 127) / 255);
		}
	}
}

static int sl_decode_jpeg(const unsigned char *p, size_t n, const struct sl__img_info *info, unsigned char *rgb, char *why,
			  size_t cap)
{
	struct jpeg_decompress_struct d;
	struct sl_jerr e;
	unsigned char *volatile cmyk = NULL;

	memset(&d, 0, sizeof(d));
	d.err = jpeg_std_error(&e.mgr);
	e.mgr.error_exit = sl_jerr_exit;
	e.mgr.emit_message = sl_jerr_emit;
	if (setjmp(e.jump)) {
		snprintf(why, cap, "JPEG does not decode: %s", e.msg);
		jpeg_destroy_decompress(&d);
		free(cmyk);
		return SLUICE_EFORMAT;
	}
	jpeg_create_decompress(&d);
	jpeg_mem_src(&d, p, (unsigned long)n);
	jpeg_read_header(&d, TRUE);
	if (d.image_width != info->w || d.image_height != info->h) {
		snprintf(e.msg, sizeof(e.msg), "its size changed between header reads");
		longjmp(e.jump, 1);
	}
	d.out_color_space = d.num_components == 4 ? JCS_CMYK : JCS_RGB;
	jpeg_start_decompress(&d);
	if (d.num_components == 4 && !(cmyk = malloc((size_t)info->w * 4))) {
		snprintf(e.msg, sizeof(e.msg), "out of memory");
		longjmp(e.jump, 1);
	}
	while (d.output_scanline < d.output_height) {
		unsigned char *row = rgb + (size_t)d.output_scanline * info->w * 3;
		JSAMPROW r = cmyk ? cmyk : row;

		jpeg_read_scanlines(&d, &r, 1);
		if (cmyk)
			sl_cmyk_row(cmyk, row, info->w, info->adobe);
	}
	jpeg_finish_decompress(&d);
	jpeg_destroy_decompress(&d);
	free(cmyk);
	return 0;
}

static int sl_decode_png(const unsigned char *p, size_t n, const struct sl__img_info *info, unsigned char *rgb, char *why,
			 size_t cap)
{
	png_image im;

	memset(&im, 0, sizeof(im));
	im.version = PNG_IMAGE_VERSION;
	if (png_image_begin_read_from_memory(&im, p, n)) {
		im.format = PNG_FORMAT_RGB; /* alpha composited over black, as PIL's convert("RGB") drops it */
		if (im.width == info->w && im.height == info->h && png_image_finish_read(&im, NULL, rgb, 0, NULL))
			return 0;
	}
	snprintf(why, cap, "PNG does not decode: %s", im.warning_or_error ? im.message : "its size changed");
	png_image_free(&im);
	return SLUICE_EFORMAT;
}

int sl__img_decode_cpu(const unsigned char *p, size_t n, const struct sl__img_info *info, unsigned char *rgb, char *why,
		       size_t cap)
{
	size_t out = (size_t)info->w * info->h * 3;

	if (info->kind == SL_IMG_JPEG)
		return sl_decode_jpeg(p, n, info, rgb, why, cap);
	if (info->kind == SL_IMG_PNG)
		return sl_decode_png(p, n, info, rgb, why, cap);
	if (!WebPDecodeRGBInto(p, n, rgb, out, (int)info->w * 3))
		return snprintf(why, cap, "WebP does not decode"), SLUICE_EFORMAT;
	return 0;
}

void sl__img_augment_cpu(const unsigned char *scratch, const struct sl_aug_img *im, const struct sl_aug_params *p,
			 void *out)
{
	for (int y = 0; y < p->oh; y++)
		for (int x = 0; x < p->ow; x++)
			sl_aug_pixel(scratch, im, p, x, y, out);
}
