/*
 * Dataset reader: O(1) open (header, schema, shard table; the entries are
 * mapped, not read), record lookup and CRC-checked reads, and a full
 * verification pass.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"

struct sluice_dataset {
	char *dir;
	struct sl__index ix;
	const unsigned char *map; /* the whole index file */
	size_t map_len;
	_Atomic int *fds;         /* shard descriptors, opened on first use */
};

int sluice_dataset_open(struct sluice_dataset **out, const char *path)
{
	struct sluice_dataset *ds;
	struct stat st;
	char *ip;
	int fd, rc;

	*out = NULL;
	sl__err_clear();
	if (asprintf(&ip, "%s/%s", path, SL_INDEX_NAME) < 0)
		return -ENOMEM;
	fd = open(ip, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = sl__err(-errno, "%s: %s%s", ip, strerror(errno),
			     errno == ENOENT ? " (not a sluice dataset, or its writer did not finish)" : "");
		free(ip);
		return rc;
	}
	ds = calloc(1, sizeof(*ds));
	if (!ds || fstat(fd, &st) < 0) {
		rc = ds ? -errno : -ENOMEM;
		goto fail;
	}
	ds->map_len = (size_t)st.st_size;
	ds->map = ds->map_len ? mmap(NULL, ds->map_len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (ds->map == MAP_FAILED) {
		ds->map = NULL;
		rc = ds->map_len ? sl__err(-errno, "%s: mmap: %s", ip, strerror(errno))
				 : sl__err(SLUICE_EFORMAT, "%s: empty file", ip);
		goto fail;
	}
	rc = sl__index_parse(ds->map, ds->map_len, (uint64_t)st.st_size, &ds->ix);
	if (rc) {
		rc = sl__err(rc, "%s: %s", ip, sluice_last_error_detail());
		goto fail;
	}
	ds->dir = strdup(path);
	ds->fds = malloc(ds->ix.nshards * sizeof(*ds->fds));
	if (!ds->dir || !ds->fds) {
		rc = -ENOMEM;
		goto fail;
	}
	for (unsigned s = 0; s < ds->ix.nshards; s++)
		atomic_init(&ds->fds[s], -1);
	close(fd);
	free(ip);
	*out = ds;
	return 0;
fail:
	close(fd);
	free(ip);
	sluice_dataset_close(ds);
	return rc;
}

void sluice_dataset_close(struct sluice_dataset *ds)
{
	if (!ds)
		return;
	for (unsigned s = 0; ds->fds && s < ds->ix.nshards; s++)
		if (ds->fds[s] >= 0)
			close(ds->fds[s]);
	if (ds->map)
		munmap((void *)ds->map, ds->map_len);
	sl__index_free(&ds->ix);
	free(ds->fds);
	free(ds->dir);
	free(ds);
}

uint64_t sluice_dataset_count(const struct sluice_dataset *ds)
{
	return ds->ix.nrecords;
}

unsigned sluice_dataset_shards(const struct sluice_dataset *ds)
{
	return ds->ix.nshards;
}

unsigned sluice_dataset_nfields(const struct sluice_dataset *ds)
{
	return ds->ix.nfields;
}

const struct sluice_field *sluice_dataset_field(const struct sluice_dataset *ds, unsigned i)
{
	return i < ds->ix.nfields ? &ds->ix.fields[i] : NULL;
}

int sluice_dataset_shard_info(const struct sluice_dataset *ds, unsigned s, uint64_t *records, uint64_t *bytes)
{
	if (s >= ds->ix.nshards)
		return sl__err(SLUICE_ERANGE, "%s: shard %u of %u", ds->dir, s, ds->ix.nshards);
	*records = ds->ix.shard_records[s];
	*bytes = ds->ix.shard_bytes[s];
	return 0;
}

int sluice_dataset_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const unsigned char *e;
	uint64_t l;

	if (i >= ds->ix.nrecords)
		return sl__err(SLUICE_ERANGE, "%s: record %llu of %llu", ds->dir, (unsigned long long)i,
			       (unsigned long long)ds->ix.nrecords);
	e = ds->map + ds->ix.entries_off + 16 * i;
	l = sl__le64(e);
	loc->shard = (unsigned)(l >> SL_LOC_SHIFT);
	loc->offset = l & ((1ull << SL_LOC_SHIFT) - 1);
	loc->length = sl__le32(e + 8);
	loc->crc = sl__le32(e + 12);
	return 0;
}

