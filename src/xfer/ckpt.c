/*
 * Model checkpoints (sluice_ckpt_*): a table of readers, one per layout,
 * each turning a path into open files and a table of tensors; then one
 * plan for all of them (runs of tensors that lie back to back in a file
 * and stay aligned land as one range) and one batched read.  The headers
 * are parsed by format/safetensors.c; every file stays open, so its header
 * and its data are read through one open.
 */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "format/format.h"
#include "xfer.h"

#define SL_CKPT_FILES_MAX 65536u
#define SL_CKPT_SMALL_MAX (64ull << 20) /* an index or a DCP .metadata */
#define SL_CKPT_FIRST (64u << 10)       /* a header's first read */
#define SL_CKPT_ALIGN 256u              /* where a run starts in the load buffer (as sluice.load) */
#define SL_CKPT_OPENERS 16u             /* files opened (their headers read) at once */

struct sl_cfile {
	struct sluice_file *f;
	char *path;
	struct sl__st_header h;
	struct stat st; /* a local file's, at its open: a rewrite in place since fails the load (sl_unchanged) */
	int local;
};

struct sluice_ckpt {
	struct sluice_engine *eng;
	const char *format;
	struct sl_cfile *files;
	unsigned nfiles;
	struct sluice_ckpt_tensor *t;
	size_t n;
	json_t *doc;       /* a DCP checkpoint's metadata: the table's names point into it */
	char **own;        /* arrays the table points at, beside the headers' */
	size_t nown;
	struct sluice_range *runs;
	size_t nruns;
	uint64_t bytes, load_size;
};

struct sl_ckpt_reader {
	const char *name;
	/* 1 if this reader reads path (a directory or file it recognises by name), 0 if not, or an error. */
	int (*probe)(const char *path);
	/* Opens the files and fills ck->t; an error naming the file. */
	int (*open)(struct sluice_ckpt *ck, const char *path);
};

static int sl_keep(struct sluice_ckpt *ck, void *p)
{
	char **o;

	if (!p)
		return -ENOMEM;
	if (!(o = realloc(ck->own, (ck->nown + 1) * sizeof(*o)))) {
		free(p);
		return -ENOMEM;
	}
	ck->own = o;
	ck->own[ck->nown++] = p;
	return 0;
}

static int sl_ends(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && !strcmp(s + a - b, suffix);
}

/* "dir/name" (dirlen bytes of dir), malloc'd; NULL when out of memory. */
static char *sl_join(const char *dir, size_t dirlen, const char *name)
{
	size_t n = dirlen + strlen(name) + 2;
	char *p = malloc(n);

	if (p)
		snprintf(p, n, "%.*s/%s", (int)dirlen, dir, name);
	return p;
}

/* The whole of a small file (an index, a .metadata) through the engine, NUL-terminated. */
static int sl_read_small(struct sluice_engine *eng, const char *path, char **out, size_t *len)
{
	struct sluice_file *f;
	uint64_t size;
	ssize_t got;
	int rc;

	*out = NULL;
	*len = 0;
	if ((rc = sluice_file_open(&f, eng, path, 0)))
		return rc;
	size = sluice_file_size(f);
	if (size > SL_CKPT_SMALL_MAX) {
		sluice_file_close(f);
		return sl__err(SLUICE_EFORMAT, "%s: %llu bytes, more than an index or metadata file holds", path,
			       (unsigned long long)size);
	}
	if (!(*out = malloc(size + 1))) {
		sluice_file_close(f);
		return -ENOMEM;
	}
	got = size ? sluice_file_read(f, 0, size, *out, NULL) : 0;
	sluice_file_close(f);
	if (got < 0) {
		free(*out);
		*out = NULL;
		return (int)got;
	}
	(*out)[size] = 0;
	*len = size;
	return 0;
}

/*
 * The safetensors header of f (path names it in errors), read through f
 * and checked (sl__st_parse) into *h; with raw, the header's bytes too
 * (the file's first 8 + n, malloc'ed, *raw_len of them).
 */
static int sl_st_read(struct sluice_file *f, const char *path, struct sl__st_header *h, char **raw, size_t *raw_len)
{
	uint64_t size = sluice_file_size(f), n;
	size_t want = size < SL_CKPT_FIRST ? (size_t)size : SL_CKPT_FIRST;
	char *head = malloc(want ? want : 1);
	ssize_t got;
	int rc;

	if (!head)
		return -ENOMEM;
	got = want ? sluice_file_read(f, 0, want, head, NULL) : 0;
	if (got >= 8 && (n = sl__le64(head)) <= SL_ST_HEADER_MAX && n <= size - 8 && 8 + n > want) {
		char *more = realloc(head, 8 + n);

		if (!more) {
			free(head);
			return -ENOMEM;
		}
		head = more;
		got = sluice_file_read(f, want, 8 + n - want, head + want, NULL);
		got = got < 0 ? got : (ssize_t)(8 + n);
	}
	rc = got < 0 ? (int)got : sl__st_parse(head, (size_t)got, size, path, h);
	if (!rc && raw) {
		*raw = head;
		*raw_len = (size_t)h->data_start;
		return 0;
	}
	free(head);
	return rc;
}

