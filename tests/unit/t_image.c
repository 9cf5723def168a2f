/*
 * Images on the CPU (image/): every file of tests/unit/images through one
 * batch, the bad-* ones marked bad with a reason and the ok-* ones kept in
 * order; the crop planner's boxes inside their image; the half and
 * bfloat16 conversions against the compiler's; the probe's edges.  Run
 * under ASan+UBSan by make test, which is where hostile images meet it.
 */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "t_util.h"

#define T_MAX 64

static void t_batch(void)
{
	char dir[4096], path[8192], *names[T_MAX];
	struct sl__img_rec rec[T_MAX];
	uint8_t bad[T_MAX] = { 0 };
	struct sl__img_opts o = { .ow = 12, .oh = 10, .mode = SLUICE_IMAGE_RANDOM_RESIZED_CROP, .scale = { 0.08, 1 },
				  .ratio = { 0.75, 4.0 / 3 }, .flip = 0.5, .max_pixels = 89478485 };
	struct sl__img_batch b = { .o = &o, .seed = 1, .epoch = 0, .rec = rec, .bad = bad };
	uint32_t m = 0, nok = 0;
	DIR *d;
	struct dirent *e;
	float *out;

	o.aug = (struct sl_aug_params){ .ow = 12, .oh = 10, .dtype = SL_AUG_F32 };
	o.out_bytes = 12 * 10 * 3 * sizeof(float);
	snprintf(dir, sizeof(dir), "%s/images", T_SRC_DIR);
	T_CHECK((d = opendir(dir)) != NULL);
	while (d && (e = readdir(d)) && m < T_MAX) {
		size_t n = 0;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		names[m] = strdup(e->d_name);
		rec[m] = (struct sl__img_rec){ (const unsigned char *)t_slurp(path, &n), n, m };
		nok += !strncmp(e->d_name, "ok-", 3);
		m++;
	}
	if (d)
		closedir(d);
	T_CHECK(m >= 15);
	b.m = m;
	out = malloc(o.out_bytes * m);
	T_CHECK(sl__img_run_cpu(&b, out) == 0);
	T_CHECK(b.kept == nok);
	T_CHECK(b.nbad == (int)(m - nok) && b.why[0]);
	for (uint32_t j = 0; j < m; j++) {
		if (bad[j] != !!strncmp(names[j], "ok-", 3))
			fprintf(stderr, "t_image: %s %s\n", names[j], bad[j] ? "refused" : "accepted");
		T_CHECK(bad[j] == !!strncmp(names[j], "ok-", 3));
	}
	for (uint32_t k = 0; k < b.kept * o.out_bytes / sizeof(float); k++)
		T_CHECK(out[k] >= 0.0f && out[k] <= 1.0f);
	for (uint32_t j = 0; j < m; j++) {
		free((void *)rec[j].p);
		free(names[j]);
	}
	free(out);
}

static void t_boxes(void)
{
	struct sl__img_opts o = { .ow = 224, .oh = 224, .mode = SLUICE_IMAGE_RANDOM_RESIZED_CROP, .scale = { 0.08, 1 },
				  .ratio = { 0.75, 4.0 / 3 }, .flip = 0.5 };
	const uint32_t sizes[][2] = { { 1, 1 }, { 1, 5000 }, { 5000, 1 }, { 500, 375 }, { 3, 2 }, { 65535, 65535 } };

	uint64_t flips = 0;

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
		for (uint64_t id = 0; id < 2000; id++) {
			struct sl_aug_img im = { 0 }, again = { 0 };
			uint32_t w = sizes[s][0], h = sizes[s][1];

			T_CHECK(sl__img_plan(&o, 42, 3, id, w, h, &im) == 0);
			T_CHECK(sl__img_plan(&o, 42, 3, id, w, h, &again) == 0);
			T_CHECK(!memcmp(&im, &again, sizeof(im)));
			T_CHECK(im.x0 >= 0 && im.y0 >= 0 && im.rw >= 1 && im.rh >= 1);
			T_CHECK((uint32_t)(im.x0 + im.rw) <= w && (uint32_t)(im.y0 + im.rh) <= h);
			flips += (uint64_t)im.flip;
		}
	/* p = 0.5 over 12,000 draws: within 5 sigma */
	T_CHECK(flips > 6000 - 5 * 55 && flips < 6000 + 5 * 55);
	o.mode = SLUICE_IMAGE_CENTER_CROP;
	o.resize = 256;
	{
		struct sl_aug_img im;

		T_CHECK(sl__img_plan(&o, 0, 0, 0, 500, 375, &im) == 0);
		T_CHECK(im.rsh == 256 && im.rsw == 341 && im.offx == 58 && im.offy == 16);
		/* 1 x 65535 resized to a shorter side of 256 would be 16.7M tall: refused, not wrapped */
		T_CHECK(sl__img_plan(&o, 0, 0, 0, 1, 65535, &im) == -1);
		T_CHECK(sl__img_plan(&o, 0, 0, 0, 1, 16384, &im) == 0 && im.rsh == 256 * 16384);
	}
}

