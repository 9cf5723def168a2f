/*
 * Reader of WebDataset tar shards, in place, reading what webdataset's own
 * reader reads.  A sample is the run of consecutive members whose names
 * share a key (the path up to the first dot of the last component); the
 * rest of the name, lowercased, is the field ("jpg", "cls", "seg.png"), and
 * the key itself is the field "__key__" (bytes), last, as webdataset gives
 * it (a member whose field would be named so is refused, as webdataset does).
 * Members webdataset skips are skipped and counted: links and other
 * non-regular members, names it cannot split into key.field (no dot in the
 * last component, a top-level dotfile), and metadata ("__index__", and
 * "__meta__" with what is below it).  A sparse member (tar --sparse) is
 * refused: its bytes are not stored in place.  A "pipe:CMD" shard spec
 * (webdataset's gopen runs CMD in a shell) is refused by name, never run
 * nor opened as a file of that name.
 *
 * Tar parsing is libarchive's; sluice keeps, per tar, a sidecar index
 * (NAME.tar.sluice-idx) built once and rebuilt when the tar changes (its
 * stamp: size, mtime, ctime, inode and a fingerprint of its ends):
 *
 *   char magic[8] "SLUICEWD"; u32 version 3; u32 nkeys K; u64 tar size;
 *   u64 tar mtime (ns); u64 nsamples N; u64 tar ctime (ns); u64 inode;
 *   u32 fingerprint; u32 members skipped; u32 CRC of bytes 72..end;
 *   u32 CRC of bytes 0..67;
 *   K x { u16 length, name bytes } padded to 8;
 *   N x { u64 span offset; u32 span length; u32 key offset; u32 key length;
 *         K x { u32 offset in span; u32 length } };
 *   the samples' keys back to back (each at its key offset from here)
 *
 * A field a sample lacks has offset 0xFFFFFFFF.  The span runs from the
 * first member's data to the last member's data end, so one read brings
 * the whole sample.  Older sidecars (version 1: no ctime, inode or
 * fingerprint; 2: no keys) are rebuilt.
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"

#define SL_WDS_MAGIC "SLUICEWD"
#define SL_WDS_HEADER 72
#define SL_WDS_SUFFIX ".sluice-idx"
#define SL_WDS_ABSENT 0xFFFFFFFFu
#define SL_WDS_VERSION 3
#define SL_WDS_ENTRY 20 /* bytes of an entry before its K field pairs */
#define SL_WDS_KEY "__key__"

/* One tar's parsed sidecar. */
struct sl_wds_tar {
	unsigned char *idx;  /* whole sidecar (malloc'd) */
	size_t idx_len;
	unsigned nkeys;
	char **keys;         /* field names, pointing into key storage */
	unsigned *field_of;  /* tar key k -> dataset field */
	uint64_t nsamples, first;
	size_t entries_off, stride;
	size_t keys_off;     /* the samples' keys, to the end of idx */
};

struct sl_wds {
	struct sl_wds_tar *tars;
	unsigned ntars;
	unsigned key_field;  /* the dataset's field "__key__" (the last) */
};

static size_t sl_pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

/* ---- building an index from a tar (any libarchive reader) ---- */

/*
 * What a scan collects: 24 bytes per sample and 12 per member, laid out
 * into sidecar entries only at the end, once every field name is known.
 */
struct sl_wds_sample {
	uint64_t span_off;
	uint32_t span_len;
	uint32_t first;   /* index of its first member */
	uint32_t n;       /* members */
	uint32_t key_off; /* its key in the build's keys text */
	uint32_t key_len;
};

struct sl_wds_member {
	uint32_t key;     /* index into keys */
	uint32_t off;     /* in the sample's span */
	uint32_t len;
};

struct sl_wds_build {
	char *keys[SLUICE_MAX_FIELDS];
	unsigned nkeys;
	struct sl_wds_sample *samples;
	size_t nsamples, samples_cap;
	struct sl_wds_member *members;
	size_t nmembers, members_cap;
	char *text;       /* every sample's key, back to back */
	size_t text_len, text_cap;
	char cur[4096];   /* key of the open sample */
	uint64_t seen;    /* fields the open sample has, by key index */
	int open;
};

/* Grows an array of elements of size sz to hold n + 1. */
static int sl_grow(void **v, size_t *cap, size_t n, size_t sz)
{
	if (n < *cap)
		return 0;
	size_t c = *cap ? 2 * *cap : 1024;
	void *nv = realloc(*v, c * sz);

	if (!nv)
		return -ENOMEM;
	*v = nv;
	*cap = c;
	return 0;
}

/*
 * Splits a member's name as webdataset does (its base_plus_ext: the regex
XX the key's length and the field, or
 * 0 where it cannot (the member is skipped).  The key runs to the first dot
 * of the last component; a dotfile ("d/.x") takes the directory before it
 * as its key ("d/") where that holds no dot.
 */