/* The descriptor of shard s, opening it on first use. */
static int sl_shard_fd(struct sluice_dataset *ds, unsigned s)
{
	int fd = atomic_load(&ds->fds[s]), mine, none = -1;
	char name[64], *p;

	if (fd >= 0)
		return fd;
	snprintf(name, sizeof(name), "shard-%06u.sls", s);
	if (asprintf(&p, "%s/%s", ds->dir, name) < 0)
		return -ENOMEM;
	mine = open(p, O_RDONLY | O_CLOEXEC);
	if (mine < 0) {
		fd = sl__err(-errno, "%s: %s", p, strerror(errno));
		free(p);
		return fd;
	}
	free(p);
	if (!atomic_compare_exchange_strong(&ds->fds[s], &none, mine)) {
		close(mine); /* another thread won the race */
		return none;
	}
	return mine;
}

/* Checks that loc lies inside its shard's data as the index describes it. */
static int sl_loc_check(const struct sluice_dataset *ds, uint64_t i, const struct sluice_record_loc *loc)
{
	if (loc->shard >= ds->ix.nshards || loc->offset < SL_HDR_SIZE || loc->offset % 8 ||
	    loc->offset - SL_HDR_SIZE + loc->length > ds->ix.shard_bytes[loc->shard])
		return sl__err(SLUICE_EFORMAT, "%s: record %llu points outside its shard (shard %u, offset %llu, %u bytes)",
			       ds->dir, (unsigned long long)i, loc->shard, (unsigned long long)loc->offset, loc->length);
	return 0;
}

int sluice_dataset_decode(const struct sluice_dataset *ds, const void *bytes, size_t len,
			  struct sluice_record *rec)
{
	return sl__record_decode(ds->ix.fields, ds->ix.nfields, bytes, len, rec);
}

ssize_t sluice_dataset_read(struct sluice_dataset *ds, uint64_t i, void *buf, size_t cap,
			    struct sluice_record *rec)
{
	struct sluice_record_loc loc;
	size_t got = 0;
	int rc, fd;

	sl__err_clear();
	rc = sluice_dataset_locate(ds, i, &loc);
	if (!rc)
		rc = sl_loc_check(ds, i, &loc);
	if (rc)
		return rc;
	if (cap < loc.length)
		return sl__err(-ENOSPC, "record %llu needs %u bytes, buffer has %zu", (unsigned long long)i,
			       loc.length, cap);
	fd = sl_shard_fd(ds, loc.shard);
	if (fd < 0)
		return fd;
	while (got < loc.length) {
		ssize_t r = pread(fd, (char *)buf + got, loc.length - got, (off_t)(loc.offset + got));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return sl__err(r < 0 ? -errno : SLUICE_EFORMAT, "%s/shard-%06u.sls: record %llu at offset %llu: %s",
				       ds->dir, loc.shard, (unsigned long long)i, (unsigned long long)loc.offset,
				       r < 0 ? strerror(errno) : "shard is truncated");
		got += (size_t)r;
	}
	if (sluice_crc32c(0, buf, loc.length) != loc.crc)
		return sl__err(SLUICE_ECRC, "%s/shard-%06u.sls: record %llu at offset %llu: CRC mismatch", ds->dir,
			       loc.shard, (unsigned long long)i, (unsigned long long)loc.offset);
	rc = sl__record_decode(ds->ix.fields, ds->ix.nfields, buf, loc.length, rec);
	if (rc)
		return sl__err(rc, "%s/shard-%06u.sls: record %llu: %s", ds->dir, loc.shard, (unsigned long long)i,
			       sluice_last_error_detail());
	return loc.length;
}

static void sl_report(void (*bad)(const struct sluice_bad *, void *), void *user, uint64_t rec,
		      unsigned shard, uint64_t off, int code)
{
	struct sluice_bad b = { rec, shard, off, code, sluice_last_error_detail() };

	if (bad)
		bad(&b, user);
}

