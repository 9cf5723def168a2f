/*
 * CRC32C (Castagnoli) and CRC32 (zlib's, IEEE) through isa-l, and combining
 * CRCs of adjacent pieces.  S3 objects carry either as their end-to-end
 * checksum; sluice's own records use CRC32C.
 */
#include <isa-l/crc.h>

#include "core.h"

uint32_t sluice_crc32c(uint32_t crc, const void *p, size_t n)
{
	/* isa-l's crc32_iscsi works on the inverted state and takes int lengths. */
	uint32_t st = ~crc;
	const unsigned char *c = p;

	while (n) {
		int k = n > (1u << 30) ? 1 << 30 : (int)n;

		st = crc32_iscsi((unsigned char *)c, k, st);
		c += k;
		n -= (size_t)k;
	}
	return ~st;
}

static uint32_t sl_gf2_times(const uint32_t *mat, uint32_t vec)
{
	uint32_t sum = 0;

	for (; vec; vec >>= 1, mat++)
		if (vec & 1)
			sum ^= *mat;
	return sum;
}

static void sl_gf2_square(uint32_t *sq, const uint32_t *mat)
{
	for (int n = 0; n < 32; n++)
		sq[n] = sl_gf2_times(mat, mat[n]);
}

uint32_t sl__crc(int kind, uint32_t crc, const void *p, size_t n)
{
	const unsigned char *c = p;

	if (kind != SL_CRC32)
		return sluice_crc32c(crc, p, n);
	/* crc32_gzip_refl inverts on entry and exit itself, as zlib's crc32 does. */
	for (; n; ) {
		uint64_t k = n > (1u << 30) ? 1u << 30 : n;

		crc = crc32_gzip_refl(crc, (unsigned char *)c, k);
		c += k;
		n -= (size_t)k;
	}
	return crc;
}

/*
 * CRC of A||B from crc(A), crc(B) and len(B): apply len2 zero bytes to crc1
 * by repeated squaring of the one-zero-bit operator (the method of zlib's
 * crc32_combine), with the reflected polynomial of kind.
 */
uint32_t sl__crc_combine(int kind, uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	uint32_t even[32], odd[32], row = 1;

	if (!len2)
		return crc1;
	odd[0] = kind == SL_CRC32 ? 0xEDB88320u : 0x82F63B78u;
	for (int n = 1; n < 32; n++, row <<= 1)
		odd[n] = row;
	sl_gf2_square(even, odd); /* two zero bits */
	sl_gf2_square(odd, even); /* four zero bits */
	do {
		sl_gf2_square(even, odd);
		if (len2 & 1)
			crc1 = sl_gf2_times(even, crc1);
		len2 >>= 1;
		if (!len2)
			break;
		sl_gf2_square(odd, even);
		if (len2 & 1)
			crc1 = sl_gf2_times(odd, crc1);
		len2 >>= 1;
	} while (len2);
	return crc1 ^ crc2;
}

uint32_t sl__crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	return sl__crc_combine(SL_CRC32C, crc1, crc2, len2);
}