static int sl_wds_split(const char *path, size_t *keylen, const char **field)
{
	const char *slash = strrchr(path, '/'), *last = slash ? slash + 1 : path, *dot = strchr(last, '.');
	const char *from;

	if (!dot)
		return 0; /* the field would hold a '/' */
	if (dot == last) {
		if (!slash)
			return 0; /* a top-level dotfile: no key */
		for (from = slash; from > path && from[-1] != '/'; from--)
			;
		if (memchr(from, '.', (size_t)(dot - from)))
			return 0;
	}
	if (!dot[1])
		return 0; /* an empty field: no name for it */
	*keylen = (size_t)(dot - path);
	*field = dot + 1;
	return 1;
}

/* webdataset's skip_meta, __[^/]*__($|/): metadata members such as "__index__" or "__meta__/x". */
static int sl_wds_meta(const char *path)
{
	size_t l = strcspn(path, "/");

	return l >= 4 && !strncmp(path, "__", 2) && !strncmp(path + l - 2, "__", 2);
}

/*
 * One member (path, msize bytes at data; its field's name at dot) into b:
 * a new sample when its key changes, its field (lowercased, as webdataset's group_by_keys does: a.JPG
 * and b.jpg share one) added to the key table on first sight.
 */
static int sl_wds_add(struct sl_wds_build *b, const char *name, const char *path, size_t keylen, const char *dot,
		      uint64_t data, uint64_t msize)
{
	struct sl_wds_sample *sm;
	char field[256];
	unsigned k;
	int rc;

	for (k = 0; dot[k]; k++)
		field[k] = (char)((dot[k] >= 'A' && dot[k] <= 'Z') ? dot[k] - 'A' + 'a' : dot[k]);
	field[k] = 0;
	if (!strcmp(field, SL_WDS_KEY))
		return sl__err(SLUICE_EFORMAT, "%s: member '%s': its field would be named %s, the name of the sample's key "
			       "(webdataset refuses it too)", name, path, SL_WDS_KEY);
	if (!b->open || strncmp(b->cur, path, keylen) || b->cur[keylen]) {
		if (b->nsamples >= UINT32_MAX || b->text_len + keylen > UINT32_MAX ||
		    (rc = sl_grow((void **)&b->samples, &b->samples_cap, b->nsamples, sizeof(*b->samples))))
			return b->nsamples >= UINT32_MAX || b->text_len + keylen > UINT32_MAX ?
				       sl__err(SLUICE_EFORMAT, "%s: too many samples", name) : rc;
		if (b->text_len + keylen > b->text_cap && sl__reserve(&b->text, &b->text_cap, 2 * (b->text_len + keylen)))
			return -ENOMEM;
		memcpy(b->cur, path, keylen);
		b->cur[keylen] = '\0';
		b->open = 1;
		b->seen = 0;
		b->samples[b->nsamples++] = (struct sl_wds_sample){ data, 0, (uint32_t)b->nmembers, 0,
								    (uint32_t)b->text_len, (uint32_t)keylen };
		memcpy(b->text + b->text_len, path, keylen);
		b->text_len += keylen;
	}
	sm = &b->samples[b->nsamples - 1];
	for (k = 0; k < b->nkeys && strcmp(b->keys[k], field); k++)
		;
	if (k == b->nkeys && b->nkeys == SLUICE_MAX_FIELDS - 1) /* and __key__ */
		return sl__err(SLUICE_EFORMAT, "%s: more than %d distinct fields", name, SLUICE_MAX_FIELDS - 1);
	if (k == b->nkeys && !(b->keys[b->nkeys++] = strdup(field)))
		return -ENOMEM;
	if (b->seen & (1ull << k))
		return sl__err(SLUICE_EFORMAT, "%s: sample '%s' has field '%s' twice", name, b->cur, field);
	if (data + msize - sm->span_off > UINT32_MAX)
		return sl__err(SLUICE_EFORMAT, "%s: sample '%s' spans more than 4 GiB", name, b->cur);
	if (b->nmembers >= UINT32_MAX || (rc = sl_grow((void **)&b->members, &b->members_cap, b->nmembers, sizeof(*b->members))))
		return b->nmembers >= UINT32_MAX ? sl__err(SLUICE_EFORMAT, "%s: too many members", name) : rc;
	b->members[b->nmembers++] = (struct sl_wds_member){ k, (uint32_t)(data - sm->span_off), (uint32_t)msize };
	b->seen |= 1ull << k;
	sm->n++;
	sm->span_len = (uint32_t)(data + msize - sm->span_off);
	return 0;
}

