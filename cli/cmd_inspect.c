/* sluice inspect: what a dataset holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define CMD "inspect"

/*
 * Prints one record's fields, one per line: name, then its value or a digest; with json one object,
 * {"path", "record", "fields": [{"name", "bytes", "crc32c", "head" (the first 16 bytes in hex), "value" (an i64's)}]}.
 */
static int print_record(struct sluice_dataset *ds, const char *path, uint64_t i, int json)
{
	struct sluice_record_loc loc;
	struct sluice_record rec;
	unsigned char *buf;
	ssize_t r;
	int rc = sluice_dataset_locate(ds, i, &loc);

	if (rc) {
		sluice_dataset_close(ds);
		return cli_error(CMD, path, rc);
	}
	buf = malloc(loc.length ? loc.length : 1);
	r = buf ? sluice_dataset_read(ds, i, buf, loc.length, &rec) : -12;
	if (r < 0) {
		free(buf);
		sluice_dataset_close(ds);
		return cli_error(CMD, path, (long)r);
	}
	if (json) {
		printf("{\"path\":");
		cli_json_str(cli_shown(path));
		printf(",\"record\":%llu,\"fields\":[", (unsigned long long)i);
	}
	for (unsigned f = 0; f < sluice_dataset_nfields(ds); f++) {
		const struct sluice_field *fd = sluice_dataset_field(ds, f);
		const unsigned char *d = rec.data[f];

		if (json) {
			printf("%s{\"name\":", f ? "," : "");
			cli_json_str(fd->name);
			printf(",\"bytes\":%zu,\"crc32c\":\"%08x\",\"head\":\"", rec.len[f], sluice_crc32c(0, d, rec.len[f]));
			for (size_t k = 0; k < rec.len[f] && k < 16; k++)
				printf("%02x", d[k]);
			printf("\"");
			if (fd->dtype == SLUICE_DTYPE_I64 && rec.len[f] == 8) {
				int64_t v;

				memcpy(&v, d, 8);
				printf(",\"value\":%lld", (long long)v);
			}
			printf("}");
			continue;
		}
		printf("%s\t%zu\t", fd->name, rec.len[f]);
		if (fd->dtype == SLUICE_DTYPE_I64 && rec.len[f] == 8) {
			int64_t v;

			memcpy(&v, d, 8);
			printf("%lld", (long long)v);
		} else {
			printf("crc32c=%08x ", sluice_crc32c(0, d, rec.len[f]));
			for (size_t k = 0; k < rec.len[f] && k < 16; k++)
				printf("%02x", d[k]);
		}
		putchar('\n');
	}
	if (json)
		printf("]}\n");
	free(buf);
	sluice_dataset_close(ds);
	return 0;
}

