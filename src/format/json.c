/*
 * JSON lines into records, for `sluice pack --from-jsonl`.  Parsing is
 * jansson's; this maps chosen top-level keys to fields:
 *   string -> bytes (UTF-8)      integer -> i64      real -> f64
 *   true/false -> u8 (1/0)       array of integers -> i64[*]
 *   array of numbers with a real -> f32[*]           anything else -> bytes of its JSON text
 * The first line fixes the schema; later lines must agree, except that a
 * bytes field takes any value (non-strings as their JSON text, kept as
 * written: 0.1 stays 0.1), an f64 field takes integers and an f32[*] field
 * arrays of integers.  A number past its type's range (float64 for a
 * scalar, float32 for an f32[*] element) is refused, never stored as inf.
 * Strings may hold NUL (\u0000).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "format/format.h"

/* What a JSON value becomes, from the value alone. */
static void sl_json_kind(json_t *v, struct sluice_field *f)
{
	size_t i;
	json_t *e;
	int ints = 1, nums = 1;

	f->ndim = 0;
	f->shape[0] = 0;
	if (json_is_string(v)) {
		f->dtype = SLUICE_DTYPE_BYTES;
	} else if (json_is_integer(v)) {
		f->dtype = SLUICE_DTYPE_I64;
	} else if (json_is_real(v)) {
		f->dtype = SLUICE_DTYPE_F64;
	} else if (json_is_boolean(v)) {
		f->dtype = SLUICE_DTYPE_U8;
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, e) {
			ints &= json_is_integer(e);
			nums &= json_is_number(e);
		}
		if (nums) {
			f->dtype = ints ? SLUICE_DTYPE_I64 : SLUICE_DTYPE_F32;
			f->ndim = 1;
			f->shape[0] = -1;
		} else {
			f->dtype = SLUICE_DTYPE_BYTES;
		}
	} else {
		f->dtype = SLUICE_DTYPE_BYTES; /* objects: their JSON text */
	}
}

/* Parses one line that must hold a JSON object; the caller json_decref()s it. */
static int sl_json_object(const char *line, size_t len, json_t **out)
{
	json_error_t err;
	json_t *root = json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);

	*out = NULL;
	if (!root)
		return sl__err(SLUICE_EFORMAT, "invalid JSON at column %d: %s", err.column, err.text);
	if (!json_is_object(root)) {
		json_decref(root);
		return sl__err(SLUICE_EFORMAT, "line is not a JSON object");
	}
	*out = root;
	return 0;
}

int sl__json_schema(const char *line, size_t len, const char *const *names, unsigned n,
		       struct sluice_field *out)
{
	json_t *root;
	int rc = sl_json_object(line, len, &root);

	for (unsigned i = 0; i < n && !rc; i++) {
		json_t *v = json_object_get(root, names[i]);

		if (!v || json_is_null(v))
			rc = sl__err(SLUICE_EFORMAT, "field '%s' is missing or null", names[i]);
		else {
			sl_json_kind(v, &out[i]);
			out[i].name = names[i];
			/* Fix an empty first array as i64[*]; later reals then fail clearly. */
			if (json_is_array(v) && !json_array_size(v))
				out[i].dtype = SLUICE_DTYPE_I64, out[i].ndim = 1, out[i].shape[0] = -1;
		}
	}
	json_decref(root);
	return rc ? rc : sl__schema_check(out, n);
}

/* The index just past the JSON string that starts at p[i] ('"'). */
static size_t sl_skip_string(const char *p, size_t len, size_t i)
{
	for (i++; i < len; i++) {
		if (p[i] == '\\')
			i++;
		else if (p[i] == '"')
			return i + 1;
	}
	return len;
}

static int sl_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The index just past the JSON value that starts at p[i] (valid JSON: jansson parsed it). */
static size_t sl_skip_value(const char *p, size_t len, size_t i)
{
	int depth = 0;

	while (i < len) {
		char c = p[i];

		if (c == '"') {
			i = sl_skip_string(p, len, i);
			if (!depth)
				return i;
			continue;
		}
		if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (!depth)
				return i;
			if (!--depth)
				return i + 1;
		} else if (!depth && (c == ',' || sl_ws(c))) {
			return i;
		}
		i++;
	}
	return i;
}