int64_t sluice_dataset_verify(struct sluice_dataset *ds, void (*bad)(const struct sluice_bad *, void *),
			      void *user)
{
	const unsigned S = ds->ix.nshards;
	uint64_t *next = calloc(S, sizeof(uint64_t)), *count = calloc(S, sizeof(uint64_t));
	unsigned char *buf = NULL;
	size_t cap = 0;
	int64_t problems = 0;

	if (!next || !count) {
		free(next);
		free(count);
		return -ENOMEM;
	}
	/* Shard headers and sizes against the shard table. */
	for (unsigned s = 0; s < S; s++) {
		unsigned char h[64];
		uint32_t num;
		uint64_t nrec, dlen;
		struct stat st;
		int fd = sl_shard_fd(ds, s), rc;

		next[s] = SL_HDR_SIZE;
		if (fd < 0) {
			sl_report(bad, user, UINT64_MAX, s, 0, fd);
			problems++;
			continue;
		}
		rc = pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) ? sl__shard_header_parse(h, sizeof(h), &num, &nrec, &dlen)
								      : sl__err(SLUICE_EFORMAT, "header unreadable");
		if (!rc && (num != s || nrec != ds->ix.shard_records[s] || dlen != ds->ix.shard_bytes[s]))
			rc = sl__err(SLUICE_EFORMAT, "header says shard %u, %llu records, %llu bytes; the index says shard %u, %llu, %llu",
				     num, (unsigned long long)nrec, (unsigned long long)dlen, s,
				     (unsigned long long)ds->ix.shard_records[s], (unsigned long long)ds->ix.shard_bytes[s]);
		if (!rc && (fstat(fd, &st) < 0 || (uint64_t)st.st_size != SL_HDR_SIZE + dlen))
			rc = sl__err(SLUICE_EFORMAT, "file is %lld bytes, header says %llu", (long long)st.st_size,
				     (unsigned long long)(SL_HDR_SIZE + dlen));
		if (rc) {
			sl__err(rc, "%s/shard-%06u.sls: %s", ds->dir, s, sluice_last_error_detail());
			sl_report(bad, user, UINT64_MAX, s, 0, rc);
			problems++;
		}
	}
	/* Every record: in order within its shard, inside it, CRC and fields good. */
	for (uint64_t i = 0; i < ds->ix.nrecords; i++) {
		struct sluice_record_loc loc;
		ssize_t r;

		if (sluice_dataset_locate(ds, i, &loc) == 0 && (sl_loc_check(ds, i, &loc) || loc.offset < next[loc.shard])) {
			if (loc.shard < S && loc.offset < next[loc.shard])
				sl__err(SLUICE_EFORMAT, "record %llu overlaps or precedes the previous record of shard %u",
					(unsigned long long)i, loc.shard);
			sl_report(bad, user, i, loc.shard, loc.offset, SLUICE_EFORMAT);
			problems++;
			continue;
		}
		next[loc.shard] = loc.offset + loc.length;
		count[loc.shard]++;
		if (loc.length > cap) {
			unsigned char *b = realloc(buf, loc.length);

			if (!b) {
				problems = -ENOMEM;
				break;
			}
			buf = b;
			cap = loc.length;
		}
		r = sluice_dataset_read(ds, i, buf, cap, NULL);
		if (r < 0) {
			sl_report(bad, user, i, loc.shard, loc.offset, (int)r);
			problems++;
		}
	}
	for (unsigned s = 0; problems >= 0 && s < S; s++)
		if (count[s] != ds->ix.shard_records[s]) {
			sl__err(SLUICE_EFORMAT, "%s/shard-%06u.sls: the index places %llu records in it, its table says %llu", ds->dir, s,
				(unsigned long long)count[s], (unsigned long long)ds->ix.shard_records[s]);
			sl_report(bad, user, UINT64_MAX, s, 0, SLUICE_EFORMAT);
			problems++;
		}
	free(buf);
	free(next);
	free(count);
	return problems;
}
