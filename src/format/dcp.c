/*
 * The metadata of a checkpoint sluice.dcp's StorageWriter writes (.metadata): a notice that stops
 * torch's own reader (a pickle's GLOBAL opcode naming a module no one has), then JSON:
 *
 *   {"format": "sluice-dcp", "version": 1,
 *    "tensors": {fqn: {"dtype" (torch's name), "size", "requires_grad", "layout", "memory_format",
 *                      "pin_memory", "chunks": [{"offsets", "sizes"}]}},
 *    "bytes": [fqn],
 *    "items": [{"fqn", "offset" (a chunk's offsets, or null for bytes), "index", "file", "name", "at", "length"}],
 *    "planner_data": {fqn: [key, ...]} or null, "storage_meta": {"checkpoint_id", "save_id"} or null}
 *
 * checked whole here, for the Python reader (sluice.dcp) and the C one (xfer/ckpt.c) alike: every chunk
 * inside its tensor, every chunk and bytes item stored once, each item's length its chunk's, each item under
 * the name the writer gives it (fqn, or fqn@O1,O2,...) once in its file, and every file of one save.  What
 * each item's file holds at its place is checked against the file's header by the reader.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format.h"

#define SL_DCP_HEAD "cthis is a checkpoint of sluice"
#define SL_DCP_TAIL "\nStorageReader\n"
#define SL_DCP_NOTICE_MAX 4096u

static int sl_bad(const char *path, const char *why, const char *a, const char *b)
{
	return sl__err(SLUICE_EFORMAT, "%s: damaged metadata (%s%s%s)", path, why, a ? a : "", b ? b : "");
}

/* An array of non-negative integers (of n of them, unless n is -1). */
static int sl_ints(json_t *v, long n)
{
	size_t i;
	json_t *x;

	if (!json_is_array(v) || (n >= 0 && json_array_size(v) != (size_t)n))
		return 0;
	json_array_foreach(v, i, x)
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return 0;
	return 1;
}

static int sl_is_one_of(json_t *v, const char *const *names)
{
	for (; json_is_string(v) && *names; names++)
		if (!strcmp(json_string_value(v), *names))
			return 1;
	return 0;
}

/* "[0, 2]" of an array of integers, as Python writes a list (for messages). */
static const char *sl_list(json_t *v, char *buf, size_t cap)
{
	size_t at = 0, i;
	json_t *x;

	at += (size_t)snprintf(buf, cap, "[");
	json_array_foreach(v, i, x)
		if (at < cap)
			at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)json_integer_value(x));
	if (at < cap)
		snprintf(buf + at, cap - at, "]");
	return buf;
}

/* The bytes of one element of torch's dtype name (float4_e2m1fn_x2: two values in one byte), or 0: none. */
static unsigned sl_element(json_t *dtype)
{
	int d = json_is_string(dtype) ? sl__st_dtype_find(json_string_value(dtype), 1) : -1;

	return d < 0 ? 0 : sl__st_dtypes[d].bits >= 8 ? sl__st_dtypes[d].bits / 8 : 1;
}

/* A tensor's description, its chunks inside its size. */
static int sl_tensor(const char *path, const char *fqn, json_t *t)
{
	static const char *const layouts[] = { "strided", NULL };
	static const char *const formats[] = { "contiguous_format", "channels_last", "channels_last_3d",
					       "preserve_format", NULL };
	json_t *size = json_object_get(t, "size"), *c;
	size_t i;

	if (!json_is_object(t) || !sl_element(json_object_get(t, "dtype")) || !sl_ints(size, -1) ||
	    !sl_is_one_of(json_object_get(t, "layout"), layouts) ||
	    !sl_is_one_of(json_object_get(t, "memory_format"), formats) ||
	    !json_is_boolean(json_object_get(t, "requires_grad")) || !json_is_boolean(json_object_get(t, "pin_memory")) ||
	    !json_is_array(json_object_get(t, "chunks")))
		return sl_bad(path, "tensor '", fqn, "': not a tensor's description");
	json_array_foreach(json_object_get(t, "chunks"), i, c) {
		json_t *off = json_object_get(c, "offsets"), *sz = json_object_get(c, "sizes");
		int ok = json_is_object(c) && sl_ints(off, (long)json_array_size(size)) &&
			 sl_ints(sz, (long)json_array_size(size));

		for (size_t d = 0; ok && d < json_array_size(size); d++) {
			json_int_t o = json_integer_value(json_array_get(off, d)), n = json_integer_value(json_array_get(sz, d)),
				   s = json_integer_value(json_array_get(size, d));

			ok = n <= s && o <= s - n;
		}
		if (!ok)
			return sl_bad(path, "tensor '", fqn, "': a chunk outside its size");
	}
	return 0;
}

