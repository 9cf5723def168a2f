/*
 * Reader of sluice's own format (docs/FORMAT.md): the index is mapped and
 * checked in O(fields + shards); entries are read on demand.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"

struct sl_native {
	struct sl__index ix;
	const unsigned char *map; /* the whole index file */
	size_t map_len;
};

static int sl_native_probe(const char *path)
{
	char p[4096];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", path, SL_INDEX_NAME);
	return stat(p, &st) == 0;
}

static int sl_native_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_native *nv = calloc(1, sizeof(*nv));
	char *ip = NULL, **names = NULL;
	int rc;

	if (!nv || asprintf(&ip, "%s/%s", path, SL_INDEX_NAME) < 0) {
		free(nv);
		return -ENOMEM;
	}
	ds->priv = nv;
	rc = sl__map_ro(ip, &nv->map, &nv->map_len, 1);
	if (rc)
		goto out;
	rc = sl__index_parse(nv->map, nv->map_len, nv->map_len, &nv->ix);
	if (rc) {
		rc = sl__err(rc, "%s: %s", ip, sluice_last_error_detail());
		goto out;
	}
	/*
	 * Loaders touch entries in shuffled order: no readahead around them,
	 * so only the pages of records actually looked up become resident.
	 */
	if (nv->map_len > nv->ix.entries_off)
		madvise((void *)(nv->map + nv->ix.entries_off), nv->map_len - nv->ix.entries_off, MADV_RANDOM);
	ds->nrecords = nv->ix.nrecords;
	ds->nfields = nv->ix.nfields;
	for (unsigned f = 0; f < ds->nfields; f++) {
		ds->fields[f] = nv->ix.fields[f];
		memcpy(ds->names[f], nv->ix.names[f], sizeof(ds->names[f]));
		ds->fields[f].name = ds->names[f];
	}
	ds->has_crc = 1;
	names = calloc(nv->ix.nshards, sizeof(char *));
	for (unsigned s = 0; names && s < nv->ix.nshards; s++)
		if (asprintf(&names[s], "%s/shard-%06u.sls", path, s) < 0)
			names[s] = NULL, rc = -ENOMEM;
	if (!names || rc) {
		for (unsigned s = 0; names && s < nv->ix.nshards; s++)
			free(names[s]);
		free(names);
		rc = -ENOMEM;
		goto out;
	}
	rc = sl__ds_files(ds, names, nv->ix.nshards);
	ds->file_records = malloc(nv->ix.nshards * sizeof(uint64_t));
	if (!rc && !ds->file_records)
		rc = -ENOMEM;
	for (unsigned s = 0; !rc && s < nv->ix.nshards; s++) {
		ds->file_bytes[s] = SL_HDR_SIZE + nv->ix.shard_bytes[s];
		ds->file_records[s] = nv->ix.shard_records[s];
	}
out:
	free(ip);
	return rc;
}

static void sl_native_close(struct sluice_dataset *ds)
{
	struct sl_native *nv = ds->priv;

	if (!nv)
		return;
	if (nv->map)
		munmap((void *)nv->map, nv->map_len);
	sl__index_free(&nv->ix);
	free(nv);
}

static void sl_native_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_native *nv = ds->priv;
	const unsigned char *e = nv->map + nv->ix.entries_off + (uint64_t)SL_ENTRY * i;
	unsigned lo = 0, hi = nv->ix.nshards - 1;

	/* Shards hold consecutive runs of records: the last shard starting at or before i. */
	while (lo < hi) {
		unsigned mid = (lo + hi + 1) / 2;

		if (nv->ix.shard_first[mid] <= i)
			lo = mid;
		else
			hi = mid - 1;
	}
	loc->shard = lo;
	loc->offset = 8 * (uint64_t)sl__le32(e);
	loc->length = sl__le32(e + 4);
	loc->crc = sl__le32(e + 8);
}

static int sl_native_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			    struct sluice_record *rec)
{
	(void)i;
	return sl__record_decode(ds->fields, ds->nfields, p, len, rec);
}