/* Opens path as file i of ck and reads its safetensors header through that open. */
static int sl_open_st(struct sluice_ckpt *ck, unsigned i, const char *path)
{
	struct sl_cfile *cf = &ck->files[i];
	int rc;

	if (!(cf->path = strdup(path)))
		return -ENOMEM;
	if ((rc = sluice_file_open(&cf->f, ck->eng, path, 0)))
		return rc;
	cf->local = sl__fs_is_local(path) && stat(path, &cf->st) == 0;
	return sl_st_read(cf->f, cf->path, &cf->h, NULL, NULL);
}

/* Opens dir/name (dirlen bytes of dir) as file i of ck, the checkpoint's files then 0 to i. */
static int sl_open_one(struct sluice_ckpt *ck, unsigned i, const char *dir, size_t dirlen, const char *name)
{
	char *p = sl_join(dir, dirlen, name);
	int rc;

	if (!p)
		return -ENOMEM;
	ck->nfiles = i + 1;
	rc = sl_open_st(ck, i, p);
	free(p);
	return rc;
}

static int sl_alloc_files(struct sluice_ckpt *ck, size_t n, const char *where)
{
	if (n == 0)
		return sl__err(-ENOENT, "%s: no .safetensors files and no index", where);
	if (n > SL_CKPT_FILES_MAX)
		return sl__err(SLUICE_EFORMAT, "%s: %zu files, more than %u", where, n, SL_CKPT_FILES_MAX);
	ck->files = calloc(n, sizeof(*ck->files));
	return ck->files ? 0 : -ENOMEM;
}

struct sl_opens {
	struct sluice_ckpt *ck;
	const char *const *paths;
	atomic_uint next;
	struct sl__first_err fe;
};

static void *sl_open_some(void *arg)
{
	struct sl_opens *o = arg;
	unsigned i;

	while (!atomic_load(&o->fe.err) && (i = atomic_fetch_add(&o->next, 1)) < o->ck->nfiles)
		sl__first_err_keep(&o->fe, sl_open_st(o->ck, i, o->paths[i]));
	return NULL;
}

/*
 * Opens the n paths as the checkpoint's files, in that order, their headers read on up to SL_CKPT_OPENERS
 * threads at once (an object's open and header are round trips; a local file's a few milliseconds).
 */
static int sl_open_files(struct sluice_ckpt *ck, const char *const *paths, size_t n, const char *where)
{
	struct sl_opens o = { .ck = ck, .paths = paths };
	int rc;

	if ((rc = sl_alloc_files(ck, n, where)))
		return rc;
	ck->nfiles = (unsigned)n;
	sl__first_err_init(&o.fe);
	sl__fanout(n < SL_CKPT_OPENERS ? (unsigned)n : SL_CKPT_OPENERS, sl_open_some, &o);
	rc = sl__first_err_raise(&o.fe);
	sl__first_err_fini(&o.fe);
	if (rc == -EMFILE || rc == -ENFILE)
		rc = sl__err(rc, "%s (a checkpoint's %zu files stay open from its open to its load's end: raise the limit "
				 "on open files, ulimit -n)", sluice_last_error_detail(), n);
	return rc;
}

/* dir/names[i] (dirlen bytes of dir) for each of the n names, opened as the checkpoint's files. */
static int sl_open_named(struct sluice_ckpt *ck, const char *dir, size_t dirlen, char *const *names, size_t n)
{
	char **p = calloc(n ? n : 1, sizeof(*p));
	int rc = p ? 0 : -ENOMEM;

	for (size_t i = 0; !rc && i < n; i++)
		rc = (p[i] = sl_join(dir, dirlen, names[i])) ? 0 : -ENOMEM;
	if (!rc)
		rc = sl_open_files(ck, (const char *const *)p, n, dir);
	for (size_t i = 0; p && i < n; i++)
		free(p[i]);
	free(p);
	return rc;
}

