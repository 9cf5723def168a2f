/*
 * CRC32C (Castagnoli) and CRC32 (zlib's, IEEE) through isa-l, CRC-64/NVME,
 * and combining CRCs of adjacent pieces.  S3 objects carry any of the
 * three as their end-to-end checksum; sluice's own records use CRC32C.
 *
 * CRC-64/NVME (S3's CRC64NVME: polynomial 0xad93d23594c93659 reflected,
 * initial value and final xor all ones, as S3, boto3 and awscrt compute
 * it): isa-l 2.31 has it (crc64_rocksoft_refl); the isa-l of the
 * distributions sluice builds on (2.30) does not, so it is computed here
 * with slice-by-8 tables.
 */
#include <isa-l/crc.h>
#include <pthread.h>

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

/* CRC-64/NVME's polynomial, reflected (0xad93d23594c93659 bit-reversed). */
#define SL_CRC64NVME_POLY 0x9a6c9329ac4bc9b5ull

static uint64_t sl_crc64_table[8][256];
static pthread_once_t sl_crc64_once = PTHREAD_ONCE_INIT;

static void sl_crc64_init(void)
{
	for (unsigned i = 0; i < 256; i++) {
		uint64_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ SL_CRC64NVME_POLY : c >> 1;
		sl_crc64_table[0][i] = c;
	}
	for (unsigned i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			sl_crc64_table[t][i] = (sl_crc64_table[t - 1][i] >> 8) ^
					       sl_crc64_table[0][sl_crc64_table[t - 1][i] & 0xff];
}

uint64_t sl__crc64nvme(uint64_t crc, const void *p, size_t n)
{
	const uint64_t(*t)[256] = sl_crc64_table;
	const unsigned char *b = p;
	uint64_t c = ~crc;

	pthread_once(&sl_crc64_once, sl_crc64_init);
	for (; n >= 8; b += 8, n -= 8) {
		/* The next 8 bytes as a little-endian word (one load where the CPU is little-endian). */
		c ^= (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 | (uint64_t)b[3] << 24 |
		     (uint64_t)b[4] << 32 | (uint64_t)b[5] << 40 | (uint64_t)b[6] << 48 | (uint64_t)b[7] << 56;
		c = t[7][c & 0xff] ^ t[6][(c >> 8) & 0xff] ^ t[5][(c >> 16) & 0xff] ^ t[4][(c >> 24) & 0xff] ^
		    t[3][(c >> 32) & 0xff] ^ t[2][(c >> 40) & 0xff] ^ t[1][(c >> 48) & 0xff] ^ t[0][c >> 56];
	}
	while (n--)
		c = (c >> 8) ^ t[0][(c ^ *b++) & 0xff];
	return ~c;
}

uint64_t sl__crc(int kind, uint64_t crc, const void *p, size_t n)
{
	const unsigned char *c = p;

	if (kind == SL_CRC64NVME)
		return sl__crc64nvme(crc, p, n);
	if (kind != SL_CRC32)
		return sluice_crc32c((uint32_t)crc, p, n);
	/* crc32_gzip_refl inverts on entry and exit itself, as zlib's crc32 does. */
	for (; n; ) {
		uint64_t k = n > (1u << 30) ? 1u << 30 : n;

		crc = crc32_gzip_refl((uint32_t)crc, (unsigned char *)c, k);
		c += k;
		n -= (size_t)k;
	}
	return crc;
}

/* A GF(2) matrix of w rows (one per bit of the CRC) times vec. */
static uint64_t sl_gf2_times(const uint64_t *mat, uint64_t vec)
{
	uint64_t sum = 0;

	for (; vec; vec >>= 1, mat++)
		if (vec & 1)
			sum ^= *mat;
	return sum;
}

static void sl_gf2_square(uint64_t *sq, const uint64_t *mat, int w)
{
	for (int n = 0; n < w; n++)
		sq[n] = sl_gf2_times(mat, mat[n]);
}

/*
 * CRC of A||B from crc(A), crc(B) and len(B): apply len2 zero bytes to crc1
 * by repeated squaring of the one-zero-bit operator (the method of zlib's
 * crc32_combine), with the reflected polynomial of kind and its width (32
 * or 64 rows; the rows past a 32-bit CRC's are never read, as its values
 * have no bits there).  It holds for any CRC whose initial value equals
 * its final xor, as all three kinds' do.
 */
uint64_t sl__crc_combine(int kind, uint64_t crc1, uint64_t crc2, uint64_t len2)
{
	const int w = kind == SL_CRC64NVME ? 64 : 32;
	uint64_t even[64], odd[64], row = 1;

	if (!len2)
		return crc1;
	odd[0] = kind == SL_CRC64NVME ? SL_CRC64NVME_POLY : kind == SL_CRC32 ? 0xEDB88320u : 0x82F63B78u;
	for (int n = 1; n < w; n++, row <<= 1)
		odd[n] = row;
	sl_gf2_square(even, odd, w); /* two zero bits */
	sl_gf2_square(odd, even, w); /* four zero bits */
	do {
		sl_gf2_square(even, odd, w);
		if (len2 & 1)
			crc1 = sl_gf2_times(even, crc1);
		len2 >>= 1;
		if (!len2)
			break;
		sl_gf2_square(odd, even, w);
		if (len2 & 1)
			crc1 = sl_gf2_times(odd, crc1);
		len2 >>= 1;
	} while (len2);
	return crc1 ^ crc2;
}

uint32_t sl__crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	return (uint32_t)sl__crc_combine(SL_CRC32C, crc1, crc2, len2);
}
