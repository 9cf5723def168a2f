/*
 * The safetensors header (8 bytes of JSON length, then a JSON object of
 * tensors), checked as strictly as safetensors checks it and as
 * python/sluice/_safetensors.py's read_header does: every dtype one of the
 * specification's; shapes of non-negative integers whose bit count fits
 * 64 bits and fills whole bytes; data_offsets that hold exactly that; the
 * tensors, in offset order, tiling the data from its start to the file's
 * end (no overlap, no gap, no trailing byte); an optional __metadata__ of
 * strings; no name twice.  Bytes from outside: fuzzed (tests/fuzz).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format.h"

const struct sl__st_dtype sl__st_dtypes[] = {
	{ "BOOL", 8, "bool" },	       { "F4", 4, "float4_e2m1fn_x2" }, { "F6_E2M3", 6, NULL },
	{ "F6_E3M2", 6, NULL },	       { "U8", 8, "uint8" },		{ "I8", 8, "int8" },
	{ "F8_E5M2", 8, "float8_e5m2" }, { "F8_E4M3", 8, "float8_e4m3fn" }, { "F8_E8M0", 8, "float8_e8m0fnu" },
	{ "I16", 16, "int16" },	       { "U16", 16, "uint16" },		{ "F16", 16, "float16" },
	{ "BF16", 16, "bfloat16" },    { "I32", 32, "int32" },		{ "U32", 32, "uint32" },
	{ "F32", 32, "float32" },      { "C64", 64, "complex64" },	{ "F64", 64, "float64" },
	{ "I64", 64, "int64" },	       { "U64", 64, "uint64" },		{ "F8_E4M3FNUZ", 8, "float8_e4m3fnuz" },
	{ "F8_E5M2FNUZ", 8, "float8_e5m2fnuz" },
	{ NULL, 0, NULL },
};

int sl__st_dtype_find(const char *name, int torch_name)
{
	for (int i = 0; sl__st_dtypes[i].name; i++)
		if (torch_name ? sl__st_dtypes[i].torch && !strcmp(sl__st_dtypes[i].torch, name)
			       : !strcmp(sl__st_dtypes[i].name, name))
			return i;
	return -1;
}

void sl__st_free(struct sl__st_header *h)
{
	for (size_t i = 0; h->t && i < h->n; i++) {
		free(h->t[i].name);
		free(h->t[i].shape);
	}
	free(h->t);
	memset(h, 0, sizeof(*h));
}

static int sl_by_begin(const void *a, const void *b)
{
	const struct sl__st_tensor *x = a, *y = b;

	return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* One tensor's entry; 0, or SLUICE_EFORMAT naming path and the tensor. */
static int sl_entry(const char *path, const char *name, json_t *v, struct sl__st_tensor *t)
{
	json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
	       *offs = json_object_get(v, "data_offsets"), *d;
	unsigned __int128 bits, span;
	size_t i;

	if (!json_is_object(v) || !dt || !shape || !offs)
		return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' lacks dtype, shape or data_offsets", path, name);
	if (!json_is_string(dt) || (t->dtype = sl__st_dtype_find(json_string_value(dt), 0)) < 0)
		return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' has dtype %s%s%s, unknown to the safetensors specification",
			       path, name, json_is_string(dt) ? "'" : "", json_is_string(dt) ? json_string_value(dt) : "not a string",
			       json_is_string(dt) ? "'" : "");
	if (!json_is_array(shape) || json_array_size(shape) > SL_ST_MAX_DIMS)
		return sl__err(SLUICE_EFORMAT, "%s: tensor '%s': shape is not a list of at most %d integers", path, name,
			       SL_ST_MAX_DIMS);
	t->ndim = (unsigned)json_array_size(shape);
	if (!(t->shape = calloc(t->ndim ? t->ndim : 1, sizeof(uint64_t))))
		return -ENOMEM;
	bits = sl__st_dtypes[t->dtype].bits;
	span = 1; /* elements of its non-zero dimensions: below 2^63 before each product, so none wraps */
	json_array_foreach(shape, i, d) {
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s': shape is not a list of non-negative integers", path,
				       name);
		t->shape[i] = (uint64_t)json_integer_value(d);
		bits *= t->shape[i];
		/*
		 * Its other dimensions too where one is 0: numpy and torch make no
		 * array whose non-zero dimensions span more than 2^63 - 1 bytes
		 * ([0, 2^62, 2^62]: its strides overflow).
		 */
		span *= t->shape[i] ? t->shape[i] : 1;
		if (bits >> 64)
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s': its size overflows 64 bits", path, name);
		if (span >> 63 || (span * sl__st_dtypes[t->dtype].bits) >> 66)
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s': its dimensions other than 0 span more than 2^63 - 1 "
						       "bytes (its size overflows 64 bits with its strides)", path, name);
	}
	if (bits % 8)
		return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' does not fill whole bytes", path, name);
	if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
	    !json_is_integer(json_array_get(offs, 1)) || json_integer_value(json_array_get(offs, 0)) < 0 ||
	    json_integer_value(json_array_get(offs, 1)) < 0)
		return sl__err(SLUICE_EFORMAT, "%s: tensor '%s': data_offsets is not two non-negative integers", path,
			       name);
	t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
	t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
	if (t->end < t->begin || t->end - t->begin != (uint64_t)(bits / 8))
		return sl__err(SLUICE_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] do not hold %llu %s elements "
					       "(%llu bytes)", path, name, (unsigned long long)t->begin,
			       (unsigned long long)t->end, (unsigned long long)(bits / sl__st_dtypes[t->dtype].bits),
			       sl__st_dtypes[t->dtype].name, (unsigned long long)(bits / 8));
	return 0;
}