/*
 * The text of the top-level key name's value in the JSON object line, as
 * written (the last one where a key repeats, as jansson keeps): 0 and
 * [*off, *off + *n), or -1.  Keys are compared decoded.
 */
static int sl_json_raw(const char *p, size_t len, const char *name, size_t *off, size_t *n)
{
	size_t i = 0;
	int found = -1;

	while (i < len && sl_ws(p[i]))
		i++;
	if (i >= len || p[i++] != '{')
		return -1;
	for (;;) {
		size_t ks, ke, vs, ve;
		json_t *k;

		while (i < len && sl_ws(p[i]))
			i++;
		if (i >= len || p[i] != '"')
			break;
		ks = i;
		ke = i = sl_skip_string(p, len, i);
		while (i < len && (sl_ws(p[i]) || p[i] == ':'))
			i++;
		vs = i;
		ve = i = sl_skip_value(p, len, i);
		k = json_loadb(p + ks, ke - ks, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
		if (k && json_is_string(k) && json_string_length(k) == strlen(name) && !strcmp(json_string_value(k), name))
			*off = vs, *n = ve - vs, found = 0;
		json_decref(k);
		while (i < len && sl_ws(p[i]))
			i++;
		if (i >= len || p[i] != ',')
			break;
		i++;
	}
	return found;
}

/*
 * Converts one line into values for fields f[0..n); the bytes live in
 * *scratch (grown as needed, caller frees).  Returns 0 or SLUICE_EFORMAT.
 */
/*
 * Whether value v fits field f: a bytes field takes any value (strings as
 * they are, the rest as JSON text); typed fields take their own kind,
 * where an integer array fits a float array, an empty array any array
 * field, and an integer a real.  0 or SLUICE_EFORMAT naming the field.
 */
static int sl_json_fits(const struct sluice_field *f, json_t *v)
{
	struct sluice_field got;

	if (!v || json_is_null(v))
		return sl__err(SLUICE_EFORMAT, "field '%s' is missing or null", f->name);
	sl_json_kind(v, &got);
	if (f->dtype != SLUICE_DTYPE_BYTES && (got.dtype != f->dtype || got.ndim != f->ndim) &&
	    !(json_is_array(v) && f->ndim == 1 && (got.dtype == SLUICE_DTYPE_I64 || !json_array_size(v))) &&
	    !(f->dtype == SLUICE_DTYPE_F64 && !f->ndim && json_is_integer(v)))
		return sl__err(SLUICE_EFORMAT, "field '%s' is %s%s here, %s%s on the first line", f->name,
			       sluice_dtype_name(got.dtype), got.ndim ? "[]" : "", sluice_dtype_name(f->dtype),
			       f->ndim ? "[]" : "");
	/*
	 * A number must keep its magnitude in the field's type, as jansson
	 * refuses one past float64's for a scalar: an f32[*] element past
	 * float32's range would be stored as inf.
	 */
	for (size_t k = 0; f->dtype == SLUICE_DTYPE_F32 && k < json_array_size(v); k++) {
		double d = json_number_value(json_array_get(v, k));

		if (isinf((float)d))
			return sl__err(SLUICE_EFORMAT, "field '%s' element %zu: %g is past float32's range (+-%g)",
				       f->name, k, d, (double)FLT_MAX);
	}
	return 0;
}

/* A scalar field's bytes into s; their count. */
static size_t sl_json_scalar(const struct sluice_field *f, json_t *v, void *s)
{
	int64_t i = json_integer_value(v);
	double d = json_number_value(v);
	uint8_t b = json_is_true(v);

	if (f->dtype == SLUICE_DTYPE_I64)
		memcpy(s, &i, 8);
	else if (f->dtype == SLUICE_DTYPE_F64)
		memcpy(s, &d, 8);
	else
		memcpy(s, &b, 1);
	return f->dtype == SLUICE_DTYPE_I64 || f->dtype == SLUICE_DTYPE_F64 ? 8 : 1;
}

/* An array field's elements (i64, or f32) into dst. */
static void sl_json_array(const struct sluice_field *f, json_t *v, unsigned char *dst)
{
	size_t k;
	json_t *e;

	json_array_foreach(v, k, e) {
		if (f->dtype == SLUICE_DTYPE_I64) {
			int64_t x = json_integer_value(e);

			memcpy(dst + 8 * k, &x, 8);
		} else {
			float x = (float)json_number_value(e);

			memcpy(dst + 4 * k, &x, 4);
		}
	}
}

int sl__json_values(const struct sluice_field *f, unsigned n, const char *line, size_t len, unsigned char **scratch,
		    size_t *cap, const void **vals, size_t *lens)
{
	size_t used = 0, offs[SLUICE_MAX_FIELDS];
	json_t *root;
	int rc = sl_json_object(line, len, &root);

	for (unsigned i = 0; i < n && !rc; i++) {
		json_t *v = json_object_get(root, f[i].name);
		char *text = NULL, scalar[8];
		const void *src = NULL;
		size_t need = 0, at = 0, l = 0;

		if ((rc = sl_json_fits(&f[i], v)))
			break;
		if (f[i].dtype == SLUICE_DTYPE_BYTES && json_is_string(v))
			src = json_string_value(v), need = json_string_length(v);
		else if (f[i].dtype == SLUICE_DTYPE_BYTES && !sl_json_raw(line, len, f[i].name, &at, &l))
			src = line + at, need = l; /* numbers, objects: their text as written */
		else if (f[i].dtype == SLUICE_DTYPE_BYTES && (text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)))
			src = text, need = strlen(text);
		else if (f[i].dtype == SLUICE_DTYPE_BYTES)
			rc = -ENOMEM;
		else if (f[i].ndim == 0)
			src = scalar, need = sl_json_scalar(&f[i], v, scalar);
		else
			need = json_array_size(v) * sluice_dtype_size(f[i].dtype);
		if (!rc && used + need + 8 > *cap && sl__reserve(scratch, cap, (used + need + 8) * 2))
			rc = -ENOMEM;
		if (!rc) {
			offs[i] = used;
			if (src)
				memcpy(*scratch + used, src, need);
			else
				sl_json_array(&f[i], v, *scratch + used);
			lens[i] = need;
			used = (used + need + 7) & ~(size_t)7;
		}
		free(text);
	}
	json_decref(root);
	/* Pointers only now: the scratch buffer may have moved while growing. */
	for (unsigned i = 0; !rc && i < n; i++)
		vals[i] = *scratch + offs[i];
	return rc;
}

