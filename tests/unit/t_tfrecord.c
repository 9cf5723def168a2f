/*
 * TFRecord files in place, under ASan+UBSan: a file of records written here
 * as TensorFlow lays them out (u64 length, masked CRC32C of it, data,
 * masked CRC32C of the data) scans to where each record lies and its
 * CRC32C; damaged files are refused naming the file and record: cut short,
 * a length whose CRC fails, a length past the end, one of 4 GiB or more
 * with a CRC that matches; an empty file has no records.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_util.h"
#include "format/format.h"

static uint32_t mask(uint32_t c)
{
	return (c >> 15 | c << 17) + 0xa282ead8u;
}

/* A record of len bytes of (char)seed at out; its size. */
static size_t put_record(unsigned char *out, uint64_t len, size_t data, int seed)
{
	memcpy(out, &len, 8);
	uint32_t lc = mask(sluice_crc32c(0, out, 8)), dc;

	memcpy(out + 8, &lc, 4);
	memset(out + 12, seed, data);
	dc = mask(sluice_crc32c(0, out + 12, data));
	memcpy(out + 12 + data, &dc, 4);
	return 12 + data + 4;
}

static int scan(const unsigned char *p, size_t n, uint64_t *count, struct sl__tfr_rec **r)
{
	return sl__tfr_scan(p, n, "t.tfrecord", r, count);
}

int main(void)
{
	unsigned char buf[4096];
	struct sl__tfr_rec *r = NULL;
	uint64_t n = 0;
	size_t at = 0;

	T_CHECK(sl__tfr_unmask(mask(0x12345678u)) == 0x12345678u);
	at += put_record(buf + at, 100, 100, 'a');
	at += put_record(buf + at, 0, 0, 'b');
	at += put_record(buf + at, 1000, 1000, 'c');
	T_CHECK(scan(buf, at, &n, &r) == 0 && n == 3);
	T_CHECK(r && r[0].off == 12 && r[0].len == 100 && r[0].crc == sluice_crc32c(0, buf + 12, 100));
	T_CHECK(r && r[1].len == 0 && r[2].off == 116 + 16 + 12 && r[2].crc == sluice_crc32c(0, buf + r[2].off, 1000));
	free(r);
	T_CHECK(scan(buf, 0, &n, &r) == 0 && n == 0);
	free(r);
	/* Cut inside a header, and inside a record's data. */
	T_CHECK(scan(buf, 116 + 5, &n, &r) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "cut short"));
	free(r);
	T_CHECK(scan(buf, at - 3, &n, &r) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "record 2") &&
		strstr(sluice_last_error_detail(), "t.tfrecord"));
	free(r);
	/* A length whose CRC fails. */
	buf[116] ^= 1;
	T_CHECK(scan(buf, at, &n, &r) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "length's CRC"));
	free(r);
	buf[116] ^= 1;
	/* 5 GiB, its CRC right: refused, never a wrapped length. */
	put_record(buf + at, 5ull << 30, 0, 'd');
	T_CHECK(scan(buf, at + 16, &n, &r) == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "4 GiB"));
	free(r);
	/* 2^64 - 1: no overflow in the bound. */
	put_record(buf + at, UINT64_MAX, 0, 'e');
	T_CHECK(scan(buf, at + 16, &n, &r) == SLUICE_EFORMAT);
	free(r);
	{
		/* An empty file opens as a dataset of no records (a zero-length table: no copy from NULL). */
		char path[700];
		struct sluice_dataset *ds = NULL;
		FILE *f;

		snprintf(path, sizeof(path), "%s/empty.tfrecord", t_dir("t_tfrecord"));
		f = fopen(path, "wb");
		T_CHECK(f != NULL);
		if (f)
			fclose(f);
		T_CHECK(sluice_dataset_open(&ds, path) == 0 && ds && sluice_dataset_count(ds) == 0);
		sluice_dataset_close(ds);
	}
	return t_done("t_tfrecord");
}