static void t_conversions(void)
{
	const float v[] = { 0.0f, -0.0f, 1.0f, -2.1179039f, 2.64f, 0.1f, 1e-5f, 6.1e-5f, 65504.0f, 3.0e-8f, 0.33333334f };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		_Float16 h = (_Float16)v[i];
		unsigned short hb, bb;
		float back;

		memcpy(&hb, &h, 2);
		T_CHECK(sl_aug_f16(v[i]) == hb);
		bb = sl_aug_bf16(v[i]);
		{
			unsigned u = (unsigned)bb << 16;

			memcpy(&back, &u, 4);
		}
		T_CHECK(fabsf(back - v[i]) <= fabsf(v[i]) / 256.0f);
	}
	for (unsigned u = 0; u < 0x7f800000u; u += 0x1003u) { /* every magnitude, rounding ties included */
		float f;
		_Float16 h;
		unsigned short hb;

		memcpy(&f, &u, 4);
		if (f > 65519.0f)
			break;
		h = (_Float16)f;
		memcpy(&hb, &h, 2);
		if (sl_aug_f16(f) != hb) {
			fprintf(stderr, "t_image: f16 of %a: %04x, not %04x\n", f, sl_aug_f16(f), hb);
			T_CHECK(0);
			break;
		}
	}
}

static void t_probe_edges(void)
{
	struct sl__img_info info;
	char why[256];
	const unsigned char soi_only[] = { 0xff, 0xd8, 0xff };
	const unsigned char fill[] = { 0xff, 0xd8, 0xff, 0xff, 0xff, 0xff };

	T_CHECK(sl__img_probe(soi_only, sizeof(soi_only), 100, &info, why, sizeof(why)) == SLUICE_EFORMAT);
	T_CHECK(sl__img_probe(fill, sizeof(fill), 100, &info, why, sizeof(why)) == SLUICE_EFORMAT);
	T_CHECK(sl__img_probe((const unsigned char *)"", 0, 100, &info, why, sizeof(why)) == SLUICE_EFORMAT);
	T_CHECK(strstr(why, "0 bytes") != NULL);
	/* RGB stored as RGB (Adobe's transform 0, ids R G B) is told from YCbCr: nvJPEG would convert it as YCbCr. */
	{
		const char *names[] = { "ok-rgb-colorspace.jpg", "ok-baseline.jpg" };

		for (int i = 0; i < 2; i++) {
			char path[4096];
			size_t n = 0;
			unsigned char *p;

			snprintf(path, sizeof(path), "%s/images/%s", T_SRC_DIR, names[i]);
			p = (unsigned char *)t_slurp(path, &n);
			T_CHECK(p && sl__img_probe(p, n, 1u << 20, &info, why, sizeof(why)) == 0 && info.rgb == (i == 0));
			free(p);
		}
	}
}

/* A JPEG's rows decoded alone are the same bytes as a whole decode's rows (4:2:0, 4:2:2, progressive, grey, CMYK). */
static void t_rows(void)
{
	const char *names[] = { "ok-baseline.jpg", "ok-420.jpg", "ok-progressive.jpg", "ok-grey.jpg", "ok-cmyk.jpg" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char path[4096], why[256];
		struct sl__img_info info;
		size_t n = 0;
		unsigned char *p, *whole, *part;

		snprintf(path, sizeof(path), "%s/images/%s", T_SRC_DIR, names[i]);
		p = (unsigned char *)t_slurp(path, &n);
		T_CHECK(p && sl__img_probe(p, n, 1u << 20, &info, why, sizeof(why)) == 0);
		if (!p)
			continue;
		whole = malloc((size_t)info.w * info.h * 3);
		part = malloc((size_t)info.w * info.h * 3);
		T_CHECK(sl__img_decode_cpu(p, n, &info, 0, 0, whole, why, sizeof(why)) == 0);
		for (uint32_t r0 = 0; r0 < info.h; r0 += 3)
			for (uint32_t rows = 1; r0 + rows <= info.h; rows += 5) {
				T_CHECK(sl__img_decode_cpu(p, n, &info, r0, rows, part, why, sizeof(why)) == 0);
				if (memcmp(part, whole + (size_t)r0 * info.w * 3, (size_t)rows * info.w * 3)) {
					fprintf(stderr, "t_image: %s rows %u+%u differ from a whole decode's\n", names[i], r0, rows);
					T_CHECK(0);
					r0 = info.h;
					break;
				}
			}
		free(whole);
		free(part);
		free(p);
	}
}

