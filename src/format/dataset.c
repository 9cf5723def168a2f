/*
 * The dataset reader's generic layer: picks a format reader, opens data
 * files on first use, reads and CRC-checks records, and verifies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"

/* Format readers in the order they are tried. */
static const struct sl__ds_ops *const sl_readers[] = { &sl__ds_native_ops, &sl__ds_megatron_ops, &sl__ds_wds_ops,
						       &sl__ds_tfrecord_ops, &sl__ds_mds_ops,
						       &sl__ds_litdata_ops };

/*
 * The local file at local (path: how messages name it) mapped read-only;
 * an empty one is SLUICE_EFORMAT.  tag (or NULL): the version mapped.
 */
static int sl_map_local(const char *local, const char *path, const unsigned char **map, size_t *len, int enoent_hint,
			char *tag)
{
	struct stat st;
	void *m;
	int fd = sl__open_file(local, O_RDONLY, 0), rc = 0;

	if (fd < 0)
		return fd == -ENOENT && enoent_hint ? sl__err(fd, "%s (not a dataset sluice reads, or its writer did not finish)",
							      sluice_last_error_detail()) : fd;
	if (fstat(fd, &st) < 0) {
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
		st.st_size = 0;
	} else if (tag) {
		sl__fs_local_tag(&st, tag);
	}
	if (rc)
		;
	else if (st.st_size == 0)
		rc = sl__err(SLUICE_EFORMAT, "%s: empty file", path);
	else if ((m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
		rc = sl__err(-errno, "%s: mmap: %s", path, strerror(errno));
	else
		*map = m, *len = (size_t)st.st_size;
	close(fd);
	return rc;
}

int sl__map_ro(const char *path, const unsigned char **map, size_t *len, int enoent_hint)
{
	char local[4096];
	int rc;

	*map = NULL;
	*len = 0;
	if ((rc = sl__fs_local(path, (char[SL_TAG_MAX]){ 0 }, local, sizeof(local))))
		return rc == -ENOENT && enoent_hint ? sl__err(rc, "%s (not a dataset sluice reads, or its writer did not finish)",
							      sluice_last_error_detail()) : rc;
	return sl_map_local(local, path, map, len, enoent_hint, NULL);
}

int sl__ds_map(struct sluice_dataset *ds, unsigned f, const unsigned char **map, size_t *len)
{
	char local[4096], tag[SL_TAG_MAX] = "";
	int rc = sl__ds_path(ds, f, local, sizeof(local)), is_local = sl__fs_is_local(ds->files[f]);

	*map = NULL;
	*len = 0;
	if (!rc)
		rc = sl_map_local(local, ds->files[f], map, len, 0, is_local ? tag : NULL);
	/* A local file pinned to the version mapped: what was read from it at open describes that one. */
	pthread_mutex_lock(&ds->local_lock);
	if (is_local && tag[0] && !ds->tags[f][0])
		memcpy(ds->tags[f], tag, sizeof(tag));
	pthread_mutex_unlock(&ds->local_lock);
	return rc;
}

unsigned sl__ds_file_of(const uint64_t *first, unsigned nfiles, uint64_t i)
{
	unsigned lo = 0, hi = nfiles - 1;

	while (lo < hi) { /* the last file whose first record is at or before i (empty files skipped) */
		unsigned mid = (lo + hi + 1) / 2;

		if (first[mid] <= i)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

int sl__ds_files(struct sluice_dataset *ds, char **names, unsigned n)
{
	ds->files = names;
	ds->nfiles = n;
	ds->file_bytes = calloc(n ? n : 1, sizeof(uint64_t));
	ds->fds = malloc((n ? n : 1) * sizeof(*ds->fds));
	ds->local = calloc(n ? n : 1, sizeof(char *));
	ds->fetch_err = calloc(n ? n : 1, sizeof(char *));
	ds->fetch_rc = calloc(n ? n : 1, sizeof(int));
	ds->tags = calloc(n ? n : 1, sizeof(*ds->tags));
	if (!ds->file_bytes || !ds->fds || !ds->local || !ds->fetch_err || !ds->fetch_rc || !ds->tags)
		return -ENOMEM;
	for (unsigned f = 0; f < n; f++)
		atomic_init(&ds->fds[f], -1);
	return 0;
}

int sluice_dataset_open(struct sluice_dataset **out, const char *path)
{
	struct sluice_dataset *ds;
	int rc = 0;

	*out = NULL;
	sl__err_clear();
	ds = calloc(1, sizeof(*ds));
	if (!ds || !(ds->path = strdup(path))) {
		free(ds);
		return -ENOMEM;
	}
	static _Atomic uint64_t ids;

	ds->id = atomic_fetch_add(&ids, 1) + 1;
	pthread_mutex_init(&ds->local_lock, NULL);
	/* s3://bucket/prefix/ and s3://bucket/prefix name the same dataset (http too): its files are prefix/NAME. */
	if (!sl__fs_is_local(ds->path))
		sl__trim_slashes(ds->path);
	path = ds->path;
	/* A URL with a query names one object: a reader that would look for other names beside it is not asked. */
	int one = !sl__fs_is_local(path) && strchr(path, '?');

	for (size_t r = 0; r < sizeof(sl_readers) / sizeof(sl_readers[0]); r++)
		if ((!one || sl_readers[r]->one_file) && sl_readers[r]->probe(path)) {
			ds->ops = sl_readers[r];
			break;
		}
	if (!ds->ops && one) {
		rc = sl__err(-EINVAL, "%s: a URL with a query names one object: a .tfrecord file or a .tar is read so; "
			     "a dataset of several files needs its directory's URL", path);
		sluice_dataset_close(ds);
		return rc;
	}
	/* Unknown: let the native reader say what is missing. */
	if (!ds->ops)
		ds->ops = &sl__ds_native_ops;
	rc = ds->ops->open(ds, path);
	if (rc) {
		sluice_dataset_close(ds);
		return rc;
	}
	*out = ds;
	return 0;
}

static void (*_Atomic sl_closing)(uint64_t id);

void sl__ds_on_close(void (*fn)(uint64_t id))
{
	atomic_store(&sl_closing, fn);
}

void sluice_dataset_close(struct sluice_dataset *ds)
{
	void (*closing)(uint64_t id) = atomic_load(&sl_closing);

	if (!ds)
		return;
	if (closing)
		closing(ds->id);
	sl__cache_prefetch_stop(ds->prefetch);
	if (ds->ops)
		ds->ops->close(ds);
	for (unsigned f = 0; ds->fds && f < ds->nfiles; f++)
		if (ds->fds[f] >= 0)
			close(ds->fds[f]);
	for (unsigned f = 0; ds->files && f < ds->nfiles; f++)
		free(ds->files[f]);
	for (unsigned f = 0; ds->local && f < ds->nfiles; f++)
		free(ds->local[f]);
	for (unsigned f = 0; ds->fetch_err && f < ds->nfiles; f++)
		free(ds->fetch_err[f]);
	free(ds->local);
	free(ds->plan);
	free(ds->tags);
	free(ds->fetch_err);
	free(ds->fetch_rc);
	pthread_mutex_destroy(&ds->local_lock);
	free(ds->files);
	free(ds->file_bytes);
	free(ds->file_records);
	free((void *)ds->fds);
	free(ds->path);
	free(ds->metadata);
	free(ds);
}

const char *sluice_dataset_format(const struct sluice_dataset *ds)
{
	return ds->ops->name;
}

int sluice_dataset_has_crc(const struct sluice_dataset *ds)
{
	return ds->has_crc;
}

const char *sluice_dataset_metadata(const struct sluice_dataset *ds)
{
	return ds->metadata;
}

uint64_t sluice_dataset_count(const struct sluice_dataset *ds)
{
	return ds->nrecords;
}

unsigned sluice_dataset_shards(const struct sluice_dataset *ds)
{
	return ds->nfiles;
}

unsigned sluice_dataset_nfields(const struct sluice_dataset *ds)
{
	return ds->nfields;
}

const struct sluice_field *sluice_dataset_field(const struct sluice_dataset *ds, unsigned i)
{
	return i < ds->nfields ? &ds->fields[i] : NULL;
}

int sluice_dataset_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	if (i >= ds->nrecords)
		return sl__err(SLUICE_ERANGE, "%s: record %llu of %llu", ds->path, (unsigned long long)i,
			       (unsigned long long)ds->nrecords);
	ds->ops->locate(ds, i, loc);
	return ds->ops->entry_check ? ds->ops->entry_check(ds, i) : 0;
}

/* Fetches ahead the files of the plan (every file without one), in its order, as many as fit; local_lock held. */
static void sl_prefetch_start(struct sluice_dataset *ds)
{
	unsigned n = ds->plan ? ds->nplan : ds->nfiles;
	char **paths = calloc(n ? n : 1, sizeof(char *));
	uint64_t *bytes = calloc(n ? n : 1, sizeof(uint64_t));

	for (unsigned k = 0; paths && bytes && k < n; k++) {
		unsigned f = ds->plan ? ds->plan[k] : k;

		paths[k] = ds->files[f];
		bytes[k] = ds->file_bytes[f];
	}
	ds->prefetch = paths && bytes ? sl__cache_prefetch(paths, n, bytes) : NULL;
	ds->prefetch_tried = 1;
	free(paths);
	free(bytes);
}

int sl__ds_plan(struct sluice_dataset *ds, const unsigned *files, unsigned n)
{
	unsigned *plan;
	unsigned char *in;
	struct sl__prefetch *old;

	if (sl__fs_is_local(ds->path))
		return 0; /* read in place: nothing to fetch ahead or let go */
	plan = malloc((n ? n : 1) * sizeof(*plan));
	in = calloc(ds->nfiles ? ds->nfiles : 1, 1);
	if (!plan || !in) {
		free(plan);
		free(in);
		return -ENOMEM;
	}
	for (unsigned k = 0; k < n; k++)
		if (files[k] < ds->nfiles)
			in[files[k]] = 1;
	memcpy(plan, files, n * sizeof(*plan));
	pthread_mutex_lock(&ds->local_lock);
	free(ds->plan);
	ds->plan = plan;
	ds->nplan = n;
	old = ds->prefetch;
	ds->prefetch = NULL;
	/* A prefetch already running fetches the old plan: stopped, and started anew at the next read. */
	ds->prefetch_tried = 0;
	pthread_mutex_unlock(&ds->local_lock);
	sl__cache_prefetch_stop(old);
	/* Copies this loader will not read this epoch are the first the cache lets go. */
	for (unsigned f = 0; f < ds->nfiles; f++)
		if (!in[f] && !sl__fs_is_local(ds->files[f]))
			sl__cache_release(ds->files[f], ds->tags[f]);
	free(in);
	return 0;
}

/* A local file's path, which must still be the version the dataset pinned (its index or table read from it). */
static int sl_local_path(struct sluice_dataset *ds, unsigned f, char *path, size_t cap)
{
	char want[SL_TAG_MAX], now[SL_TAG_MAX];
	int rc;

	if ((size_t)snprintf(path, cap, "%s", ds->files[f]) >= cap)
		return sl__err(-ENAMETOOLONG, "%s: path too long", ds->files[f]);
	pthread_mutex_lock(&ds->local_lock);
	memcpy(want, ds->tags[f], sizeof(want));
	pthread_mutex_unlock(&ds->local_lock);
	if (!want[0])
		return 0;
	if ((rc = sl__fs_version(path, now)))
		return rc;
	return strcmp(want, now) ? sl__err(-ESTALE, "%s: replaced or rewritten since the dataset was opened", path) : 0;
}

int sl__ds_path(struct sluice_dataset *ds, unsigned f, char *path, size_t cap)
{
	char local[4096], tag[SL_TAG_MAX];
	int rc = 0, have;

	if (sl__fs_is_local(ds->files[f]))
		return sl_local_path(ds, f, path, cap);
	pthread_mutex_lock(&ds->local_lock);
	if (!ds->prefetch_tried)
		sl_prefetch_start(ds);
	/* A copy another process let go (the cache's limit) is fetched again. */
	if (ds->local[f] && access(ds->local[f], F_OK) != 0) {
		free(ds->local[f]);
		ds->local[f] = NULL;
	}
	have = ds->local[f] != NULL;
	/*
	 * A file whose fetch failed (a full cache directory, say) is not
	 * fetched again for each record: every later read fails the same way.
	 */
	if (!have && ds->fetch_rc[f])
		rc = sl__err(ds->fetch_rc[f], "%s", ds->fetch_err[f] ? ds->fetch_err[f] : ds->files[f]);
	memcpy(tag, ds->tags[f], sizeof(tag));
	pthread_mutex_unlock(&ds->local_lock);
	if (rc)
		return rc;
	/*
	 * Fetched outside the lock: readers of other files go on meanwhile.
	 * Pinned to the version the dataset first read (a copy never changes
	 * once made): a file replaced on the server since fails with -ESTALE,
	 * never new bytes read through the old index.
	 */
	if (!have && (rc = sl__fs_local(ds->files[f], tag, local, sizeof(local))) && rc != -ECANCELED &&
	    rc != -EINTR) {
		pthread_mutex_lock(&ds->local_lock);
		if (!ds->fetch_rc[f]) {
			ds->fetch_rc[f] = rc;
			ds->fetch_err[f] = strdup(sluice_last_error_detail());
		}
		pthread_mutex_unlock(&ds->local_lock);
	} else if (!have && !rc) {
		char *mine = strdup(local);

		pthread_mutex_lock(&ds->local_lock);
		if (!ds->tags[f][0])
			memcpy(ds->tags[f], tag, sizeof(tag));
		if (!mine)
			rc = -ENOMEM;
		else if (!ds->local[f])
			ds->local[f] = mine, mine = NULL;
		pthread_mutex_unlock(&ds->local_lock);
		free(mine);
	}
	pthread_mutex_lock(&ds->local_lock);
	if (!rc && (!ds->local[f] || (size_t)snprintf(path, cap, "%s", ds->local[f]) >= cap))
		rc = sl__err(-ENAMETOOLONG, "%s: the cached copy's path does not fit", ds->files[f]);
	pthread_mutex_unlock(&ds->local_lock);
	return rc;
}

int sl__ds_fd(struct sluice_dataset *ds, unsigned f)
{
	int fd = atomic_load(&ds->fds[f]), mine, none = -1, rc;
	char path[4096];

	if (fd >= 0)
		return fd;
	if ((rc = sl__ds_path(ds, f, path, sizeof(path))))
		return rc;
	mine = sl__open_file(path, O_RDONLY, 0); /* a shard an index names: a FIFO there must not hold the read */
	if (mine < 0)
		return mine;
	if (!atomic_compare_exchange_strong(&ds->fds[f], &none, mine)) {
		close(mine); /* another thread won the race */
		return none;
	}
	return mine;
}

int sl__ds_pread(struct sluice_dataset *ds, unsigned f, void *buf, size_t n, uint64_t off, const char *what,
		 uint64_t which)
{
	int fd = sl__ds_fd(ds, f);

	if (fd < 0)
		return fd;
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return sl__err(r < 0 ? -errno : SLUICE_EFORMAT, "%s: %s %llu at offset %llu: %s", ds->files[f], what,
				       (unsigned long long)which, (unsigned long long)off,
				       r < 0 ? strerror(errno) : "file is truncated");
		got += (size_t)r;
	}
	return 0;
}

int sl__ds_loc_check(const struct sluice_dataset *ds, uint64_t i, const struct sluice_record_loc *loc)
{
	int rc = ds->ops->entry_check ? ds->ops->entry_check(ds, i) : 0;

	if (rc)
		return rc;
	if (loc->shard >= ds->nfiles || loc->offset > ds->file_bytes[loc->shard] ||
	    loc->length > ds->file_bytes[loc->shard] - loc->offset)
		return sl__err(SLUICE_EFORMAT, "%s: record %llu points outside its file (file %u, offset %llu, %u bytes)",
			       ds->path, (unsigned long long)i, loc->shard, (unsigned long long)loc->offset, loc->length);
	return 0;
}

int sluice_dataset_decode(const struct sluice_dataset *ds, uint64_t i, const void *bytes, size_t len,
			  struct sluice_record *rec)
{
	if (i >= ds->nrecords)
		return sl__err(SLUICE_ERANGE, "%s: record %llu of %llu", ds->path, (unsigned long long)i,
			       (unsigned long long)ds->nrecords);
	return ds->ops->decode(ds, i, bytes, len, rec);
}

ssize_t sluice_dataset_read(struct sluice_dataset *ds, uint64_t i, void *buf, size_t cap,
			    struct sluice_record *rec)
{
	struct sluice_record_loc loc;
	int rc;

	sl__err_clear();
	rc = sluice_dataset_locate(ds, i, &loc);
	if (!rc)
		rc = sl__ds_loc_check(ds, i, &loc);
	if (rc)
		return rc;
	if (cap < loc.length)
		return sl__err(-ENOSPC, "record %llu needs %u bytes, buffer has %zu", (unsigned long long)i,
			       loc.length, cap);
	rc = ds->compressed ? ds->ops->fetch(ds, i, &loc, buf)
			    : sl__ds_pread(ds, loc.shard, buf, loc.length, loc.offset, "record", i);
	if (rc)
		return rc;
	if (ds->has_crc && sluice_crc32c(0, buf, loc.length) != loc.crc)
		return sl__err(SLUICE_ECRC, "%s: record %llu at offset %llu: CRC mismatch", ds->files[loc.shard],
			       (unsigned long long)i, (unsigned long long)loc.offset);
	rc = ds->ops->decode(ds, i, buf, loc.length, rec);
	if (rc)
		return sl__err(rc, "%s: record %llu: %s", ds->files[loc.shard], (unsigned long long)i,
			       sluice_last_error_detail());
	return loc.length;
}

int64_t sluice_dataset_verify(struct sluice_dataset *ds, void (*bad)(const struct sluice_bad *, void *),
			      void *user)
{
	unsigned char *buf = NULL, *told = calloc(ds->nfiles ? ds->nfiles : 1, 1);
	size_t cap = 0;
	int64_t problems = !told ? -ENOMEM : ds->ops->check ? ds->ops->check(ds, bad, user) : 0;

	/* Shards whose fetch failed in the check were reported there. */
	for (unsigned f = 0; told && f < ds->nfiles; f++)
		told[f] = ds->fetch_rc[f] != 0;
	for (uint64_t i = 0; problems >= 0 && i < ds->nrecords; i++) {
		struct sluice_record_loc loc;
		ssize_t r;

		ds->ops->locate(ds, i, &loc);
		if (sl__reserve(&buf, &cap, loc.length)) {
			problems = -ENOMEM;
			break;
		}
		r = sluice_dataset_read(ds, i, buf, cap, NULL);
		if (r < 0) {
			/* A shard that could not be fetched (a cache too small for it) is one problem, not one per record. */
			int shard = loc.shard < ds->nfiles && ds->fetch_rc[loc.shard];
			struct sluice_bad b = { shard ? UINT64_MAX : i, loc.shard, shard ? 0 : loc.offset, (int)r,
						sluice_last_error_detail() };

			if (shard && told[loc.shard])
				continue;
			if (shard)
				told[loc.shard] = 1;
			if (bad)
				bad(&b, user);
			problems++;
		}
	}
	free(buf);
	free(told);
	return problems;
}

int sluice_dataset_shard_info(const struct sluice_dataset *ds, unsigned s, uint64_t *records, uint64_t *bytes)
{
	if (s >= ds->nfiles)
		return sl__err(SLUICE_ERANGE, "%s: no shard %u (the dataset has %u)", ds->path, s, ds->nfiles);
	*records = ds->file_records ? ds->file_records[s] : UINT64_MAX;
	*bytes = ds->file_bytes[s];
	return 0;
}

const char *sluice_dataset_compression(struct sluice_dataset *ds, double *ratio)
{
	uint64_t stored = 0, logical = 0;

	if (ratio) {
		*ratio = 1.0;
		if (ds->ops->sizes && ds->ops->sizes(ds, &stored, &logical) == 0 && stored)
			*ratio = (double)logical / (double)stored;
	}
	return !ds->compressed ? "none" : ds->codec ? ds->codec : "zstd";
}