/*
 * How deep v nests (a scalar 0); jansson's parser has refused more than its
 * 2048 levels already, so the recursion is bounded.
 */
#define SL_ST_DEPTH_MAX 128
static int sl_depth(json_t *v)
{
	int deepest = 0, d;
	const char *k;
	json_t *e;
	size_t i;

	if (json_is_object(v))
		json_object_foreach(v, k, e)
			if ((d = sl_depth(e)) > deepest)
				deepest = d;
	if (json_is_array(v))
		json_array_foreach(v, i, e)
			if ((d = sl_depth(e)) > deepest)
				deepest = d;
	return json_is_object(v) || json_is_array(v) ? deepest + 1 : 0;
}

/* What a file that is not safetensors is, where its first bytes say so: torch.save's two formats; else NULL. */
static const char *sl_torch_save(const char *head, size_t len)
{
	const unsigned char *p = (const unsigned char *)head;

	if (len >= 4 && !memcmp(head, "PK\x03\x04", 4))
		return "a torch.save file (a zip archive)";
	if (len >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5)
		return "a pickle (a torch.save file of torch's legacy format, or pickle.dump's)";
	return NULL;
}

/* SLUICE_EFORMAT: path is not a safetensors file, what it is where its first bytes say, else why. */
static int sl_not_st(const char *path, const char *head, size_t len, const char *why)
{
	const char *kind = sl_torch_save(head, len);

	if (kind)
		return sl__err(SLUICE_EFORMAT, "%s: %s, not safetensors: read it with torch.load(path, weights_only=True), "
					       "then sluice.save the state dict to load it with sluice", path, kind);
	return sl__err(SLUICE_EFORMAT, "%s: %s", path, why);
}

/* The length field: 0 and the header's length in *n, or SLUICE_EFORMAT naming path. */
static int sl_length(const char *head, size_t len, uint64_t file_size, const char *path, uint64_t *n)
{
	char why[128];

	if (len < 8 || file_size < 8)
		return sl_not_st(path, head, len, "not a safetensors file (shorter than 8 bytes)");
	*n = sl__le64(head);
	if (*n > SL_ST_HEADER_MAX) {
		snprintf(why, sizeof(why), "not a safetensors file (a header of %llu bytes, more than the %llu a header may "
			 "hold)", (unsigned long long)*n, (unsigned long long)SL_ST_HEADER_MAX);
		return sl_not_st(path, head, len, why);
	}
	if (*n > file_size - 8) {
		snprintf(why, sizeof(why), "not a safetensors file (a header of %llu bytes in a file of %llu)",
			 (unsigned long long)*n, (unsigned long long)file_size);
		return sl_not_st(path, head, len, why);
	}
	if (len < 8 + *n)
		return sl__err(SLUICE_EFORMAT, "%s: header cut short (%zu of %llu bytes)", path, len - 8,
			       (unsigned long long)*n);
	return 0;
}