int sl__lines_next(struct sl__lines *r, const char **line, size_t *len)
{
	if (!r->buf) {
		r->cap = r->max < (64u << 10) ? r->max + 1 : 64u << 10;
		if (!(r->buf = malloc(r->cap)))
			return sl__err(-ENOMEM, "no memory for a line buffer");
	}
	for (;;) {
		char *nl = memchr(r->buf + r->scan, '\n', r->end - r->scan);
		size_t n, want;

		if (nl || (r->eof && r->end > r->start)) {
			n = (nl ? (size_t)(nl - r->buf) : r->end) - r->start;
			r->lineno++;
			if (n > r->max)
				break;
			*line = r->buf + r->start;
			*len = n;
			r->start = r->scan = nl ? (size_t)(nl - r->buf) + 1 : r->end;
			return 1;
		}
		if (r->eof)
			return 0;
		if (r->end - r->start > r->max) {
			r->lineno++;
			break;
		}
		/* Room for more: what is unread to the front, the buffer grown up to max + 1 bytes of one line. */
		memmove(r->buf, r->buf + r->start, r->end - r->start);
		r->end -= r->start;
		r->scan = r->end;
		r->start = 0;
		want = 2 * r->cap;
		if (want > r->max + 1)
			want = r->max + 1;
		if (r->end == r->cap && want > r->cap) {
			char *t = realloc(r->buf, want);

			if (!t) {
				r->lineno++;
				return sl__err(-ENOMEM, "no memory to hold %zu bytes of the line", want);
			}
			r->buf = t;
			r->cap = want;
		}
		n = fread(r->buf + r->end, 1, r->cap - r->end, r->f);
		if (!n && ferror(r->f)) {
			int e = errno ? errno : EIO;

			r->lineno++;
			return sl__err(-e, "%s", strerror(e));
		}
		r->eof = !n;
		r->end += n;
	}
	return sl__err(SLUICE_EFORMAT, "a line longer than %zu bytes (SLUICE_MAX_RECORD); a JSON lines file holds "
		       "one record a line", r->max);
}

void sl__lines_free(struct sl__lines *r)
{
	free(r->buf);
	r->buf = NULL;
}