static void sl_report(void (*bad)(const struct sluice_bad *, void *), void *user, uint64_t rec, unsigned shard,
		      uint64_t off, int code)
{
	struct sluice_bad b = { rec, shard, off, code, sluice_last_error_detail() };

	if (bad)
		bad(&b, user);
}

/* Shard headers against the index, and records in order inside their shards. */
static int64_t sl_native_check(struct sluice_dataset *ds, void (*bad)(const struct sluice_bad *, void *),
			       void *user)
{
	const struct sl_native *nv = ds->priv;
	const unsigned S = nv->ix.nshards;
	uint64_t *next = calloc(S, sizeof(uint64_t)), *count = calloc(S, sizeof(uint64_t));
	int64_t problems = 0;

	if (!next || !count) {
		free(next);
		free(count);
		return -ENOMEM;
	}
	for (unsigned s = 0; s < S; s++) {
		unsigned char h[64];
		uint32_t num;
		uint64_t nrec, dlen;
		struct stat st;
		int fd = sl__ds_fd(ds, s), rc;

		next[s] = SL_HDR_SIZE;
		if (fd < 0) {
			sl_report(bad, user, UINT64_MAX, s, 0, fd);
			problems++;
			continue;
		}
		rc = pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) ? sl__shard_header_parse(h, sizeof(h), &num, &nrec, &dlen)
								      : sl__err(SLUICE_EFORMAT, "header unreadable");
		if (!rc && (num != s || nrec != nv->ix.shard_records[s] || dlen != nv->ix.shard_bytes[s]))
			rc = sl__err(SLUICE_EFORMAT, "header says shard %u, %llu records, %llu bytes; the index says shard %u, %llu, %llu",
				     num, (unsigned long long)nrec, (unsigned long long)dlen, s,
				     (unsigned long long)nv->ix.shard_records[s], (unsigned long long)nv->ix.shard_bytes[s]);
		if (!rc && (fstat(fd, &st) < 0 || (uint64_t)st.st_size != SL_HDR_SIZE + dlen))
			rc = sl__err(SLUICE_EFORMAT, "file is %lld bytes, header says %llu", (long long)st.st_size,
				     (unsigned long long)(SL_HDR_SIZE + dlen));
		if (rc) {
			sl__err(rc, "%s: %s", ds->files[s], sluice_last_error_detail());
			sl_report(bad, user, UINT64_MAX, s, 0, rc);
			problems++;
		}
	}
	for (uint64_t i = 0; i < ds->nrecords; i++) {
		struct sluice_record_loc loc;

		sl_native_locate(ds, i, &loc);
		if (loc.shard >= S)
			continue; /* the read pass reports it */
		if (loc.offset < next[loc.shard] || loc.offset % 8) {
			sl__err(SLUICE_EFORMAT, "record %llu overlaps the previous record of shard %u or is misaligned",
				(unsigned long long)i, loc.shard);
			sl_report(bad, user, i, loc.shard, loc.offset, SLUICE_EFORMAT);
			problems++;
		}
		if (loc.offset + loc.length > next[loc.shard])
			next[loc.shard] = loc.offset + loc.length;
		count[loc.shard]++;
	}
	for (unsigned s = 0; s < S; s++)
		if (count[s] != nv->ix.shard_records[s]) {
			sl__err(SLUICE_EFORMAT, "%s: the index places %llu records in it, its table says %llu", ds->files[s],
				(unsigned long long)count[s], (unsigned long long)nv->ix.shard_records[s]);
			sl_report(bad, user, UINT64_MAX, s, 0, SLUICE_EFORMAT);
			problems++;
		}
	free(next);
	free(count);
	return problems;
}

const struct sl__ds_ops sl__ds_native_ops = {
	.name = "sluice",
	.probe = sl_native_probe,
	.open = sl_native_open,
	.close = sl_native_close,
	.locate = sl_native_locate,
	.decode = sl_native_decode,
	.check = sl_native_check,
};