int cmd_inspect(int argc, char **argv)
{
	struct sluice_dataset *ds;
	const char *path = NULL, *rec_arg = NULL;
	int json = 0, rc, one = 0;
	uint64_t n, total = 0, minl = UINT64_MAX, maxl = 0, rec_no = 0;

	rc = cli_open_dataset(CMD, argc, argv,
			      "usage: sluice inspect [--json] [--record N] DATASET\n"
			      "  --record N   print record N's fields (bytes: length, CRC32C and the first 16 bytes)\n"
			      "  --json       one object; a failure is an object with \"error\"\n",
			      "--record", &rec_arg, &json, &path, &ds);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (rec_arg) {
		if (cli_size(CMD, "--record", rec_arg, &rec_no)) {
			sluice_dataset_close(ds);
			return 2;
		}
		one = 1;
	}
	if (one)
		return print_record(ds, path, rec_no, json);
	/*
	 * Stored bytes from the file table; record sizes from an even sample
	 * of at most 100000 records, so inspect stays fast at 10^9 records.
	 */
	n = sluice_dataset_count(ds);
	for (unsigned f = 0; f < sluice_dataset_shards(ds); f++) {
		uint64_t r, b;

		if (sluice_dataset_shard_info(ds, f, &r, &b) == 0)
			total += b;
	}
	uint64_t step = n > 100000 ? n / 100000 : 1, sampled = 0, ssum = 0;

	for (uint64_t i = 0; i < n; i += step) {
		struct sluice_record_loc loc;

		if (sluice_dataset_locate(ds, i, &loc))
			break;
		ssum += loc.length;
		sampled++;
		minl = loc.length < minl ? loc.length : minl;
		maxl = loc.length > maxl ? loc.length : maxl;
	}
	if (!n)
		minl = 0;
	double ratio;
	const char *codec = sluice_dataset_compression(ds, &ratio);
	uint64_t stored = (uint64_t)((double)total / ratio + 0.5);

	if (json) {
		printf("{\"path\":");
		cli_json_str(cli_shown(path));
		printf(",\"format\":\"%s\",\"records\":%llu,\"shards\":%u,\"stored_bytes\":%llu,"
		       "\"record_bytes\":{\"min\":%llu,\"avg\":%.1f,\"max\":%llu,\"sampled\":%llu},"
		       "\"data_bytes\":%llu,\"compression\":\"%s\",\"compression_ratio\":%.3f,\"fields\":[",
		       sluice_dataset_format(ds), (unsigned long long)n, sluice_dataset_shards(ds), (unsigned long long)stored,
		       (unsigned long long)minl, sampled ? (double)ssum / (double)sampled : 0.0, (unsigned long long)maxl,
		       (unsigned long long)sampled, (unsigned long long)total, codec, ratio);
	} else {
		printf("%s: %s format, %llu records in %u file(s), %.1f MB stored\n", cli_shown(path), sluice_dataset_format(ds),
		       (unsigned long long)n, sluice_dataset_shards(ds), (double)stored / 1e6);
		printf("record bytes (%s %llu records): min %llu, avg %.1f, max %llu; compression %s (ratio %.2f)\nfields:\n",
		       sampled == n ? "all" : "a sample of", (unsigned long long)sampled, (unsigned long long)minl,
		       sampled ? (double)ssum / (double)sampled : 0.0, (unsigned long long)maxl, codec, ratio);
	}
	for (unsigned f = 0; f < sluice_dataset_nfields(ds); f++) {
		const struct sluice_field *fd = sluice_dataset_field(ds, f);
		char shape[128] = "";
		size_t l = 0;

		for (int d = 0; d < fd->ndim; d++) {
			if (fd->shape[d] < 0)
				l += (size_t)snprintf(shape + l, sizeof(shape) - l, "%s%s", d ? "," : "", json ? "-1" : "*");
			else
				l += (size_t)snprintf(shape + l, sizeof(shape) - l, "%s%lld", d ? "," : "", (long long)fd->shape[d]);
		}
		if (json) {
			printf("%s{\"name\":", f ? "," : "");
			cli_json_str(fd->name);
			printf(",\"dtype\":\"%s\",\"shape\":[%s]}", sluice_dtype_name(fd->dtype), shape);
		} else {
			printf("  %-16s %-5s [%s]\n", fd->name, sluice_dtype_name(fd->dtype), shape);
		}
	}
	if (json) {
		printf("],\"shard_list\":[");
		for (unsigned s = 0; s < sluice_dataset_shards(ds); s++) {
			uint64_t r = 0, b = 0;

			/* One entry a shard, in order: null for one whose figures are not known. */
			if (sluice_dataset_shard_info(ds, s, &r, &b) == 0)
				printf("%s{\"records\":%llu,\"bytes\":%llu}", s ? "," : "", (unsigned long long)r,
				       (unsigned long long)b);
			else
				printf("%snull", s ? "," : "");
		}
		/*
		 * The writer's metadata is a JSON object (checked when written): embedded as it is.  A file's bytes
		 * can say anything, though: metadata that is not JSON is given as a string of its text.
		 */
		printf("],\"metadata\":");
		if (!sluice_dataset_metadata(ds))
			printf("null");
		else if (cli_json_valid(sluice_dataset_metadata(ds)))
			fputs(sluice_dataset_metadata(ds), stdout);
		else
			cli_json_str(sluice_dataset_metadata(ds));
		printf("}\n");
	} else if (sluice_dataset_metadata(ds)) {
		printf("metadata: %.*s%s\n", 400, sluice_dataset_metadata(ds),
		       strlen(sluice_dataset_metadata(ds)) > 400 ? "..." : "");
	}
	sluice_dataset_close(ds);
	return 0;
}