/* Every tensor of file i as an entry of the table, or those ix (an index, whose file i it is) places in it. */
static int sl_add_file(struct sluice_ckpt *ck, unsigned i, const struct sl__st_index *ix)
{
	const struct sl__st_header *h = &ck->files[i].h;
	struct sluice_ckpt_tensor *t = realloc(ck->t, (ck->n + h->n + 1) * sizeof(*t));

	if (!t)
		return -ENOMEM;
	ck->t = t;
	for (size_t k = 0; k < h->n; k++) {
		const struct sl__st_tensor *s = &h->t[k];
		long at = ix ? sl__st_index_find(ix, s->name) : -1;

		if (ix && (at < 0 || ix->file[at] != i))
			continue;
		t = &ck->t[ck->n++];
		memset(t, 0, sizeof(*t));
		t->name = s->name;
		t->dtype = sl__st_dtypes[s->dtype].name;
		t->torch_dtype = sl__st_dtypes[s->dtype].torch;
		t->ndim = s->ndim;
		t->shape = s->shape;
		t->file = i;
		t->offset = h->data_start + s->begin;
		t->bytes = s->end - s->begin;
	}
	return 0;
}

static int sl_by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int sl_by_key(const void *a, const void *b)
{
	const struct sluice_ckpt_tensor *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c || !x->chunk || !y->chunk || x->ndim != y->ndim)
		return c ? c : (x->chunk != NULL) - (y->chunk != NULL);
	return memcmp(x->chunk, y->chunk, x->ndim * sizeof(uint64_t));
}

/*
 * What the index's files hold against what it names: a tensor it names in one file that another file holds too
 * is ambiguous (transformers reads each file whole, so its last copy would win); one it names that its file lacks
 * is missing.  ck->t is left sorted by name.
 */
static int sl_index_check(struct sluice_ckpt *ck, const char *path, const struct sl__st_index *ix)
{
	char named[320] = "";
	size_t missing = 0, at = 0;

	qsort(ck->t, ck->n, sizeof(*ck->t), sl_by_key);
	for (unsigned i = 0; i < ck->nfiles; i++) {
		const struct sl__st_header *h = &ck->files[i].h;

		for (size_t j = 0; j < h->n; j++) {
			struct sluice_ckpt_tensor key = { .name = h->t[j].name }, *hit;
			long k = sl__st_index_find(ix, key.name);

			if (k < 0 || ix->file[k] == i)
				continue;
			if ((hit = bsearch(&key, ck->t, ck->n, sizeof(*ck->t), sl_by_key)))
				return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' is also in %s, the file %s names for it (which "
							       "copy is meant?)", ck->files[i].path, key.name,
					       ck->files[hit->file].path, path);
		}
	}
	if (ck->n == ix->n)
		return 0;
	for (size_t k = 0; k < ix->n; k++) {
		struct sluice_ckpt_tensor key = { .name = ix->names[k] };

		if (bsearch(&key, ck->t, ck->n, sizeof(*ck->t), sl_by_key) || missing++ >= 5 || at >= sizeof(named))
			continue;
		at += (size_t)snprintf(named + at, sizeof(named) - at, "%s'%s' (%s)", at ? ", " : "", ix->names[k],
				       ix->files[ix->file[k]]);
	}
	return sl__err(SLUICE_EFORMAT, "%s: names %zu tensors its files do not hold: %s%s", path, missing, named,
		       missing > 5 ? " and more" : "");
}

/*
 * The files of an index whose store names files by URLs (http(s)), as its URLs name them: percent-encoded (the
 * names hold no '%', sl__st_index_parse checked), in place.
 */
static int sl_web_names(struct sl__st_index *ix)
{
	for (size_t i = 0; i < ix->nfiles; i++) {
		size_t cap = 3 * strlen(ix->files[i]) + 5;
		char *e = malloc(cap);

		if (!e)
			return -ENOMEM;
		sl__url_encode(e, cap, 0, ix->files[i], 0);
		free(ix->files[i]);
		ix->files[i] = e;
	}
	return 0;
}

/*
 * The checkpoint of an index (path; its len bytes raw, sl__st_index_parse): the files it names beside it,
 * opened in its files' order (file i of ck is the index's file i); exactly the tensors it names, each from the
 * file it names.
 */
static int sl_index(struct sluice_ckpt *ck, const char *path, const char *raw, size_t len)
{
	const char *slash = strrchr(path, '/');
	struct sl__st_index ix;
	int rc = sl__st_index_parse(raw, len, path, &ix);

	if (rc)
		return rc;
	if (sl__fs_url_names(path))
		rc = sl_web_names(&ix);
	if (!rc)
		rc = sl_open_named(ck, slash ? path : ".", slash ? (size_t)(slash - path) : 1, ix.files, ix.nfiles);
	for (unsigned i = 0; !rc && i < ck->nfiles; i++)
		rc = sl_add_file(ck, i, &ix);
	if (!rc)
		rc = sl_index_check(ck, path, &ix);
	sl__st_index_free(&ix);
	return rc;
}

static int sl_open_index(struct sluice_ckpt *ck, const char *path)
{
	char *raw;
	size_t len;
	int rc = sl_read_small(ck->eng, path, &raw, &len);

	if (!rc)
		rc = sl_index(ck, path, raw, len);
	free(raw);
	return rc;
}

