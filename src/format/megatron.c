/*
 * Reader of Megatron/NeMo indexed datasets (PREFIX.bin + PREFIX.idx), in
 * place: the .idx is read whole into memory (12 bytes a sequence, 8 a
 * document) and its header checked; sequences are read from the .bin on
 * demand, the .bin pinned to the version open saw.  The .idx is read, not
 * mapped: Megatron's builder rewrites it in place (open(..., "wb")), and
 * a mapping of it then gave the new lengths and pointers against the old
 * .bin, or zeros past its new end, silently (SIGBUS past its last page).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"

#define SL_MM_MAGIC "MMIDIDX\0\0"
#define SL_MM_HDR 34

struct sl_mm {
	unsigned char *map; /* the whole .idx, read at open (malloc'd) */
	size_t map_len;
	struct sl__mmidx ix;
};

/* Megatron dtype codes 1..8 to sluice dtypes. */
static const enum sluice_dtype sl_mm_dtype[9] = {
	0, SLUICE_DTYPE_U8, SLUICE_DTYPE_I8, SLUICE_DTYPE_I16, SLUICE_DTYPE_I32,
	SLUICE_DTYPE_I64, SLUICE_DTYPE_F64, SLUICE_DTYPE_F32, SLUICE_DTYPE_U16,
};

int sl__mmidx_parse(const unsigned char *p, size_t len, struct sl__mmidx *ix)
{
	uint64_t need;

	memset(ix, 0, sizeof(*ix));
	if (len < SL_MM_HDR)
		return sl__err(SLUICE_EFORMAT, "Megatron index truncated (%zu bytes)", len);
	if (memcmp(p, SL_MM_MAGIC, 9))
		return sl__err(SLUICE_EFORMAT, "not a Megatron index (bad magic)");
	if (sl__le64(p + 9) != 1)
		return sl__err(SLUICE_EFORMAT, "Megatron index version %llu, sluice reads 1",
			       (unsigned long long)sl__le64(p + 9));
	if (p[17] < 1 || p[17] > 8)
		return sl__err(SLUICE_EFORMAT, "Megatron dtype code %u unknown", p[17]);
	ix->dtype = sl_mm_dtype[p[17]];
	ix->nseq = sl__le64(p + 18);
	ix->ndoc = sl__le64(p + 26);
	/* S * 12 + D * 8 must fit; check without overflow. */
	if (ix->nseq > (len - SL_MM_HDR) / 12 || ix->ndoc > (len - SL_MM_HDR - 12 * ix->nseq) / 8)
		return sl__err(SLUICE_EFORMAT, "Megatron index of %zu bytes cannot hold %llu sequences and %llu document indices",
			       len, (unsigned long long)ix->nseq, (unsigned long long)ix->ndoc);
	ix->lengths_off = SL_MM_HDR;
	ix->pointers_off = SL_MM_HDR + 4 * ix->nseq;
	ix->docs_off = ix->pointers_off + 8 * ix->nseq;
	need = ix->docs_off + 8 * ix->ndoc;
	/* What follows may only be the optional modes array. */
	if (len != need && len != need + ix->nseq)
		return sl__err(SLUICE_EFORMAT, "Megatron index is %zu bytes, expected %llu (or %llu with modes)", len,
			       (unsigned long long)need, (unsigned long long)(need + ix->nseq));
	return 0;
}

/*
 * The whole file path into a malloc'd *out (*len bytes): a regular file
 * (a remote one's cached copy), the same size and version after the read
 * as before it (else -ESTALE naming it: a file rewritten meanwhile).
 */