/*
 * 16-bit PNGs as PIL's convert("RGB") gives them (Pillow 13, checked by
 * test_images.py against PIL itself): plain grey (PIL's I;16) clipped to
 * 255, colour by its high byte.  The files hold 0, 1, 255, 256, 257,
 * 0x1234, 0xff00, 0xffff (the RGB one: R and B those, G them reversed).
 */
static void t_png16(void)
{
	static const unsigned char grey[8] = { 0, 1, 255, 255, 255, 255, 255, 255 };
	static const unsigned char hi[8] = { 0, 0, 0, 1, 1, 0x12, 0xff, 0xff };
	const char *names[] = { "ok-png-grey16-levels.png", "ok-png-rgb16-levels.png" };

	for (int i = 0; i < 2; i++) {
		char path[4096], why[256];
		struct sl__img_info info;
		unsigned char rgb[8 * 3];
		size_t n = 0;
		unsigned char *p;

		snprintf(path, sizeof(path), "%s/images/%s", T_SRC_DIR, names[i]);
		p = (unsigned char *)t_slurp(path, &n);
		T_CHECK(p && sl__img_probe(p, n, 1u << 20, &info, why, sizeof(why)) == 0 && info.w == 8 && info.h == 1);
		T_CHECK(p && sl__img_decode_cpu(p, n, &info, 0, 0, rgb, why, sizeof(why)) == 0);
		for (int x = 0; p && x < 8; x++) {
			const unsigned char *want = i ? hi : grey;
			int r = want[x], g = i ? hi[7 - x] : want[x];

			if (rgb[3 * x] != r || rgb[3 * x + 1] != g || rgb[3 * x + 2] != r) {
				fprintf(stderr, "t_image: %s pixel %d: %u %u %u, not %d %d %d\n", names[i], x, rgb[3 * x],
					rgb[3 * x + 1], rgb[3 * x + 2], r, g, r);
				T_CHECK(0);
			}
		}
		free(p);
	}
}

/* Where a whole PNG's IEND chunk ends (its last 12 bytes, before what a tool appended). */
static size_t t_png_whole_len(const unsigned char *p, size_t n)
{
	const unsigned char *e = memmem(p, n, "IEND", 4);

	return e ? (size_t)(e - p) + 8 : 0;
}

/* A PNG's end: bytes after IEND ignored (as libpng and PIL do), a chunk cut short or a length past 2^31 refused. */
static void t_png_end(void)
{
	const struct {
		const char *name, *words;
	} cases[] = {
		{ "ok-png-bytes-after-iend.png", NULL },
		{ "bad-png-cut-before-iend.png", "no IEND chunk" },
		{ "bad-png-truncated.png", "runs past the end" },
		{ "bad-png-chunk-length-2g.png", "at most 2^31 - 1" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char path[4096], why[256] = "";
		struct sl__img_info info;
		size_t n = 0;
		unsigned char *p;
		int rc;

		snprintf(path, sizeof(path), "%s/images/%s", T_SRC_DIR, cases[i].name);
		p = (unsigned char *)t_slurp(path, &n);
		rc = p ? sl__img_probe(p, n, 1u << 20, &info, why, sizeof(why)) : -1;
		if (cases[i].words ? rc != SLUICE_EFORMAT || !strstr(why, cases[i].words) : rc != 0) {
			fprintf(stderr, "t_image: %s: %d (%s)\n", cases[i].name, rc, why);
			T_CHECK(0);
		}
		/* Every cut of a whole PNG short of its IEND is refused: none reaches the decoder. */
		for (size_t k = 0, end = p && !cases[i].words ? t_png_whole_len(p, n) : 0; k < end; k++)
			T_CHECK(sl__img_probe(p, k, 1u << 20, &info, why, sizeof(why)) == SLUICE_EFORMAT);
		free(p);
	}
}

int main(void)
{
	t_batch();
	t_boxes();
	t_conversions();
	t_probe_edges();
	t_rows();
	t_png16();
	t_png_end();
	return t_done("t_image");
}