/*
 * K of N ("-00001-of-00003") and the name without them, or 0 where the name is no shard's; the variant is what
 * lies between the name's first dot and its shard part or ".safetensors" (transformers' model.fp16.safetensors).
 */
static int sl_part(const char *n, unsigned *k, unsigned *of, size_t *stem)
{
	const char *p = strstr(n, "-of-");

	while (p) {
		const char *a = p;
		int d = 0;

		while (a > n && a[-1] >= '0' && a[-1] <= '9')
			a--, d++;
		if (d && a > n && a[-1] == '-' && sscanf(a, "%u-of-%u", k, of) == 2) {
			*stem = (size_t)(a - 1 - n);
			return 1;
		}
		p = strstr(p + 1, "-of-");
	}
	return 0;
}

static void sl_variant(const char *n, const char **v, size_t *len)
{
	const char *dot = strchr(n, '.'), *end = n + strlen(n) - strlen(".safetensors");
	unsigned k, of;
	size_t stem;

	if (sl_part(n, &k, &of, &stem) && n + stem < end)
		end = n + stem;
	*v = dot && dot < end ? dot + 1 : end;
	*len = (size_t)(end - *v);
}

/* Files of a directory without an index: one variant, and shards K of N only all together, each once. */
static int sl_check_listing(const char *dir, char **names, size_t n)
{
	unsigned k, of, total = 0;
	size_t stem, stem0 = 0, vlen0, vlen;
	const char *v0, *v;
	unsigned char *seen = NULL;
	int parts = 0, bad = 0, rc = 0;

	for (size_t i = 0; i < n && !rc; i++) {
		sl_variant(names[i], &v, &vlen);
		if (!i)
			v0 = v, vlen0 = vlen;
		else if (vlen != vlen0 || strncmp(v, v0, vlen))
			rc = sl__err(SLUICE_EFORMAT, "%s: holds several variants of a checkpoint (%s and %s): name the one "
						     "to load by its file or index", dir, names[0], names[i]);
		if (sl_part(names[i], &k, &of, &stem)) {
			parts++;
			if (of > n) { /* more shards than files: not all there (and no table of 4 billion) */
				bad = 1;
				continue;
			}
			if (!seen) {
				total = of, stem0 = stem;
				seen = calloc((size_t)of + 1, 1);
				if (!seen)
					return -ENOMEM;
			}
			if (of != total || stem != stem0 || strncmp(names[i], names[0], stem) || !k || k > total || seen[k]++)
				bad = 1;
		}
	}
	if (!rc && parts && (bad || parts != (int)n || (size_t)total != n))
		rc = sl__err(SLUICE_EFORMAT,
			     "%s: holds no index and %zu .safetensors files that are not shards 1 to %u of one save, each "
			     "once: an unfinished save, not a checkpoint (name a file to load it)", dir, n, total);
	free(seen);
	return rc;
}

static int sl_open_st_dir(struct sluice_ckpt *ck, const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char **names = NULL, *index = NULL;
	size_t n = 0, cap = 0, nindex = 0;
	int rc = 0;

	if (!d)
		return sl__err(-errno, "%s: %s", dir, strerror(errno));
	while (!rc && (e = readdir(d))) {
		if (strstr(e->d_name, ".safetensors.index") && sl_ends(e->d_name, ".json")) {
			nindex++;
			free(index);
			index = strdup(e->d_name);
			rc = index ? 0 : -ENOMEM;
		} else if (sl_ends(e->d_name, ".safetensors")) {
			if (n == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof(*names)))) {
				rc = -ENOMEM;
				break;
			}
			if (!(names[n++] = strdup(e->d_name)))
				rc = -ENOMEM;
		}
	}
	closedir(d);
	if (!rc && nindex > 1)
		rc = sl__err(SLUICE_EFORMAT, "%s: holds %zu indexes (variants of a checkpoint): name the one to load",
			     dir, nindex);
	if (!rc && nindex == 1) {
		char *p = sl_join(dir, strlen(dir), index);

		if (!p)
			rc = -ENOMEM;
		else {
			rc = sl_open_index(ck, p);
			free(p);
		}
	} else if (!rc) {
		qsort(names, n, sizeof(*names), sl_by_name);
		rc = sl_check_listing(dir, names, n);
		if (!rc)
			rc = sl_open_named(ck, dir, strlen(dir), names, n);
		for (unsigned i = 0; !rc && i < ck->nfiles; i++)
			rc = sl_add_file(ck, i, NULL);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	free(index);
	return rc;
}