static int sl_mm_read(const char *path, unsigned char **out, size_t *len)
{
	char local[4096], tag[SL_TAG_MAX] = "", before[SL_TAG_MAX], after[SL_TAG_MAX];
	struct stat st;
	unsigned char *buf = NULL;
	size_t got = 0;
	int fd, rc;

	*out = NULL;
	*len = 0;
	if ((rc = sl__fs_local(path, tag, local, sizeof(local))))
		return rc;
	if ((fd = sl__open_file(local, O_RDONLY, 0)) < 0)
		return fd;
	if (fstat(fd, &st) < 0) {
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	sl__fs_local_tag(&st, before);
	if (st.st_size == 0) {
		rc = sl__err(SLUICE_EFORMAT, "%s: empty file", path);
		goto out;
	}
	if ((uint64_t)st.st_size > SIZE_MAX || !(buf = malloc((size_t)st.st_size))) {
		rc = sl__err(-ENOMEM, "%s: %lld bytes, read whole: not enough memory", path, (long long)st.st_size);
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? sl__err(-errno, "%s: %s", path, strerror(errno))
				   : sl__err(-ESTALE, "%s: cut short while it was read (%zu of %lld bytes)", path, got,
					     (long long)st.st_size);
			goto out;
		}
		got += (size_t)r;
	}
	if (fstat(fd, &st) < 0) {
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	sl__fs_local_tag(&st, after);
	if (strcmp(before, after))
		rc = sl__err(-ESTALE, "%s: changed while it was read", path);
out:
	close(fd);
	if (rc)
		free(buf);
	else
		*out = buf, *len = got;
	return rc;
}

/* PREFIX from path: strips a trailing .idx or .bin. */
static char *sl_mm_prefix(const char *path)
{
	size_t l = strlen(path);
	char *p = strdup(path);

	if (p && l > 4 && (!strcmp(path + l - 4, ".idx") || !strcmp(path + l - 4, ".bin")))
		p[l - 4] = '\0';
	return p;
}

/* Owns path if PREFIX.idx exists: a damaged .idx then gets this reader's error. */
static int sl_mm_probe(const char *path)
{
	char *pre = sl_mm_prefix(path), *idx = NULL;
	struct stat st;
	int ok = 0;

	if (pre && asprintf(&idx, "%s.idx", pre) >= 0)
		ok = sl__fs_stat(idx, &st) == 0 && S_ISREG(st.st_mode);
	else
		idx = NULL;
	free(pre);
	free(idx);
	return ok;
}

static int sl_mm_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_mm *mm = calloc(1, sizeof(*mm));
	char *pre = sl_mm_prefix(path), *idx = NULL, **files = calloc(1, sizeof(char *));
	struct stat st;
	int rc;

	ds->priv = mm;
	if (!mm || !pre || !files || asprintf(&idx, "%s.idx", pre) < 0 || asprintf(&files[0], "%s.bin", pre) < 0) {
		rc = -ENOMEM;
		goto out;
	}
	rc = sl_mm_read(idx, &mm->map, &mm->map_len);
	if (rc)
		goto out;
	rc = sl__mmidx_parse(mm->map, mm->map_len, &mm->ix);
	if (rc) {
		rc = sl__err(rc, "%s: %s", idx, sluice_last_error_detail());
		goto out;
	}
	if ((rc = sl__fs_stat(files[0], &st))) /* the store's error names it */
		goto out;
	rc = sl__ds_files(ds, files, 1);
	files = NULL;
	/* The .bin pinned to its version now, beside the index just read: no record CRC would catch a new one. */
	if (!rc)
		rc = sl__fs_version(ds->files[0], ds->tags[0]);
	if (rc)
		goto out;
	ds->file_bytes[0] = (uint64_t)st.st_size;
	ds->nrecords = mm->ix.nseq;
	ds->nfields = 1;
	snprintf(ds->names[0], sizeof(ds->names[0]), "tokens");
	ds->fields[0] = (struct sluice_field){ ds->names[0], mm->ix.dtype, 1, { -1 } };
	ds->has_crc = 0;
out:
	if (files) {
		free(files[0]);
		free(files);
	}
	free(pre);
	free(idx);
	return rc;
}

static void sl_mm_close(struct sluice_dataset *ds)
{
	struct sl_mm *mm = ds->priv;

	if (!mm)
		return;
	free(mm->map);
	free(mm);
}

static void sl_mm_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_mm *mm = ds->priv;
	int32_t n = (int32_t)sl__le32(mm->map + mm->ix.lengths_off + 4 * i);
	uint64_t bytes = n < 0 ? UINT64_MAX : (uint64_t)n * sluice_dtype_size(mm->ix.dtype);

	loc->shard = 0;
	loc->offset = sl__le64(mm->map + mm->ix.pointers_off + 8 * i);
	/* A negative or huge length cannot fit: the bounds check rejects it. */
	loc->length = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
	loc->crc = 0;
}

static int sl_mm_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			struct sluice_record *rec)
{
	(void)i;
	if (len % sluice_dtype_size(ds->fields[0].dtype))
		return sl__err(SLUICE_EFORMAT, "sequence of %zu bytes is not whole %s elements", len,
			       sluice_dtype_name(ds->fields[0].dtype));
	if (rec) {
		rec->data[0] = p;
		rec->len[0] = len;
	}
	return 0;
}

/* Document indices: from 0, rising, ending at the sequence count. */
static int64_t sl_mm_check(struct sluice_dataset *ds, void (*bad)(const struct sluice_bad *, void *), void *user)
{
	const struct sl_mm *mm = ds->priv;
	uint64_t prev = 0;
	int64_t problems = 0;

	for (uint64_t d = 0; d < mm->ix.ndoc; d++) {
		uint64_t v = sl__le64(mm->map + mm->ix.docs_off + 8 * d);

		if ((d == 0 && v != 0) || v < prev || v > mm->ix.nseq || (d + 1 == mm->ix.ndoc && v != mm->ix.nseq)) {
			struct sluice_bad b = { UINT64_MAX, 0, mm->ix.docs_off + 8 * d, SLUICE_EFORMAT,
						"document index out of order or range" };

			if (bad)
				bad(&b, user);
			problems++;
		}
		prev = v;
	}
	return problems;
}

const struct sl__ds_ops sl__ds_megatron_ops = {
	.name = "megatron",
	.probe = sl_mm_probe,
	.open = sl_mm_open,
	.close = sl_mm_close,
	.locate = sl_mm_locate,
	.decode = sl_mm_decode,
	.check = sl_mm_check,
};