/* The sidecar image of b: header, key table, then entries compacted to nkeys fields, each part CRC'd. */
static int sl_wds_image(const struct sl_wds_build *b, const struct sl__wds_stamp *stamp, uint32_t skipped,
			unsigned char **out, size_t *out_len)
{
	size_t keys = 0, stride = SL_WDS_ENTRY + 8 * (size_t)b->nkeys, off, end;
	unsigned char *img, *q;

	for (unsigned k = 0; k < b->nkeys; k++)
		keys += 2 + strlen(b->keys[k]);
	off = SL_WDS_HEADER + sl_pad8(keys);
	end = off + stride * b->nsamples + b->text_len;
	if (!(img = calloc(1, end + 1)))
		return -ENOMEM;
	q = img + SL_WDS_HEADER;
	memcpy(img, SL_WDS_MAGIC, 8);
	sl__put32(img + 8, SL_WDS_VERSION);
	sl__put32(img + 12, b->nkeys);
	sl__put64(img + 16, stamp->size);
	sl__put64(img + 24, stamp->mtime_ns);
	sl__put64(img + 32, b->nsamples);
	sl__put64(img + 40, stamp->ctime_ns);
	sl__put64(img + 48, stamp->ino);
	sl__put32(img + 56, stamp->fingerprint);
	sl__put32(img + 60, skipped);
	for (unsigned k = 0; k < b->nkeys; k++) {
		size_t l = strlen(b->keys[k]);

		q[0] = (unsigned char)l;
		q[1] = (unsigned char)(l >> 8);
		memcpy(q + 2, b->keys[k], l);
		q += 2 + l;
	}
	for (size_t i = 0; i < b->nsamples; i++) {
		unsigned char *e = img + off + i * stride;

		sl__put64(e, b->samples[i].span_off);
		sl__put32(e + 8, b->samples[i].span_len);
		sl__put32(e + 12, b->samples[i].key_off);
		sl__put32(e + 16, b->samples[i].key_len);
		for (unsigned k = 0; k < b->nkeys; k++)
			sl__put32(e + SL_WDS_ENTRY + 8 * k, SL_WDS_ABSENT);
		for (uint32_t m = b->samples[i].first; m < b->samples[i].first + b->samples[i].n; m++) {
			sl__put32(e + SL_WDS_ENTRY + 8 * b->members[m].key, b->members[m].off);
			sl__put32(e + SL_WDS_ENTRY + 4 + 8 * b->members[m].key, b->members[m].len);
		}
	}
	if (b->text_len)
		memcpy(img + off + stride * b->nsamples, b->text, b->text_len);
	sl__put32(img + 64, sluice_crc32c(0, img + SL_WDS_HEADER, end - SL_WDS_HEADER));
	sl__put32(img + 68, sluice_crc32c(0, img, 68));
	*out = img;
	*out_len = end;
	return 0;
}

/*
 * Reads every member of an opened archive into a sidecar image.  name is
 * the tar's path, for messages; the stamp goes into the header.
 */
static int sl_wds_scan(struct archive *a, const char *name, const struct sl__wds_stamp *stamp,
		       unsigned char **out, size_t *out_len)
{
	const uint64_t size = stamp->size;
	struct sl_wds_build b;
	struct archive_entry *ent;
	uint32_t skipped = 0;
	int rc = 0, r;

	memset(&b, 0, sizeof(b));
	while (!rc && (r = archive_read_next_header(a, &ent)) == ARCHIVE_OK) {
		const char *path = archive_entry_pathname(ent), *dot;
		int64_t msize = archive_entry_size(ent);
		uint64_t data = (uint64_t)archive_filter_bytes(a, -1);
		size_t keylen;

		if (!path || archive_entry_filetype(ent) == AE_IFDIR)
			continue;
		/* What webdataset skips: links and devices, names it cannot split, metadata. */
		if (archive_entry_filetype(ent) != AE_IFREG || archive_entry_hardlink(ent) ||
		    !sl_wds_split(path, &keylen, &dot) || sl_wds_meta(path))
			skipped++;
		else if (archive_entry_sparse_count(ent) > 0)
			rc = sl__err(SLUICE_EFORMAT, "%s: member '%s' is a sparse file (tar --sparse), whose bytes are not "
				     "stored in place; write the tar without --sparse", name, path);
		else if (msize < 0 || (uint64_t)msize > size || data > size - (uint64_t)msize || msize > UINT32_MAX)
			rc = sl__err(SLUICE_EFORMAT, "%s: member '%s' claims %lld bytes at offset %llu, past the end (%llu)",
				     name, path, (long long)msize, (unsigned long long)data, (unsigned long long)size);
		else if (keylen >= sizeof(b.cur) || strlen(dot) > 255)
			rc = sl__err(SLUICE_EFORMAT, "%s: member '%s': name too long", name, path);
		else
			rc = sl_wds_add(&b, name, path, keylen, dot, data, (uint64_t)msize);
	}
	if (!rc && r != ARCHIVE_EOF)
		rc = sl__err(SLUICE_EFORMAT, "%s: %s", name, archive_error_string(a) ? archive_error_string(a) : "unreadable tar");
	if (!rc)
		rc = sl_wds_image(&b, stamp, skipped, out, out_len);
	for (unsigned k = 0; k < b.nkeys; k++)
		free(b.keys[k]);
	free(b.samples);
	free(b.members);
	free(b.text);
	return rc;
}