static int sl_st_probe(const char *path)
{
	struct stat st;
	char *p;
	int has;

	if (!sl__fs_is_local(path))
		return !sl_ends(path, "/");
	if (stat(path, &st) || !S_ISDIR(st.st_mode))
		return 1;
	if (!(p = sl_join(path, strlen(path), ".metadata")))
		return -ENOMEM;
	has = !access(p, F_OK);
	free(p);
	return !has;
}

static int sl_st_open(struct sluice_ckpt *ck, const char *path)
{
	struct stat st;
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	int rc;

	if (sl__fs_is_local(path) && !stat(path, &st) && S_ISDIR(st.st_mode))
		return sl_open_st_dir(ck, path);
	if (strstr(base, ".safetensors.index") && sl_ends(base, ".json"))
		return sl_open_index(ck, path);
	if ((rc = sl_alloc_files(ck, 1, path)))
		return rc;
	ck->nfiles = 1;
	return (rc = sl_open_st(ck, 0, path)) ? rc : sl_add_file(ck, 0, NULL);
}

/* ---- sluice.dcp's layout: .metadata (a notice for torch's unpickler, then JSON), a safetensors file a rank ---- */


static int sl_dcp_probe(const char *path)
{
	return !sl_st_probe(path);
}

/*
 * Item it of the checked metadata, a chunk of tensor fqn: the tensor its file's header gives the item's name
 * must be exactly the item (its place, its length, its chunk's dtype and shape); added to the table.
 */
static int sl_dcp_item(struct sluice_ckpt *ck, const char *meta, json_t *tensors, json_t *it, unsigned fi)
{
	const char *fqn = json_string_value(json_object_get(it, "fqn")), *name = json_string_value(json_object_get(it, "name"));
	json_t *off = json_object_get(it, "offset"), *t = json_object_get(tensors, fqn), *c = NULL, *sizes;
	const struct sl__st_header *h = &ck->files[fi].h;
	const struct sl__st_tensor *s = NULL;
	json_int_t at = json_integer_value(json_object_get(it, "at")),
		   length = json_integer_value(json_object_get(it, "length"));
	int dt = sl__st_dtype_find(json_string_value(json_object_get(t, "dtype")), 1), rc;
	struct sluice_ckpt_tensor *e;
	uint64_t *chunk;
	size_t i, j;

	json_array_foreach(json_object_get(t, "chunks"), i, c)
		if (json_equal(json_object_get(c, "offsets"), off))
			break;
	sizes = json_object_get(c, "sizes");
	for (j = 0; j < h->n && strcmp(h->t[j].name, name); j++)
		;
	if (j < h->n)
		s = &h->t[j];
	if (!s || (json_int_t)(h->data_start + s->begin) != at || (json_int_t)(s->end - s->begin) != length ||
	    s->dtype != dt || json_array_size(sizes) != s->ndim)
		return sl__err(SLUICE_EFORMAT, "%s: damaged metadata: item '%s' is not tensor '%s' of %s", meta, fqn, name,
			       ck->files[fi].path);
	for (j = 0; j < s->ndim; j++)
		if ((json_int_t)s->shape[j] != json_integer_value(json_array_get(sizes, j)))
			return sl__err(SLUICE_EFORMAT, "%s: damaged metadata: item '%s' is not tensor '%s' of %s", meta,
				       fqn, name, ck->files[fi].path);
	if (!(chunk = calloc(s->ndim ? s->ndim : 1, sizeof(*chunk))) || (rc = sl_keep(ck, chunk)))
		return -ENOMEM;
	for (j = 0; j < s->ndim; j++)
		chunk[j] = (uint64_t)json_integer_value(json_array_get(off, j));
	e = &ck->t[ck->n++];
	memset(e, 0, sizeof(*e));
	e->name = fqn; /* in ck->doc */
	e->dtype = sl__st_dtypes[s->dtype].name;
	e->torch_dtype = sl__st_dtypes[s->dtype].torch;
	e->ndim = s->ndim;
	e->shape = s->shape;
	e->chunk = chunk;
	e->file = fi;
	e->offset = h->data_start + s->begin;
	e->bytes = s->end - s->begin;
	return 0;
}

/* .metadata's document, checked whole (format/dcp.c); kept in ck->doc (the table's names point into it). */
static int sl_dcp_doc(struct sluice_ckpt *ck, const char *meta)
{
	char *raw;
	size_t len;
	int rc;

	if ((rc = sl_read_small(ck->eng, meta, &raw, &len)))
		return rc;
	rc = sl__dcp_meta_parse(raw, len, meta, &ck->doc);
	free(raw);
	return rc;
}