/* The header's n bytes as a JSON object, no deeper than serde_json reads, its __metadata__ strings; or NULL. */
static json_t *sl_document(const char *json, uint64_t n, const char *path, int *rc)
{
	json_error_t jerr;
	json_t *root = json_loadb(json, n, JSON_REJECT_DUPLICATES, &jerr), *meta, *s;
	const char *k;

	*rc = 0;
	if (!root)
		*rc = sl__err(SLUICE_EFORMAT, "%s: header is not JSON (%s, at byte %d)", path, jerr.text, jerr.position);
	else if (!json_is_object(root))
		*rc = sl__err(SLUICE_EFORMAT, "%s: header is not a JSON object", path);
	else if (sl_depth(root) > SL_ST_DEPTH_MAX)
		*rc = sl__err(SLUICE_EFORMAT, "%s: header is not JSON safetensors reads (nested deeper than %d levels, "
					      "serde_json's limit)", path, SL_ST_DEPTH_MAX);
	else if ((meta = json_object_get(root, "__metadata__"))) {
		if (!json_is_object(meta))
			*rc = sl__err(SLUICE_EFORMAT, "%s: __metadata__ is not an object of strings", path);
		json_object_foreach(meta, k, s)
			if (!*rc && !json_is_string(s))
				*rc = sl__err(SLUICE_EFORMAT, "%s: __metadata__ is not an object of strings", path);
	}
	if (*rc && root) {
		json_decref(root);
		root = NULL;
	}
	return root;
}

/* Every tensor's entry of root into out->t. */
static int sl_entries(json_t *root, const char *path, struct sl__st_header *out)
{
	const char *name;
	json_t *v;
	int rc = 0;

	if (!(out->t = calloc(json_object_size(root) + 1, sizeof(*out->t))))
		return -ENOMEM;
	json_object_foreach(root, name, v) {
		if (rc)
			break;
		if (!strcmp(name, "__metadata__"))
			continue;
		if (!(out->t[out->n].name = strdup(name)))
			rc = -ENOMEM;
		else
			rc = sl_entry(path, name, v, &out->t[out->n]);
		out->n++;
	}
	return rc;
}

/* The tensors, in offset order, tile the data's bytes: no overlap, no gap, none past the end, nothing after. */
static int sl_tiling(const struct sl__st_header *h, uint64_t data, const char *path)
{
	uint64_t at = 0;

	for (size_t i = 0; i < h->n; i++) {
		const struct sl__st_tensor *t = &h->t[i];

		if (t->begin < at)
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' starts at %llu: it overlaps the one before", path,
				       t->name, (unsigned long long)t->begin);
		if (t->begin > at)
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' starts at %llu: a gap of %llu bytes before it", path,
				       t->name, (unsigned long long)t->begin, (unsigned long long)(t->begin - at));
		if (t->end > data)
			return sl__err(SLUICE_EFORMAT, "%s: tensor '%s' ends at %llu, past the %llu data bytes in the file",
				       path, t->name, (unsigned long long)t->end, (unsigned long long)data);
		at = t->end;
	}
	if (at != data)
		return sl__err(SLUICE_EFORMAT, "%s: the tensors end at %llu of %llu data bytes (trailing bytes)", path,
			       (unsigned long long)at, (unsigned long long)data);
	return 0;
}

int sl__st_parse(const char *head, size_t len, uint64_t file_size, const char *path, struct sl__st_header *out)
{
	uint64_t n = 0;
	json_t *root;
	int rc;

	memset(out, 0, sizeof(*out));
	if ((rc = sl_length(head, len, file_size, path, &n)) || !(root = sl_document(head + 8, n, path, &rc)))
		return rc;
	rc = sl_entries(root, path, out);
	json_decref(root);
	out->data_start = 8 + n;
	if (!rc) {
		qsort(out->t, out->n, sizeof(*out->t), sl_by_begin);
		rc = sl_tiling(out, file_size - 8 - n, path);
	}
	if (rc)
		sl__st_free(out);
	return rc;
}

/* ---- model.safetensors.index.json ---- */

/* A name an index may give for a file beside it: no separator, no dot segment, no '%' (a web server decodes it),
 * no control character. */
