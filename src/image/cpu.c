/*
 * Images on the CPU: decoded by libjpeg-turbo, libpng (its simplified
 * API) and libwebp into interleaved RGB, and augment.h's pixel run over
 * the output.  A decoder's warning (libjpeg's "premature end of data",
 * a corrupt Huffman code) is an error here: a decoder that warns fills
 * what it could not decode, and that image would be wrong.
 */
#include <errno.h>
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

/*
 * CMYK to RGB as PIL converts it: each of R, G, B is C, M, Y scaled by K,
 * the samples taken as Adobe stores them (inverted, 255 = no ink), which PIL
 * assumes of every 4-component JPEG whether its APP14 marker says so or not.
 */
static void sl_cmyk_row(const unsigned char *in, unsigned char *out, uint32_t w)
{
	for (uint32_t x = 0; x < w; x++)
		for (int c = 0; c < 3; c++)
			out[3 * x + c] = (unsigned char)(((unsigned)in[4 * x + c] * in[4 * x + 3] + 127) / 255);
}

static int sl_decode_jpeg(const unsigned char *p, size_t n, const struct sl__img_info *info, uint32_t row0, uint32_t rows,
			  unsigned char *rgb, char *why, size_t cap)
{
	struct jpeg_decompress_struct d;
	struct sl_jerr e;
	unsigned char *volatile cmyk = NULL, *volatile last = NULL;

	memset(&d, 0, sizeof(d));
	d.err = jpeg_std_error(&e.mgr);
	e.mgr.error_exit = sl_jerr_exit;
	e.mgr.emit_message = sl_jerr_emit;
	if (setjmp(e.jump)) {
		snprintf(why, cap, "JPEG does not decode: %s", e.msg);
		jpeg_destroy_decompress(&d);
		free(cmyk);
		free(last);
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
	/*
	 * Only the rows the crop reads: libjpeg-turbo skips the others' IDCT and
	 * colour conversion.  Rows skipped so are the same bytes as a whole
	 * decode's (columns cropped are not, at 4:2:0: the upsampling's context
	 * at their edges differs), checked by t_image.  The rows below the crop
	 * are skipped too, not left: damage that desynchronises the entropy
	 * coding often shows only at the scan's end ("extraneous bytes before
	 * marker"), and an image whose decode would fail there is not used,
	 * whatever rows the crop took (a stranger found crops above the damage
	 * delivered wrong pixels without an error).
	 */
	if (row0)
		jpeg_skip_scanlines(&d, row0);
	while (d.output_scanline < row0 + rows) {
		unsigned char *row = rgb + (size_t)(d.output_scanline - row0) * info->w * 3;
		JSAMPROW r = cmyk ? cmyk : row;

		jpeg_read_scanlines(&d, &r, 1);
		if (cmyk)
			sl_cmyk_row(cmyk, row, info->w);
	}
	/* Skipped to the last row, which is read: libjpeg-turbo skips a skip to the very end without decoding. */
	if (d.output_scanline + 1 < d.output_height)
		jpeg_skip_scanlines(&d, d.output_height - 1 - d.output_scanline);
	if (d.output_scanline < d.output_height) {
		JSAMPROW r = cmyk ? cmyk : (last = malloc((size_t)info->w * 3));

		if (!r) {
			snprintf(e.msg, sizeof(e.msg), "out of memory");
			longjmp(e.jump, 1);
		}
		jpeg_read_scanlines(&d, &r, 1);
	}
	jpeg_finish_decompress(&d);
	jpeg_destroy_decompress(&d);
	free(cmyk);
	free(last);
	return 0;
}

struct sl_pngerr {
	jmp_buf jump;
	char msg[160];
};

static void sl_png_error(png_structp png, png_const_charp msg)
{
	struct sl_pngerr *e = png_get_error_ptr(png);

	snprintf(e->msg, sizeof(e->msg), "%s", msg);
	longjmp(e->jump, 1);
}

/* Warnings (a bad CRC in an ancillary chunk, say) are errors: the image might not be what was stored. */
static void sl_png_warning(png_structp png, png_const_charp msg)
{
	sl_png_error(png, msg);
}

struct sl_pngsrc {
	const unsigned char *p;
	size_t n, at;
};

static void sl_png_read(png_structp png, png_bytep out, size_t n)
{
	struct sl_pngsrc *src = png_get_io_ptr(png);

	if (n > src->n - src->at)
		png_error(png, "the data ends early");
	memcpy(out, src->p + src->at, n);
	src->at += n;
}

/*
 * n pixels of big-endian 16-bit grey at the front of rgb widened, in
 * place, to RGB as PIL's I;16 to RGB conversion does: min(v, 255).  Last
 * pixel first: pixel i's 3 bytes land at 3i, never over pixel j < i's 2
 * bytes at 2j, still to be read.
 */
static void sl_grey16_rgb(unsigned char *rgb, size_t n)
{
	for (size_t i = n; i-- > 0;) {
		unsigned char v = rgb[2 * i] ? 255 : rgb[2 * i + 1];

		rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = v;
	}
}

/*
 * The stored RGB, as PIL's convert("RGB") gives it, byte for byte:
 * palettes and low-bit grey expanded, grey copied to R, G and B, alpha and
 * transparency dropped (not composited), and gAMA, cHRM, sRGB and iCCP
 * ignored: libpng's simplified API would composite alpha in linear light
 * and re-encode 16-bit and gamma-tagged images, which no training pipeline
 * does.  16-bit samples as PIL takes them, which is two rules: colour and
 * grey with alpha (PIL opens them as 8-bit RGB, RGBA) by their high byte;
 * plain 16-bit grey (PIL's mode I;16) clipped to 255, as its conversion to
 * RGB clips (a sample of 256 or more is white).  torchvision's decode_png
 * gives 16-bit samples whole, and its ToDtype(uint8) the high byte: grey
 * is where it and PIL part.
 */
static int sl_decode_png(const unsigned char *p, size_t n, const struct sl__img_info *info, unsigned char *rgb, char *why,
			 size_t cap)
{
	struct sl_pngerr e = { .msg = "" };
	struct sl_pngsrc src = { p, n, 0 };
	png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &e, sl_png_error, sl_png_warning);
	png_infop pi = png ? png_create_info_struct(png) : NULL;
	png_bytep *volatile rows = NULL;
	volatile int grey16 = 0;
	volatile size_t px = 3;

	if (!pi) {
		png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
		return snprintf(why, cap, "PNG: out of memory"), -ENOMEM;
	}
	if (setjmp(e.jump)) {
		snprintf(why, cap, "PNG does not decode: %s", e.msg);
		png_destroy_read_struct(&png, &pi, NULL);
		free(rows);
		return SLUICE_EFORMAT;
	}
	png_set_read_fn(png, &src, sl_png_read);
	png_set_user_limits(png, info->w, info->h);
	png_read_info(png, pi);
	if (png_get_image_width(png, pi) != info->w || png_get_image_height(png, pi) != info->h)
		png_error(png, "its size changed between header reads");
	grey16 = png_get_bit_depth(png, pi) == 16 && png_get_color_type(png, pi) == PNG_COLOR_TYPE_GRAY;
	px = grey16 ? 2 : 3;
	png_set_expand(png);         /* palette to RGB, grey below 8 bits to 8, tRNS to an alpha that is then dropped */
	if (!grey16) {
		png_set_strip_16(png);
		png_set_gray_to_rgb(png);
	}
	png_set_strip_alpha(png);
	png_set_interlace_handling(png);
	png_read_update_info(png, pi);
	if (png_get_rowbytes(png, pi) != (size_t)info->w * px)
		png_error(png, "not the bytes a pixel expected after expansion");
	if (!(rows = malloc(info->h * sizeof(*rows))))
		png_error(png, "out of memory");
	/* 16-bit grey decoded into the front of the output (2 bytes a pixel of its 3), then widened in place. */
	for (uint32_t y = 0; y < info->h; y++)
		rows[y] = rgb + (size_t)y * info->w * px;
	png_read_image(png, rows);
	png_read_end(png, NULL);
	png_destroy_read_struct(&png, &pi, NULL);
	free(rows);
	if (grey16)
		sl_grey16_rgb(rgb, (size_t)info->w * info->h);
	return 0;
}

int sl__img_decode_cpu(const unsigned char *p, size_t n, const struct sl__img_info *info, uint32_t row0, uint32_t rows,
		       unsigned char *rgb, char *why, size_t cap)
{
	size_t out = (size_t)info->w * info->h * 3;

	if (info->kind == SL_IMG_JPEG)
		return sl_decode_jpeg(p, n, info, rows ? row0 : 0, rows ? rows : info->h, rgb, why, cap);
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