/* The index in ck->files of the rank file named file, opened (and its header read) the first time. */
static int sl_dcp_file(struct sluice_ckpt *ck, const char *dir, const char *meta, const char *file, unsigned *fi)
{
	for (*fi = 0; *fi < ck->nfiles; (*fi)++)
		if (!strcmp(strrchr(ck->files[*fi].path, '/') + 1, file))
			return 0;
	if (*fi == SL_CKPT_FILES_MAX)
		return sl__err(SLUICE_EFORMAT, "%s: more than %u files", meta, SL_CKPT_FILES_MAX);
	return sl_open_one(ck, *fi, dir, strlen(dir), file);
}

static int sl_dcp_open(struct sluice_ckpt *ck, const char *dir)
{
	char *meta = sl_join(dir, strlen(dir), ".metadata");
	json_t *items, *tensors, *it;
	size_t i, nitems = 0;
	int rc;

	if (!meta)
		return -ENOMEM;
	if ((rc = sl_keep(ck, meta)) || (rc = sl_dcp_doc(ck, meta)))
		return rc;
	items = json_object_get(ck->doc, "items");
	tensors = json_object_get(ck->doc, "tensors");
	/* The rank files, in the order items first name them; each opened and its header read once. */
	if ((rc = sl_alloc_files(ck, json_array_size(items) < SL_CKPT_FILES_MAX ? json_array_size(items) + 1
									       : SL_CKPT_FILES_MAX, meta)))
		return rc;
	if (!(ck->t = calloc(json_array_size(items) + 1, sizeof(*ck->t))))
		return -ENOMEM;
	/* The document is checked whole (format/dcp.c): every chunk stored once, each item under its own name, in
	 * files of one save.  Each chunk item is checked here against its file's header. */
	json_array_foreach(items, i, it) {
		const char *file = json_string_value(json_object_get(it, "file"));
		json_t *off = json_object_get(it, "offset");
		unsigned fi;

		if (!off || json_is_null(off))
			continue; /* bytes (a pickled object), not a tensor */
		if ((rc = sl_dcp_file(ck, dir, meta, file, &fi)) || (rc = sl_dcp_item(ck, meta, tensors, it, fi)))
			return rc;
		nitems++;
	}
	return nitems ? 0 : sl__err(-ENOENT, "%s: the checkpoint holds no tensor", meta);
}

static const struct sl_ckpt_reader sl_readers[] = {
	{ "sluice-dcp", sl_dcp_probe, sl_dcp_open },
	{ "safetensors", sl_st_probe, sl_st_open },
};

static int sl_by_place(const void *a, const void *b)
{
	const struct sluice_ckpt_tensor *x = a, *y = b;

	return x->file != y->file ? (x->file < y->file ? -1 : 1) : x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* No tensor (DCP: no chunk of a tensor) twice: a name in two files of a directory is ambiguous. */
static int sl_unique(struct sluice_ckpt *ck, const char *path)
{
	qsort(ck->t, ck->n, sizeof(*ck->t), sl_by_key);
	for (size_t i = 1; i < ck->n; i++)
		if (!sl_by_key(&ck->t[i - 1], &ck->t[i]))
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' is stored twice (%s and %s)", path, ck->t[i].name,
				       ck->files[ck->t[i - 1].file].path, ck->files[ck->t[i].file].path);
	return 0;
}

/* Each tensor's place in the load buffer, and the runs: tensors back to back in a file, each aligned. */
static int sl_plan(struct sluice_ckpt *ck)
{
	struct sluice_range *r = NULL;
	uint64_t at = 0;

	qsort(ck->t, ck->n, sizeof(*ck->t), sl_by_place);
	if (ck->n && !(r = ck->runs = calloc(ck->n, sizeof(*r))))
		return -ENOMEM;
	for (size_t i = 0; i < ck->n; i++) {
		struct sluice_ckpt_tensor *t = &ck->t[i];
		unsigned el = sl__st_dtypes[sl__st_dtype_find(t->dtype, 0)].bits / 8;
		struct sluice_range *run = ck->nruns ? &r[ck->nruns - 1] : NULL;

		el = el ? el : 1;
		ck->bytes += t->bytes;
		if (run && run->file == ck->files[t->file].f && t->offset == run->offset + run->len &&
		    (t->offset - run->offset) % el == 0) {
			t->at = (uint64_t)(uintptr_t)run->buf + run->len;
			run->len += t->bytes;
			at = t->at + t->bytes;
			continue;
		}
		at = (at + SL_CKPT_ALIGN - 1) / SL_CKPT_ALIGN * SL_CKPT_ALIGN;
		t->at = at;
		r[ck->nruns++] = (struct sluice_range){ ck->files[t->file].f, t->offset, t->bytes, (void *)(uintptr_t)at };
		at += t->bytes;
	}
	ck->load_size = at;
	return 0;
}