static int sl_plain(const char *n)
{
	if (!*n || !strcmp(n, ".") || !strcmp(n, "..") || strpbrk(n, "/\\?#%"))
		return 0;
	for (; *n; n++)
		if ((unsigned char)*n < 32)
			return 0;
	return 1;
}

static int sl_by_string(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether v is null or an object: an index's optional metadata. */
static int sl_object_or_null(json_t *v)
{
	return !v || json_is_object(v) || json_is_null(v);
}

long sl__st_index_find(const struct sl__st_index *ix, const char *name)
{
	char **hit = bsearch(&name, ix->names, ix->n, sizeof(*ix->names), sl_by_string);

	return hit ? (long)(hit - ix->names) : -1;
}

static long sl_file_find(const struct sl__st_index *ix, const char *name)
{
	char **hit = bsearch(&name, ix->files, ix->nfiles, sizeof(*ix->files), sl_by_string);

	return hit ? (long)(hit - ix->files) : -1;
}

/* The weight_map's names and files into ix (checked: strings, plain file names). */
static int sl_index_entries(json_t *wm, const char *path, struct sl__st_index *ix)
{
	size_t n = json_object_size(wm), u = 0;
	const char *k;
	json_t *f;

	if (!(ix->names = calloc(n, sizeof(*ix->names))) || !(ix->file = calloc(n, sizeof(*ix->file))) ||
	    !(ix->files = calloc(n, sizeof(*ix->files))))
		return -ENOMEM;
	json_object_foreach(wm, k, f) {
		if (!json_is_string(f) || !sl_plain(json_string_value(f)))
			return sl__err(SLUICE_EFORMAT, "%s: weight_map names %s for tensor '%s', not a file beside the index",
				       path, json_is_string(f) ? json_string_value(f) : "no file name", k);
		if (!(ix->names[ix->n] = strdup(k)))
			return -ENOMEM;
		ix->n++;
		if (!(ix->files[ix->nfiles] = strdup(json_string_value(f))))
			return -ENOMEM;
		ix->nfiles++;
	}
	/* The files, sorted, each once; then each name's, the names sorted. */
	qsort(ix->files, ix->nfiles, sizeof(*ix->files), sl_by_string);
	for (size_t i = 0; i < ix->nfiles; i++) {
		if (u && !strcmp(ix->files[u - 1], ix->files[i])) {
			free(ix->files[i]);
			continue;
		}
		ix->files[u++] = ix->files[i];
	}
	ix->nfiles = u;
	qsort(ix->names, ix->n, sizeof(*ix->names), sl_by_string);
	for (size_t i = 0; i < ix->n; i++)
		ix->file[i] = (unsigned)sl_file_find(ix, json_string_value(json_object_get(wm, ix->names[i])));
	return 0;
}

int sl__st_index_parse(const char *raw, size_t len, const char *path, struct sl__st_index *out)
{
	json_error_t jerr;
	json_t *doc, *wm;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (!(doc = json_loadb(raw, len, JSON_REJECT_DUPLICATES, &jerr)))
		return sl__err(SLUICE_EFORMAT, "%s: not a safetensors index: not JSON (%s)", path, jerr.text);
	wm = json_object_get(doc, "weight_map");
	if (!json_is_object(doc) || !json_is_object(wm))
		rc = sl__err(SLUICE_EFORMAT, "%s: not a safetensors index: no weight_map object", path);
	else if (!sl_object_or_null(json_object_get(doc, "metadata")))
		rc = sl__err(SLUICE_EFORMAT, "%s: not a safetensors index: its metadata is not an object", path);
	else if (!json_object_size(wm))
		rc = sl__err(SLUICE_EFORMAT, "%s: names no tensor (its weight_map is empty)", path);
	else
		rc = sl_index_entries(wm, path, out);
	json_decref(doc);
	if (rc)
		sl__st_index_free(out);
	return rc;
}

void sl__st_index_free(struct sl__st_index *ix)
{
	for (size_t i = 0; ix->names && i < ix->n; i++)
		free(ix->names[i]);
	for (size_t i = 0; ix->files && i < ix->nfiles; i++)
		free(ix->files[i]);
	free(ix->names);
	free(ix->file);
	free(ix->files);
	memset(ix, 0, sizeof(*ix));
}