int sl__wds_scan_mem(const void *p, size_t len, unsigned char **out, size_t *out_len)
{
	struct archive *a = archive_read_new();
	int rc;

	if (!a)
		return -ENOMEM;
	archive_read_support_format_tar(a);
	if (archive_read_open_memory(a, p, len) != ARCHIVE_OK)
		rc = sl__err(SLUICE_EFORMAT, "(memory): %s", archive_error_string(a));
	else
		rc = sl_wds_scan(a, "(memory)", &(struct sl__wds_stamp){ .size = len }, out, out_len);
	archive_read_free(a);
	return rc;
}

/* ---- sidecar parsing (bytes from disk: checked like any outside input) ---- */

int sl__wds_parse(const unsigned char *p, size_t len, const struct sl__wds_stamp *want, unsigned *nkeys,
		  char keys[][256], uint64_t *nsamples, size_t *entries_off, uint32_t *skipped)
{
	const unsigned char *q, *end = p + len;
	size_t stride;

	if (len >= 12 && !memcmp(p, SL_WDS_MAGIC, 8) && sl__le32(p + 8) >= 1 && sl__le32(p + 8) < SL_WDS_VERSION)
		return 1; /* an older version's (not keyed on enough, no samples' keys): rebuilt */
	if (len < SL_WDS_HEADER || memcmp(p, SL_WDS_MAGIC, 8) || sl__le32(p + 8) != SL_WDS_VERSION)
		return sl__err(SLUICE_EFORMAT, "not a sluice WebDataset index");
	if (SL_CRC_BAD(sl__le32(p + 68), sluice_crc32c(0, p, 68)))
		return sl__err(SLUICE_EFORMAT, "index header CRC mismatch");
	if (sl__le64(p + 16) != want->size || sl__le64(p + 24) != want->mtime_ns || sl__le64(p + 40) != want->ctime_ns ||
	    sl__le64(p + 48) != want->ino || sl__le32(p + 56) != want->fingerprint)
		return 1; /* stale: the tar changed since */
	if (SL_CRC_BAD(sl__le32(p + 64), sluice_crc32c(0, p + SL_WDS_HEADER, len - SL_WDS_HEADER)))
		return sl__err(SLUICE_EFORMAT, "index CRC mismatch");
	*nkeys = sl__le32(p + 12);
	*nsamples = sl__le64(p + 32);
	*skipped = sl__le32(p + 60);
	if (*nkeys > SLUICE_MAX_FIELDS)
		return sl__err(SLUICE_EFORMAT, "index declares %u fields", *nkeys);
	q = p + SL_WDS_HEADER;
	for (unsigned k = 0; k < *nkeys; k++) {
		size_t l;

		if (end - q < 2)
			return sl__err(SLUICE_EFORMAT, "index key table truncated");
		l = q[0] | (size_t)q[1] << 8;
		if (l < 1 || l > 255 || (size_t)(end - q - 2) < l)
			return sl__err(SLUICE_EFORMAT, "index key %u malformed", k);
		memcpy(keys[k], q + 2, l);
		keys[k][l] = '\0';
		if (strlen(keys[k]) != l || strchr(keys[k], '/'))
			return sl__err(SLUICE_EFORMAT, "index key %u malformed", k);
		q += 2 + l;
	}
	*entries_off = SL_WDS_HEADER + sl_pad8((size_t)(q - p - SL_WDS_HEADER));
	stride = SL_WDS_ENTRY + 8 * (size_t)*nkeys;
	/* The entries, then the keys' text to the end (each key checked where it is used). */
	if (*entries_off > len || *nsamples > (len - *entries_off) / stride)
		return sl__err(SLUICE_EFORMAT, "index size does not match %llu samples", (unsigned long long)*nsamples);
	return 0;
}

/* ---- shard lists: webdataset's brace patterns ---- */

struct sl_brace {
	char **v;
	size_t cap;
	unsigned n, max;
	int rc;
};

/* The '}' that closes the '{' at p[i], or 0. */
static size_t sl_brace_end(const char *p, size_t i)
{
	int depth = 0;

	for (; p[i]; i++)
		if (p[i] == '{')
			depth++;
		else if (p[i] == '}' && !--depth)
			return i;
	return 0;
}

/* A bound of a range: an integer (digits, an optional '-', at most 18 digits) or one character. */
static int sl_brace_bound(const char *p, size_t len, long long *v, int *num, int *width)
{
	size_t k = len && p[0] == '-';

	*width = (int)len;
	if (len > k && len - k <= 18 && strspn(p + k, "0123456789") == len - k) {
		*num = 1;
		*v = strtoll(p, NULL, 10);
		return 0;
	}
	*num = 0;
	*v = (unsigned char)p[0];
	return len == 1 ? 0 : -1;
}