/* The open's end: no tensor twice, the plan; on an error ck is closed. */
static int sl_finish(struct sluice_ckpt **out, struct sluice_ckpt *ck, const char *path, int rc, uint64_t t0)
{
	uint64_t t1 = sl__now_ns();

	if (!rc)
		rc = sl_unique(ck, path);
	if (!rc)
		rc = sl_plan(ck);
	if (!rc)
		sl__debug("ckpt", "%s: %u files opened, their headers read and the table made in %.2f ms, checked and planned in %.2f ms",
			  path, ck->nfiles, (double)(t1 - t0) / 1e6, (double)(sl__now_ns() - t1) / 1e6);
	if (rc) {
		sluice_ckpt_close(ck);
		return rc;
	}
	*out = ck;
	return 0;
}

int sluice_ckpt_open(struct sluice_ckpt **out, struct sluice_engine *eng, const char *path)
{
	struct sluice_ckpt *ck;
	uint64_t t0;
	int rc = 0;
	size_t i;

	*out = NULL;
	sl__err_clear();
	if (!eng || !path)
		return sl__err(-EINVAL, "sluice_ckpt_open: no engine or no path");
	if (!(ck = calloc(1, sizeof(*ck))))
		return -ENOMEM;
	ck->eng = eng;
	t0 = sl__now_ns();
	for (i = 0; i < sizeof(sl_readers) / sizeof(sl_readers[0]); i++)
		if ((rc = sl_readers[i].probe(path)) != 0)
			break;
	if (rc > 0) {
		ck->format = sl_readers[i].name;
		rc = sl_readers[i].open(ck, path);
	} else if (!rc) {
		rc = sl__err(SLUICE_EFORMAT, "%s: not a checkpoint sluice reads", path);
	}
	return sl_finish(out, ck, path, rc, t0);
}

int sluice_ckpt_open_files(struct sluice_ckpt **out, struct sluice_engine *eng, const char *const *files, unsigned n,
			   const char *index, const char *index_json, size_t index_len)
{
	uint64_t t0 = sl__now_ns();
	struct sluice_ckpt *ck;
	int rc = 0;

	*out = NULL;
	sl__err_clear();
	if (!eng || (index ? !index_json || n : !files))
		return sl__err(-EINVAL, "sluice_ckpt_open_files: no engine, or neither files nor an index's bytes");
	for (unsigned i = 0; !index && i < n; i++)
		if (!files[i])
			return sl__err(-EINVAL, "sluice_ckpt_open_files: file %u is NULL", i);
	if (!(ck = calloc(1, sizeof(*ck))))
		return -ENOMEM;
	ck->eng = eng;
	ck->format = "safetensors";
	if (index)
		rc = sl_index(ck, index, index_json, index_len);
	else if (!(rc = sl_open_files(ck, files, n, "sluice_ckpt_open_files")))
		for (unsigned i = 0; !rc && i < n; i++)
			rc = sl_add_file(ck, i, NULL);
	return sl_finish(out, ck, index ? index : n ? files[0] : "sluice_ckpt_open_files", rc, t0);
}

void sluice_ckpt_close(struct sluice_ckpt *ck)
{
	if (!ck)
		return;
	for (unsigned i = 0; ck->files && i < ck->nfiles; i++) {
		sluice_file_close(ck->files[i].f);
		sl__st_free(&ck->files[i].h);
		free(ck->files[i].path);
	}
	for (size_t i = 0; i < ck->nown; i++)
		free(ck->own[i]);
	json_decref(ck->doc);
	free(ck->own);
	free(ck->files);
	free(ck->t);
	free(ck->runs);
	free(ck);
}

const char *sluice_ckpt_format(const struct sluice_ckpt *ck)
{
	return ck->format;
}

size_t sluice_ckpt_count(const struct sluice_ckpt *ck)
{
	return ck->n;
}

const struct sluice_ckpt_tensor *sluice_ckpt_tensor(const struct sluice_ckpt *ck, size_t i)
{
	return i < ck->n ? &ck->t[i] : NULL;
}

unsigned sluice_ckpt_files(const struct sluice_ckpt *ck)
{
	return ck->nfiles;
}

const char *sluice_ckpt_file(const struct sluice_ckpt *ck, unsigned i)
{
	return i < ck->nfiles ? ck->files[i].path : NULL;
}

uint64_t sluice_ckpt_bytes(const struct sluice_ckpt *ck)
{
	return ck->bytes;
}

uint64_t sluice_ckpt_load_size(const struct sluice_ckpt *ck)
{
	return ck->load_size;
}

/*
 * A local file rewritten in place (the same inode, its size or times changed) since its open: its header no
 * longer says where its tensors are.  (Replaced by a rename, the open still reads the old file whole; an object
 * is read at the ETag its open saw.)  -ESTALE naming it, or 0.
 */
