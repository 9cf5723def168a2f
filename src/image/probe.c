/*
 * The header of an encoded image, read before anything decodes it: what
 * it is, its size (the crop is decided from it, the scratch sized by it),
 * and whether it is whole.  A JPEG's entropy-coded data can hold 0xFF
 * only stuffed (FF 00) or as a restart marker (FF D0..D7), so FF D9 after
 * the first scan is its end, and a file without it was cut short: a
 * decoder would fill the rest with grey and say nothing.
 */
#include <stdio.h>
#include <string.h>

#include <webp/decode.h>

#include "image/image.h"

#define SL_WHY(...) (snprintf(why, cap, __VA_ARGS__), SLUICE_EFORMAT)

static unsigned sl_be16(const unsigned char *p)
{
	return (unsigned)p[0] << 8 | p[1];
}

static uint32_t sl_be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* 1 if FF D9 is in [from, n). */
static int sl_has_eoi(const unsigned char *p, size_t from, size_t n)
{
	for (size_t i = n; i >= from + 2; i--)
		if (p[i - 2] == 0xff && p[i - 1] == 0xd9)
			return 1;
	return 0;
}

static int sl_probe_jpeg(const unsigned char *p, size_t n, struct sl__img_info *info, char *why, size_t cap)
{
	size_t at = 2;
	int sof = 0, jfif = 0, adobe = -1, ids_rgb = 0;

	info->kind = SL_IMG_JPEG;
	for (;;) {
		unsigned m, len;

		while (at < n && p[at] == 0xff && at + 1 < n && p[at + 1] == 0xff)
			at++; /* fill bytes */
		if (at + 2 > n)
			return SL_WHY("JPEG cut short in its header (no scan after %zu bytes)", n);
		if (p[at] != 0xff)
			return SL_WHY("JPEG header broken at byte %zu (0x%02x where a marker belongs)", at, p[at]);
		m = p[at + 1];
		at += 2;
		if (m == 0x01 || (m >= 0xd0 && m <= 0xd8))
			continue; /* markers without a segment */
		if (m == 0xd9)
			return SL_WHY("JPEG ends before its first scan");
		if (at + 2 > n || (len = sl_be16(p + at)) < 2 || at + len > n)
			return SL_WHY("JPEG segment 0x%02x at byte %zu runs past the end (%zu bytes)", m, at - 2, n);
		if (m == 0xe0 && len >= 7 && !memcmp(p + at + 2, "JFIF", 5))
			jfif = 1;
		if (m == 0xee && len >= 14 && !memcmp(p + at + 2, "Adobe", 5))
			adobe = p[at + 13]; /* its colour transform: 0 none (RGB, CMYK), 1 YCbCr, 2 YCCK */
		if ((m >= 0xc0 && m <= 0xcf) && m != 0xc4 && m != 0xc8 && m != 0xcc) {
			if (len < 8)
				return SL_WHY("JPEG frame header too short (%u bytes)", len);
			if (m == 0xc3 || m == 0xc7 || m == 0xcb || m == 0xcf)
				return SL_WHY("lossless JPEG (SOF%u) is not decoded", m - 0xc0);
			if (p[at + 2] != 8)
				return SL_WHY("JPEG of %u-bit samples is not decoded (8-bit only)", p[at + 2]);
			info->h = sl_be16(p + at + 3);
			info->w = sl_be16(p + at + 5);
			info->ncomp = p[at + 7];
			info->baseline = m == 0xc0 || m == 0xc1;
			if (info->ncomp != 1 && info->ncomp != 3 && info->ncomp != 4)
				return SL_WHY("JPEG of %d components is not decoded (1, 3 or 4)", info->ncomp);
			if (len < 8u + 3u * (unsigned)info->ncomp)
				return SL_WHY("JPEG frame header too short for %d components", info->ncomp);
			ids_rgb = info->ncomp == 3 && p[at + 8] == 'R' && p[at + 11] == 'G' && p[at + 14] == 'B';
			sof = 1;
		}
		if (m == 0xda) {
			if (!sof)
				return SL_WHY("JPEG scan before its frame header");
			if (!sl_has_eoi(p, at + len, n))
				return SL_WHY("JPEG truncated: no end-of-image marker after its scan (%zu bytes)", n);
			/* Three components stored as R, G, B rather than YCbCr, as libjpeg decides it. */
			info->rgb = info->ncomp == 3 && !jfif && (adobe == 0 || (adobe < 0 && ids_rgb));
			return 0;
		}
		at += len;
	}
}