/* inner (len bytes) as a range A..B or A..B..STEP: 0 and its parts, or -1. */
static int sl_brace_range(const char *in, size_t len, long long *a, long long *z, long long *step, int *num, int *width)
{
	const char *d1 = memmem(in, len, "..", 2), *d2;
	int na, nz, wa, wz, ns, ws;

	if (!d1)
		return -1;
	d2 = memmem(d1 + 2, len - (size_t)(d1 + 2 - in), "..", 2);
	*step = 1;
	if (sl_brace_bound(in, (size_t)(d1 - in), a, &na, &wa) ||
	    sl_brace_bound(d1 + 2, (size_t)((d2 ? d2 : in + len) - d1 - 2), z, &nz, &wz) || na != nz ||
	    (d2 && (sl_brace_bound(d2 + 2, (size_t)(in + len - d2 - 2), step, &ns, &ws) || !ns)))
		return -1;
	*step = *step < 0 ? -*step : *step ? *step : 1;
	*num = na;
	/* Zero-padded to the wider bound when either is written with a leading zero, as braceexpand pads. */
	*width = na && ((wa > 1 && in[in[0] == '-'] == '0') || (wz > 1 && d1[2 + (d1[2] == '-')] == '0'))
			 ? (wa > wz ? wa : wz) : 0;
	return 0;
}

static void sl_brace_walk(struct sl_brace *b, const char *s);

/* prefix (plen bytes) + item (ilen) + suffix, expanded further. */
static void sl_brace_join(struct sl_brace *b, const char *prefix, size_t plen, const char *item, size_t ilen,
			  const char *suffix)
{
	char *t;

	if (asprintf(&t, "%.*s%.*s%s", (int)plen, prefix, (int)ilen, item, suffix) < 0) {
		b->rc = -ENOMEM;
		return;
	}
	sl_brace_walk(b, t);
	free(t);
}

/* s with its first brace expanded (and the rest, recursively); plain text is one name. */
static void sl_brace_walk(struct sl_brace *b, const char *s)
{
	for (size_t i = 0; s[i] && !b->rc; i++) {
		size_t e = s[i] == '{' ? sl_brace_end(s, i) : 0, from = i + 1, depth = 0, alts = 0;
		long long a, z, step;
		int num, width;

		if (!e)
			continue;
		/* Alternatives: the top-level commas split them. */
		for (size_t k = i + 1; k <= e && !b->rc; k++) {
			depth += s[k] == '{';
			depth -= s[k] == '}' && k < e;
			if ((s[k] == ',' && !depth) || (k == e && alts)) {
				sl_brace_join(b, s, i, s + from, k - from, s + e + 1);
				from = k + 1;
				alts++;
			}
		}
		if (alts)
			return;
		if (sl_brace_range(s + i + 1, e - i - 1, &a, &z, &step, &num, &width))
			continue; /* text, as "{a}" is */
		for (long long v = a; !b->rc && (a <= z ? v <= z : v >= z); v += a <= z ? step : -step) {
			char item[32];
			int l = num ? snprintf(item, sizeof(item), "%0*lld", width, v) : snprintf(item, sizeof(item), "%c", (int)v);

			sl_brace_join(b, s, i, item, (size_t)l, s + e + 1);
		}
		return;
	}
	if (b->rc)
		return;
	if (b->n == b->max) {
		b->rc = SLUICE_EINVAL_CONFIG;
		return;
	}
	if (sl_grow((void **)&b->v, &b->cap, b->n, sizeof(char *)) ||
	    !(b->v[b->n] = strdup(s))) {
		b->rc = -ENOMEM;
		return;
	}
	b->n++;
}

int sl__brace_expand(const char *pat, unsigned max, char ***out, unsigned *n)
{
	struct sl_brace b = { .max = max };

	sl_brace_walk(&b, pat);
	if (b.rc) {
		for (unsigned i = 0; i < b.n; i++)
			free(b.v[i]);
		free(b.v);
		return b.rc == SLUICE_EINVAL_CONFIG ? sl__err(b.rc, "%s: names more than %u shards", pat, max) : b.rc;
	}
	*out = b.v;
	*n = b.n;
	return 0;
}

/* ---- the reader ---- */