static int sl_unchanged(const struct sluice_ckpt *ck)
{
	for (unsigned i = 0; i < ck->nfiles; i++) {
		const struct sl_cfile *cf = &ck->files[i];
		struct stat now;

		if (!cf->local || stat(cf->path, &now) || now.st_ino != cf->st.st_ino || now.st_dev != cf->st.st_dev)
			continue;
		if (now.st_size != cf->st.st_size || now.st_mtim.tv_sec != cf->st.st_mtim.tv_sec ||
		    now.st_mtim.tv_nsec != cf->st.st_mtim.tv_nsec || now.st_ctim.tv_sec != cf->st.st_ctim.tv_sec ||
		    now.st_ctim.tv_nsec != cf->st.st_ctim.tv_nsec)
			return sl__err(-ESTALE, "%s: rewritten in place since the checkpoint was opened (its header may no "
						"longer match its data): open it again", cf->path);
	}
	return 0;
}

struct sluice_file *sluice_ckpt_handle(const struct sluice_ckpt *ck, unsigned i)
{
	return i < ck->nfiles ? ck->files[i].f : NULL;
}

int sluice_ckpt_check(const struct sluice_ckpt *ck)
{
	sl__err_clear();
	return sl_unchanged(ck);
}

int sluice_dcp_metadata_check(const void *raw, size_t len, const char *path)
{
	json_t *doc = NULL;
	int rc;

	sl__err_clear();
	if (!raw || !path)
		return sl__err(-EINVAL, "sluice_dcp_metadata_check: no bytes or no path");
	rc = sl__dcp_meta_parse(raw, len, path, &doc);
	json_decref(doc);
	return rc;
}

int sluice_st_index_files(const char *index, const char *index_json, size_t index_len, char ***files, unsigned *n)
{
	struct sl__st_index ix;
	int rc;

	sl__err_clear();
	if (!files || !n)
		return sl__err(-EINVAL, "sluice_st_index_files: nowhere to put the files");
	*files = NULL;
	*n = 0;
	if (!index || !index_json)
		return sl__err(-EINVAL, "sluice_st_index_files: no index or no bytes");
	if ((rc = sl__st_index_parse(index_json, index_len, index, &ix)))
		return rc;
	*files = ix.files;
	*n = (unsigned)ix.nfiles;
	ix.files = NULL; /* the caller's now */
	sl__st_index_free(&ix);
	return 0;
}

int sluice_ckpt_load(struct sluice_ckpt *ck, void *buf, size_t len, struct sluice_xfer_report *rep)
{
	struct sluice_range *r;
	ssize_t got;
	int rc;

	sl__err_clear();
	if ((rc = sl_unchanged(ck)))
		return rc;
	if (!buf || len < ck->load_size)
		return sl__err(-EINVAL, "sluice_ckpt_load: a buffer of %zu bytes for a load of %llu", buf ? len : 0,
			       (unsigned long long)ck->load_size);
	if (!ck->nruns)
		return 0;
	if (!(r = malloc(ck->nruns * sizeof(*r))))
		return -ENOMEM;
	for (size_t i = 0; i < ck->nruns; i++) {
		r[i] = ck->runs[i];
		r[i].buf = (char *)buf + (uintptr_t)ck->runs[i].buf;
	}
	got = sluice_read_batch(ck->eng, r, ck->nruns, rep);
	free(r);
	if (got < 0)
		return (int)got;
	if ((rc = sl_unchanged(ck)))
		return rc;
	return (uint64_t)got == ck->bytes ? 0 : sl__err(SLUICE_ESHORT, "sluice_ckpt_load: %zd of %llu bytes", got,
							 (unsigned long long)ck->bytes);
}

struct sluice_st_header {
	char *raw;                /* the file's first data_start bytes: the header's length, then its JSON */
	size_t len;
};

int sluice_st_header_read(struct sluice_st_header **out, struct sluice_file *f, const char *path)
{
	struct sluice_st_header *sh;
	struct sl__st_header h = { 0 }; /* freed whether or not the read got as far as parsing it */
	int rc;

	*out = NULL;
	if (!f || !path)
		return sl__err(SLUICE_EINVAL_CONFIG, "sluice_st_header_read: no file");
	if (!(sh = calloc(1, sizeof(*sh))))
		return -ENOMEM;
	rc = sl_st_read(f, path, &h, &sh->raw, &sh->len);
	sl__st_free(&h);
	if (rc) {
		free(sh);
		return rc;
	}
	*out = sh;
	return 0;
}

const char *sluice_st_header_json(const struct sluice_st_header *sh, size_t *len)
{
	*len = sh->len - 8;
	return sh->raw + 8;
}

uint64_t sluice_st_header_data_start(const struct sluice_st_header *sh)
{
	return sh->len;
}

void sluice_st_header_free(struct sluice_st_header *sh)
{
	if (!sh)
		return;
	free(sh->raw);
	free(sh);
}