/* An item or a chunk as sorted: its fqn and offsets (NULL: bytes), where it is in the list; a chunk's object. */
struct sl_item {
	const char *fqn;
	json_t *off;
	size_t at;
	json_t *chunk;
};

static int sl_by_item(const void *a, const void *b)
{
	const struct sl_item *x = a, *y = b;
	int c = strcmp(x->fqn, y->fqn);

	if (c || !x->off || !y->off)
		return c ? c : (x->off != NULL) - (y->off != NULL);
	if (json_array_size(x->off) != json_array_size(y->off))
		return json_array_size(x->off) < json_array_size(y->off) ? -1 : 1;
	for (size_t i = 0; i < json_array_size(x->off); i++) {
		json_int_t p = json_integer_value(json_array_get(x->off, i)), q = json_integer_value(json_array_get(y->off, i));

		if (p != q)
			return p < q ? -1 : 1;
	}
	return 0;
}

static int sl_by_string(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The name the writer gives an item in its file: fqn, or fqn@O1,O2,... (malloc'ed). */
static char *sl_own_name(const char *fqn, json_t *off)
{
	size_t cap = strlen(fqn) + 2 + 21 * json_array_size(off), at;
	char *s = malloc(cap);
	size_t i;
	json_t *x;

	if (!s)
		return NULL;
	at = (size_t)snprintf(s, cap, "%s%s", fqn, off ? "@" : "");
	json_array_foreach(off, i, x)
		at += (size_t)snprintf(s + at, cap - at, "%s%lld", i ? "," : "", (long long)json_integer_value(x));
	return s;
}

/* A rank's file name as the writer gives it: __RANK_SAVE.safetensors, SAVE 12 hex digits; the mark's start. */
static const char *sl_save_mark(const char *n)
{
	size_t len = strlen(n), i = 2;

	if (len < 2 + 1 + 1 + 12 + 12 || strncmp(n, "__", 2) || strcmp(n + len - 12, ".safetensors"))
		return NULL;
	while (n[i] >= '0' && n[i] <= '9')
		i++;
	if (i == 2 || n[i] != '_' || len - i - 1 != 12 + 12)
		return NULL;
	for (size_t j = i + 1; j < i + 13; j++)
		if (!strchr("0123456789abcdef", n[j]))
			return NULL;
	return n + i + 1;
}

/* One item's fields. */
static int sl_item_fields(const char *path, json_t *it)
{
	json_t *index = json_object_get(it, "index"), *at = json_object_get(it, "at"), *len = json_object_get(it, "length");
	const char *file = json_string_value(json_object_get(it, "file"));

	if (!json_is_object(it) || !json_is_string(json_object_get(it, "fqn")) || !json_is_string(json_object_get(it, "name")) ||
	    !file || !sl_save_mark(file) || !json_is_integer(at) || !json_is_integer(len) || json_integer_value(at) < 0 ||
	    json_integer_value(len) < 0 || !(!index || json_is_null(index) || json_is_integer(index)))
		return sl_bad(path, "an item that is not one: ", file ? file : "no file", NULL);
	return 0;
}

/* A chunk item's length against its chunk (of tensor t, found among the n sorted chunks), or none. */
static int sl_item_chunk(const char *path, json_t *it, json_t *t, const struct sl_item *chunks, size_t n_chunks)
{
	json_t *off = json_object_get(it, "offset"), *c, *sz;
	const char *fqn = json_string_value(json_object_get(it, "fqn"));
	struct sl_item key = { fqn, off, 0, NULL };
	const struct sl_item *hit = sl_ints(off, -1) ? bsearch(&key, chunks, n_chunks, sizeof(*chunks), sl_by_item) : NULL;
	uint64_t n = sl_element(json_object_get(t, "dtype")), s;
	char where[256], why[256];
	size_t i;

	if (!hit) {
		snprintf(why, sizeof(why), "' at %s: no such chunk of a tensor",
			 sl_ints(off, -1) ? sl_list(off, where, sizeof(where)) : "offsets that are none");
		return sl_bad(path, "item '", fqn, why);
	}
	sz = json_object_get(hit->chunk, "sizes");
	json_array_foreach(sz, i, c) {
		if (__builtin_mul_overflow(n, (uint64_t)json_integer_value(c), &s))
			s = UINT64_MAX;
		n = n == UINT64_MAX && s ? UINT64_MAX : s;
	}
	if ((uint64_t)json_integer_value(json_object_get(it, "length")) != n) {
		char sizes[256];

		snprintf(why, sizeof(why), "' at %s: %lld bytes, its chunk %s of %s makes %llu",
			 sl_list(off, where, sizeof(where)), (long long)json_integer_value(json_object_get(it, "length")),
			 sl_list(sz, sizes, sizeof(sizes)), json_string_value(json_object_get(t, "dtype")),
			 (unsigned long long)n);
		return sl_bad(path, "item '", fqn, why);
	}
	return 0;
}

/* Items against the tensors and bytes: each stored once, each a chunk or bytes of the checkpoint, all stored. */
static int sl_items(const char *path, json_t *doc, struct sl_item *keys)
{
	json_t *tensors = json_object_get(doc, "tensors"), *items = json_object_get(doc, "items"),
	       *blobs = json_object_get(doc, "bytes"), *it, *t, *c, *b;
	size_t n = json_array_size(items), nb = json_array_size(blobs), nc = 0, i, j;
	const char **names = calloc(nb + 1, sizeof(*names)), *k;
	char *dup = calloc(n + 1, 1);
	struct sl_item *chunks;
	int rc;

	json_object_foreach(tensors, k, t)
		nc += json_array_size(json_object_get(t, "chunks"));
	chunks = calloc(nc + 1, sizeof(*chunks));
	rc = names && dup && chunks ? 0 : -ENOMEM;
	nc = 0;
	json_object_foreach(tensors, k, t)
		json_array_foreach(json_object_get(t, "chunks"), j, c)
			if (chunks)
				chunks[nc++] = (struct sl_item){ k, json_object_get(c, "offsets"), 0, c };
	json_array_foreach(blobs, i, b)
		if (names)
			names[i] = json_string_value(b);
	if (!rc) {
		qsort(names, nb, sizeof(*names), sl_by_string);
		qsort(chunks, nc, sizeof(*chunks), sl_by_item);
		qsort(keys, n, sizeof(*keys), sl_by_item);
		for (i = 1; i < n; i++)
			if (!sl_by_item(&keys[i - 1], &keys[i]))
				dup[keys[i - 1].at > keys[i].at ? keys[i - 1].at : keys[i].at] = 1;
	}
	json_array_foreach(items, i, it) {
		const char *fqn = json_string_value(json_object_get(it, "fqn"));
		json_t *off = json_object_get(it, "offset");

		if (rc)
			break;
		if (dup[i])
			rc = sl_bad(path, "item '", fqn, "' stored twice");
		else if (!off || json_is_null(off)) {
			if (!bsearch(&fqn, names, nb, sizeof(*names), sl_by_string))
				rc = sl_bad(path, "item '", fqn, "': not one of the checkpoint's tensors or bytes");
		} else
			rc = sl_item_chunk(path, it, json_object_get(tensors, fqn), chunks, nc);
	}
	/* Every chunk and every bytes item stored (the items are unique and each is one of them). */
	for (i = 0; !rc && i < nc; i++)
		if (!bsearch(&chunks[i], keys, n, sizeof(*keys), sl_by_item))
			rc = sl_bad(path, "no item stores '", chunks[i].fqn, "'");
	for (i = 0; !rc && i < nb; i++) {
		struct sl_item key = { names[i], NULL, 0, NULL };

		if (!bsearch(&key, keys, n, sizeof(*keys), sl_by_item))
			rc = sl_bad(path, "no item stores '", names[i], "'");
	}
	free(names);
	free(dup);
	free(chunks);
	return rc;
}

/*
 * Each item under its own name, once in its file, in files of one save: that of save_id where it is one of the
 * writer's (12 or more hex digits).  So no edit of the metadata alone loads an item from bytes written for another.
 */
static int sl_stored(const char *path, json_t *items, json_t *save_id)
{
	size_t n = json_array_size(items), i;
	char **seen = calloc(n + 1, sizeof(*seen));
	const char *mark = NULL, *first = NULL, *sid = json_string_value(save_id);
	json_t *it;
	int rc = seen ? 0 : -ENOMEM;
	char why[512];

	json_array_foreach(items, i, it) {
		const char *file = json_string_value(json_object_get(it, "file")),
			   *name = json_string_value(json_object_get(it, "name"));
		json_t *off = json_object_get(it, "offset");
		char *own;

		if (rc)
			break;
		if (!(own = sl_own_name(json_string_value(json_object_get(it, "fqn")), json_is_null(off) ? NULL : off)))
			rc = -ENOMEM;
		else if (strcmp(name, own)) {
			snprintf(why, sizeof(why), "' is stored as '%s' of %s, another item's name", name, file);
			rc = sl_bad(path, "item '", own, why);
		} else if (!mark || !strncmp(mark, sl_save_mark(file), 12)) {
			mark = mark ? mark : sl_save_mark(file);
			first = first ? first : file;
		} else {
			rc = sl__err(SLUICE_EFORMAT, "%s: damaged metadata (items stored in files of 2 saves (%s and %s))", path,
				     first, file);
		}
		/* "file/name" once: two items of one name in a file (bytes "v@0" beside tensor v's chunk at [0]). */
		if (!rc) {
			size_t cap = strlen(file) + strlen(own) + 2;

			if ((seen[i] = malloc(cap)))
				snprintf(seen[i], cap, "%s/%s", file, own);
			else
				rc = -ENOMEM;
		}
		free(own);
	}
	if (!rc) {
		qsort(seen, n, sizeof(*seen), sl_by_string);
		for (i = 1; !rc && i < n; i++)
			if (!strcmp(seen[i - 1], seen[i])) {
				char *slash = strchr(seen[i], '/');

				*slash = 0;
				rc = sl__err(SLUICE_EFORMAT, "%s: damaged metadata (two items are stored as '%s' of %s)", path,
					     slash + 1, seen[i]);
			}
	}
	if (!rc && mark && sid && strlen(sid) >= 12 && strspn(sid, "0123456789abcdef") == strlen(sid) &&
	    strncmp(sid, mark, 12))
		rc = sl__err(SLUICE_EFORMAT, "%s: damaged metadata (items stored in %s, a file of another save than %s's)", path,
			     first, sid);
	for (i = 0; i < n; i++)
		free(seen[i]);
	free(seen);
	return rc;
}

/* planner_data: null, or {fqn: [key, ...]} of strings and integers; storage_meta: null or strings. */
static int sl_extras(const char *path, json_t *doc)
{
	json_t *pd = json_object_get(doc, "planner_data"), *sm = json_object_get(doc, "storage_meta"), *v, *x;
	const char *k;
	size_t i;

	json_object_foreach(sm, k, v)
		if (!json_is_null(v) && !json_is_string(v))
			return sl_bad(path, "storage_meta is not an object of strings", NULL, NULL);
	if (sm && !json_is_null(sm) && !json_is_object(sm))
		return sl_bad(path, "storage_meta is not an object of strings", NULL, NULL);
	if (pd && !json_is_null(pd) && !json_is_object(pd))
		return sl_bad(path, "planner_data is not an object of key paths", NULL, NULL);
	json_object_foreach(pd, k, v) {
		if (!json_is_array(v))
			return sl_bad(path, "planner_data is not an object of key paths", NULL, NULL);
		json_array_foreach(v, i, x)
			if (!json_is_string(x) && !json_is_integer(x))
				return sl_bad(path, "planner_data is not an object of key paths", NULL, NULL);
	}
	return 0;
}

/* The document's parts: tensors, bytes apart from them, items' fields; the keys of the items for sl_items. */
static int sl_parts(const char *path, json_t *doc, struct sl_item **keys)
{
	json_t *tensors = json_object_get(doc, "tensors"), *blobs = json_object_get(doc, "bytes"),
	       *items = json_object_get(doc, "items"), *v;
	const char *k;
	size_t i;
	int rc;

	if (!json_is_object(tensors) || !json_is_array(blobs) || !json_is_array(items))
		return sl_bad(path, "tensors, bytes or items missing", NULL, NULL);
	json_array_foreach(blobs, i, v)
		if (!json_is_string(v) || json_object_get(tensors, json_string_value(v)))
			return sl_bad(path, "bytes is not a list of names apart from the tensors'", NULL, NULL);
	json_object_foreach(tensors, k, v)
		if ((rc = sl_tensor(path, k, v)))
			return rc;
	if (!(*keys = calloc(json_array_size(items) + 1, sizeof(**keys))))
		return -ENOMEM;
	json_array_foreach(items, i, v) {
		json_t *off;

		if ((rc = sl_item_fields(path, v)))
			return rc;
		off = json_object_get(v, "offset");
		(*keys)[i] = (struct sl_item){ json_string_value(json_object_get(v, "fqn")),
					       !off || json_is_null(off) ? NULL : off, i, NULL };
	}
	return 0;
}

int sl__dcp_meta_parse(const char *raw, size_t len, const char *path, struct json_t **out)
{
	const char *tail = len > strlen(SL_DCP_HEAD) && !memcmp(raw, SL_DCP_HEAD, strlen(SL_DCP_HEAD))
				   ? memmem(raw, len < SL_DCP_NOTICE_MAX ? len : SL_DCP_NOTICE_MAX, SL_DCP_TAIL,
					    strlen(SL_DCP_TAIL))
				   : NULL;
	struct sl_item *keys = NULL;
	json_error_t jerr;
	json_t *doc, *fmt, *ver;
	int rc;

	*out = NULL;
	if (!tail)
		return sl__err(SLUICE_EFORMAT, "%s: not the metadata sluice.dcp's StorageWriter writes (a DCP checkpoint "
					       "of torch's own pickles it: sluice reads it only through sluice.dcp)", path);
	tail += strlen(SL_DCP_TAIL);
	if (!(doc = json_loadb(tail, len - (size_t)(tail - raw), JSON_REJECT_DUPLICATES, &jerr)))
		return sl__err(SLUICE_EFORMAT, "%s: damaged metadata (not JSON: %s)", path, jerr.text);
	fmt = json_object_get(doc, "format");
	ver = json_object_get(doc, "version");
	if (!json_is_object(doc) || !json_is_string(fmt) || strcmp(json_string_value(fmt), "sluice-dcp") ||
	    !json_is_integer(ver) || json_integer_value(ver) != 1)
		rc = sl_bad(path, "not sluice-dcp version 1", NULL, NULL);
	else if (!(rc = sl_parts(path, doc, &keys)) && !(rc = sl_items(path, doc, keys)) &&
		 !(rc = sl_extras(path, doc)))
		rc = sl_stored(path, json_object_get(doc, "items"),
			       json_object_get(json_object_get(doc, "storage_meta"), "save_id"));
	free(keys);
	if (rc) {
		json_decref(doc);
		return rc;
	}
	*out = doc;
	return 0;
}