/* A compressed tar, by its name: webdataset reads them, sluice (which reads tars in place) refuses them by name. */
static int sl_is_ztar(const char *n)
{
	static const char *const z[] = { ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.lz4" };

	for (size_t i = 0; i < sizeof(z) / sizeof(z[0]); i++)
		if (sl__ends_with(n, z[i]))
			return 1;
	return 0;
}

static int sl_is_tar(const char *n)
{
	return sl__ends_with(n, ".tar") || sl_is_ztar(n);
}

static void sl_free_names(char **v, unsigned n)
{
	for (unsigned i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

/*
 * The tars path names: itself (a file), those in it (a directory, in name
 * order), or its brace pattern's names when no such file exists (as
 * webdataset takes "train-{000000..000004}.tar").  0, -ENOENT if none.
 */
static int sl_wds_names(const char *path, char ***names, unsigned *n)
{
	struct stat st;
	unsigned k = 0;
	int rc;

	*names = NULL;
	*n = 0;
	if (sl__fs_stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
		if (!sl_is_tar(path)) /* another format's file: its reader says what it is */
			return -ENOENT;
		if (!(*names = malloc(sizeof(char *))) || !((*names)[0] = strdup(path)))
			return -ENOMEM;
		*n = 1;
		return 0;
	}
	if (sl__fs_stat(path, &st) < 0 && strchr(path, '{'))
		rc = sl__brace_expand(path, SL_MAX_SHARDS, names, n);
	else
		rc = sl__fs_list(path, 0, names, n);
	if (rc)
		return rc;
	for (unsigned i = 0; i < *n; i++)
		if (sl_is_tar((*names)[i]))
			(*names)[k++] = (*names)[i];
		else
			free((*names)[i]);
	*n = k;
	return k ? 0 : -ENOENT;
}

/* The length of the first word of s, at most 64 bytes (a command's program, in a message). */
static int sl_word_len(const char *s)
{
	size_t n = strcspn(s, " \t\n");

	return n > 64 ? 64 : (int)n;
}

/* webdataset's "pipe:CMD" shard spec: a shell command its gopen runs (shell=True), never a file to open. */
static int sl_is_pipe(const char *path)
{
	return !strncmp(path, "pipe:", 5);
}

static int sl_wds_probe(const char *path)
{
	char **names;
	unsigned n;
	int rc;

	if (sl_is_pipe(path)) /* this reader's to refuse, by name */
		return 1;
	rc = sl_wds_names(path, &names, &n);

	sl_free_names(names, n);
	return !rc || rc == SLUICE_EINVAL_CONFIG; /* a pattern of too many names: this reader's error */
}

/* The tar's stamp (format.h): what its sidecar must have been built from. */
static int sl_wds_stamp(const char *tar, struct sl__wds_stamp *s)
{
	unsigned char head[4096], tail[4096];
	struct stat st;
	ssize_t h = 0, t = 0;
	int fd = sl__open_file(tar, O_RDONLY, 0), rc = 0;

	if (fd < 0) {
		rc = fd;
	} else if (fstat(fd, &st) < 0) {
		rc = sl__err(-errno, "%s: %s", tar, strerror(errno));
	} else {
		s->size = (uint64_t)st.st_size;
		s->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
		s->ctime_ns = (uint64_t)st.st_ctim.tv_sec * 1000000000ull + (uint64_t)st.st_ctim.tv_nsec;
		s->ino = (uint64_t)st.st_ino;
		h = pread(fd, head, sizeof(head), 0);
		t = st.st_size > (off_t)sizeof(head) ? pread(fd, tail, sizeof(tail), st.st_size - (off_t)sizeof(tail)) : 0;
		if (h < 0 || t < 0)
			rc = sl__err(-errno, "%s: %s", tar, strerror(errno));
		else
			s->fingerprint = sluice_crc32c(sluice_crc32c(0, head, (size_t)h), tail, (size_t)t);
	}
	if (fd >= 0)
		close(fd);
	return rc;
}

/*
 * The codec a file's first bytes say it is compressed with (those
 * libarchive takes), or NULL.  Whole magics only, so that no tar whose
 * first member's name starts alike is taken for one (bzip2's "BZh" is
 * followed by its level and its first block's magic).
 */
static const char *sl_wds_compressed(const char *tar)
{
	static const struct {
		const char *magic, *name;
		size_t n;
	} z[] = {
		{ "\x1f\x8b", "gzip", 2 },
		{ "\xfd" "7zXZ\0", "xz", 6 },
		{ "\x28\xb5\x2f\xfd", "zstd", 4 },
		{ "\x04\x22\x4d\x18", "lz4", 4 },
		{ "\x02\x21\x4c\x18", "lz4", 4 },
		{ "\x1f\x9d", "compress", 2 },
		{ "LZIP\x01", "lzip", 5 },
		{ "LRZI\0", "lrzip", 5 },
		{ "\x89LZO\0\r\n\x1a\n", "lzop", 9 },
		{ "GRZipII\0\x02\x04:)", "grzip", 12 },
	};
	unsigned char head[16] = { 0 };
	int fd = sl__open_file(tar, O_RDONLY, 0);
	ssize_t got = fd >= 0 ? pread(fd, head, sizeof(head), 0) : -1;

	if (fd >= 0)
		close(fd);
	sl__err_clear();
	for (size_t i = 0; i < sizeof(z) / sizeof(z[0]); i++)
		if (got >= (ssize_t)z[i].n && !memcmp(head, z[i].magic, z[i].n))
			return z[i].name;
	if (got >= 10 && !memcmp(head, "BZh", 3) && head[3] >= '1' && head[3] <= '9' &&
	    !memcmp(head + 4, "\x31\x41\x59\x26\x53\x59", 6))
		return "bzip2";
	return NULL;
}

/* Loads (or builds and caches) the sidecar of tar. */
static int sl_wds_load(const char *tar, struct sl_wds_tar *t, char keys[][256])
{
	struct sl__wds_stamp st;
	char *side = NULL;
	uint32_t skipped = 0;
	int rc, fd;

	if ((rc = sl_wds_stamp(tar, &st)))
		return rc;
	if (asprintf(&side, "%s%s", tar, SL_WDS_SUFFIX) < 0)
		return -ENOMEM;
	fd = sl__open_file(side, O_RDONLY, 0); /* absent or not a regular file: made again */
	sl__err_clear();
	if (fd >= 0) {
		struct stat ss;

		if (fstat(fd, &ss) == 0 && (t->idx = malloc((size_t)ss.st_size + 1)) &&
		    pread(fd, t->idx, (size_t)ss.st_size, 0) == ss.st_size) {
			t->idx_len = (size_t)ss.st_size;
			rc = sl__wds_parse(t->idx, t->idx_len, &st, &t->nkeys, keys, &t->nsamples, &t->entries_off,
					   &skipped);
			if (rc == 0) {
				close(fd);
				free(side);
				return 0;
			}
			if (rc < 0)
				sl__warn("format", "%s: %s; rebuilding it", side, sluice_last_error_detail());
		}
		close(fd);
		free(t->idx);
		t->idx = NULL;
	}
	/* Build from the tar, then cache it (atomically) if the directory allows. */
	{
		struct archive *a = archive_read_new();
		const char *z = sl_wds_compressed(tar);

		/*
		 * Tar alone, no filter: libarchive runs an outside program for the
		 * codecs it has no decoder of (lrzip, grzip, lzop), and a compressed
		 * member's bytes are not in place anyway.  Compression is told by
		 * its magic, to be refused by name.
		 */
		archive_read_support_format_tar(a);
		if (z)
			rc = sl__err(SLUICE_EFORMAT, "%s: a compressed tar (%s) under a .tar name; sluice reads a tar's "
				     "samples in place: decompress it first", tar, z);
		else if (archive_read_open_filename(a, tar, 1 << 20) != ARCHIVE_OK)
			rc = sl__err(SLUICE_EFORMAT, "%s: %s", tar, archive_error_string(a));
		else
			rc = sl_wds_scan(a, tar, &st, &t->idx, &t->idx_len);
		archive_read_free(a);
	}
	if (!rc)
		rc = sl__wds_parse(t->idx, t->idx_len, &st, &t->nkeys, keys, &t->nsamples, &t->entries_off, &skipped);
	if (!rc && skipped)
		sl__warn("format", "%s: %u members skipped, as webdataset skips them (links, names without a key.field "
			 "form, __metadata__)", tar, skipped);
	if (!rc) {
		char *tmp = NULL;

		if (asprintf(&tmp, "%s.tmp%d", side, (int)getpid()) >= 0) {
			fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
			if (fd >= 0 && write(fd, t->idx, t->idx_len) == (ssize_t)t->idx_len && rename(tmp, side) == 0)
				sl__debug("format", "%s: sidecar index written", side);
			else
				sl__info("format", "%s: cannot cache the sidecar index (%s); built in memory", side,
					 strerror(errno));
			if (fd >= 0)
				close(fd);
			unlink(tmp);
		}
		free(tmp);
	}
	free(side);
	return rc;
}

static void sl_wds_close(struct sluice_dataset *ds)
{
	struct sl_wds *w = ds->priv;

	if (!w)
		return;
	for (unsigned t = 0; w->tars && t < w->ntars; t++) {
		free(w->tars[t].idx);
		free(w->tars[t].field_of);
	}
	free(w->tars);
	free(w);
}

/* The dataset's fields: the union of every tar's keys, in order of appearance; tt's keys mapped to them. */
static int sl_wds_add_fields(struct sluice_dataset *ds, struct sl_wds_tar *tt, char keys[][256], const char *path)
{
	for (unsigned k = 0; k < tt->nkeys; k++) {
		unsigned f;

		for (f = 0; f < ds->nfields && strcmp(ds->names[f], keys[k]); f++)
			;
		if (f == ds->nfields) {
			if (f == SLUICE_MAX_FIELDS - 1)
				return sl__err(SLUICE_EFORMAT, "%s: more than %d distinct fields", path,
					       SLUICE_MAX_FIELDS - 1);
			memcpy(ds->names[f], keys[k], sizeof(ds->names[f]));
			ds->fields[f] = (struct sluice_field){ ds->names[f], SLUICE_DTYPE_BYTES, 0, { 0 } };
			ds->nfields++;
		}
		tt->field_of[k] = f;
	}
	return 0;
}

static int sl_wds_open(struct sluice_dataset *ds, const char *path)
{
	struct sl_wds *w = calloc(1, sizeof(*w));
	char **names = NULL;
	unsigned n = 0;
	struct stat st;
	int rc = 0;

	ds->priv = w;
	if (!w)
		return -ENOMEM;
	/*
	 * Refused before anything reads it: the command (and whatever it holds,
	 * a token in a curl header) is not echoed, only its program's name.
	 */
	if (sl_is_pipe(path))
		return sl__err(SLUICE_EINVAL_CONFIG, "a webdataset \"pipe:%.*s ...\" shard spec runs a shell command, which "
			       "sluice never does: name the shards' files or URLs instead (\"pipe:curl -s URL\" is URL; "
			       "s3:// and http(s):// are read directly)", sl_word_len(path + 5), path + 5);
	if ((rc = sl_wds_names(path, &names, &n)))
		return rc == -ENOENT ? sl__err(rc, "%s: no .tar shards", path) : rc;
	for (unsigned i = 0; i < n; i++)
		if (sl_is_ztar(names[i])) {
			rc = sl__err(SLUICE_EFORMAT, "%s: a compressed tar; sluice reads a tar's samples in place, so it "
				     "cannot read inside a compressed one: decompress it into a .tar first (gzip -dk, "
				     "zstd -d or xz -dk, as its suffix says)", names[i]);
			sl_free_names(names, n);
			return rc;
		}
	rc = sl__ds_files(ds, names, n);
	w->tars = calloc(n, sizeof(*w->tars));
	if (!rc && !w->tars)
		rc = -ENOMEM;
	w->ntars = n;
	for (unsigned t = 0; !rc && t < n; t++) {
		struct sl_wds_tar *tt = &w->tars[t];
		char keys[SLUICE_MAX_FIELDS][256];

		char local[4096];

		/* A tar over s3:// is scanned in its cached copy, its sidecar kept beside that. */
		rc = sl__ds_path(ds, t, local, sizeof(local));
		if (!rc)
			rc = sl_wds_load(local, tt, keys);
		if (rc)
			break;
		if (stat(local, &st) == 0)
			ds->file_bytes[t] = (uint64_t)st.st_size;
		tt->stride = SL_WDS_ENTRY + 8 * (size_t)tt->nkeys;
		tt->keys_off = tt->entries_off + tt->stride * tt->nsamples;
		tt->first = ds->nrecords;
		ds->nrecords += tt->nsamples;
		tt->field_of = calloc(tt->nkeys ? tt->nkeys : 1, sizeof(unsigned));
		if (!tt->field_of) {
			rc = -ENOMEM;
			break;
		}
		rc = sl_wds_add_fields(ds, tt, keys, path);
	}
	/* And last, every sample's key, as webdataset's __key__. */
	if (!rc) {
		w->key_field = ds->nfields++;
		snprintf(ds->names[w->key_field], sizeof(ds->names[w->key_field]), "%s", SL_WDS_KEY);
		ds->fields[w->key_field] = (struct sluice_field){ ds->names[w->key_field], SLUICE_DTYPE_BYTES, 0, { 0 } };
	}
	ds->has_crc = 0;
	return rc;
}

/* The tar holding record i (binary search over first-record numbers). */
static unsigned sl_wds_tar_of(const struct sl_wds *w, uint64_t i)
{
	unsigned lo = 0, hi = w->ntars - 1;

	while (lo < hi) {
		unsigned mid = (lo + hi + 1) / 2;

		if (w->tars[mid].first <= i)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

static void sl_wds_locate(const struct sluice_dataset *ds, uint64_t i, struct sluice_record_loc *loc)
{
	const struct sl_wds *w = ds->priv;
	unsigned t = sl_wds_tar_of(w, i);
	const struct sl_wds_tar *tt = &w->tars[t];
	const unsigned char *e = tt->idx + tt->entries_off + (i - tt->first) * tt->stride;

	loc->shard = t;
	loc->offset = sl__le64(e);
	loc->length = sl__le32(e + 8);
	loc->crc = 0;
}

static int sl_wds_decode(const struct sluice_dataset *ds, uint64_t i, const unsigned char *p, size_t len,
			 struct sluice_record *rec)
{
	const struct sl_wds *w = ds->priv;
	const struct sl_wds_tar *tt;
	const unsigned char *e;

	uint32_t koff, klen;

	tt = &w->tars[sl_wds_tar_of(w, i)];
	e = tt->idx + tt->entries_off + (i - tt->first) * tt->stride;
	koff = sl__le32(e + 12);
	klen = sl__le32(e + 16);
	if (koff > tt->idx_len - tt->keys_off || klen > tt->idx_len - tt->keys_off - koff)
		return sl__err(SLUICE_EFORMAT, "the sample's key lies outside its index");
	if (rec) {
		for (unsigned f = 0; f < ds->nfields; f++)
			rec->data[f] = p, rec->len[f] = 0;
		/* The key lives in the index, not in the sample's bytes: valid while ds is open. */
		rec->data[w->key_field] = tt->idx + tt->keys_off + koff;
		rec->len[w->key_field] = klen;
	}
	for (unsigned k = 0; k < tt->nkeys; k++) {
		uint32_t off = sl__le32(e + SL_WDS_ENTRY + 8 * k), l = sl__le32(e + SL_WDS_ENTRY + 4 + 8 * k);

		if (off == SL_WDS_ABSENT)
			continue;
		if (off > len || l > len - off)
			return sl__err(SLUICE_EFORMAT, "field '%s' lies outside the sample", ds->names[tt->field_of[k]]);
		if (rec) {
			rec->data[tt->field_of[k]] = p + off;
			rec->len[tt->field_of[k]] = l;
		}
	}
	return 0;
}

const struct sl__ds_ops sl__ds_wds_ops = {
	.name = "webdataset",
	.one_file = 1,
	.probe = sl_wds_probe,
	.open = sl_wds_open,
	.close = sl_wds_close,
	.locate = sl_wds_locate,
	.decode = sl_wds_decode,
	.check = NULL,
};