static int sl_probe_png(const unsigned char *p, size_t n, struct sl__img_info *info, char *why, size_t cap)
{
	info->kind = SL_IMG_PNG;
	if (n < 8 + 25 || sl_be32(p + 8) != 13 || memcmp(p + 12, "IHDR", 4))
		return SL_WHY("PNG without its IHDR header (%zu bytes)", n);
	info->w = sl_be32(p + 16);
	info->h = sl_be32(p + 20);
	info->ncomp = 3;
	/*
	 * Whole if its chunks, walked by their lengths, reach IEND inside the
	 * bytes: what follows IEND is not the image's and is ignored, as libpng
	 * and PIL ignore it (a file a tool appended to); a chunk that runs
	 * past the end, or no IEND, is a file cut short.  A length over 2^31 - 1
	 * is no PNG's (the specification's bound), so none wraps the walk.
	 */
	for (size_t at = 8;;) {
		uint32_t len;

		if (n - at < 12)
			return SL_WHY("PNG truncated: no IEND chunk in its %zu bytes", n);
		len = sl_be32(p + at);
		if (len > 0x7fffffffu)
			return SL_WHY("PNG chunk at byte %zu claims %u bytes (at most 2^31 - 1)", at, len);
		if (len > n - at - 12) {
			char type[5] = "";

			for (int k = 0; k < 4; k++) /* chunk types are letters; anything else shown as '?' */
				type[k] = (p[at + 4 + k] | 0x20) >= 'a' && (p[at + 4 + k] | 0x20) <= 'z' ? (char)p[at + 4 + k] : '?';
			return SL_WHY("PNG truncated: its %s chunk at byte %zu runs past the end (%zu bytes) before IEND",
				      type, at, n);
		}
		if (!memcmp(p + at + 4, "IEND", 4))
			return 0;
		at += 12 + (size_t)len;
	}
}

static int sl_probe_webp(const unsigned char *p, size_t n, struct sl__img_info *info, char *why, size_t cap)
{
	int w = 0, h = 0;

	info->kind = SL_IMG_WEBP;
	if ((uint64_t)((uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24) + 8 > n)
		return SL_WHY("WebP truncated: its RIFF header says more bytes than the %zu there", n);
	WebPBitstreamFeatures f;

	if (WebPGetFeatures(p, n, &f) != VP8_STATUS_OK)
		return SL_WHY("WebP header not understood (%zu bytes)", n);
	if (f.has_animation)
		return SL_WHY("animated WebP is not decoded (a still image is)");
	w = f.width;
	h = f.height;
	info->w = (uint32_t)w;
	info->h = (uint32_t)h;
	info->ncomp = 3;
	return 0;
}

int sl__img_probe(const unsigned char *p, size_t n, uint64_t max_pixels, struct sl__img_info *info, char *why, size_t cap)
{
	int rc;

	memset(info, 0, sizeof(*info));
	if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
		rc = sl_probe_jpeg(p, n, info, why, cap);
	else if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
		rc = sl_probe_png(p, n, info, why, cap);
	else if (n >= 16 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4))
		rc = sl_probe_webp(p, n, info, why, cap);
	else
		return SL_WHY(n ? "not an image sluice decodes (JPEG, PNG, WebP): it starts %02x %02x" : "empty record (0 bytes)",
			      n > 0 ? p[0] : 0, n > 1 ? p[1] : 0);
	if (rc)
		return rc;
	if (!info->w || !info->h || info->w > 65535 || info->h > 65535)
		return SL_WHY("image of %u x %u pixels (1 to 65535 a side)", info->w, info->h);
	if ((uint64_t)info->w * info->h > max_pixels)
		return SL_WHY("image of %u x %u pixels, over SLUICE_MAX_IMAGE_PIXELS (%llu)", info->w, info->h,
			      (unsigned long long)max_pixels);
	return 0;
}
