/*
 * Arrow IPC, as far as LitData's row footers need it (format.h): the
 * flat tables pa.Table.from_pylist makes of a chunk's samples, written
 * as an IPC file ("ARROW1", its stream, a footer) or, by older LitData, a
 * stream.  The stream's messages are walked in order (a file's footer
 * lists the same record batches); each message's flatbuffer is read by
 * the small reader below, every offset of it bounded by the bytes given.
 *
 * Columns of numbers (Int of 8 to 64 bits but uint64, FloatingPoint),
 * Bool, Utf8/Binary and their Large forms are read; any other type, a
 * dictionary-encoded or nested column, big-endian data and LZ4 buffers
 * are refused naming the column or the codec.  ZSTD buffers (LitData's
 * ipc_compression) are decompressed, each bounded by the length it
 * declares.  A column with a null in it is refused naming the row:
 * sluice has no null value.
 *
 * A batch's rows are laid out, for the dataset's records, as LitData's
 * own items are: every column's u32 size, then every column's bytes (a
 * bool as one byte, 0 or 1).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "format/format.h"

/* ---- flatbuffers: tables, vectors, strings; every read bounded ---- */

struct sl_fb {
	const unsigned char *p;
	size_t n;
};

static int sl_fb_has(const struct sl_fb *b, size_t at, size_t len)
{
	return at <= b->n && len <= b->n - at;
}

static uint32_t sl_rd32(const unsigned char *p)
{
	return sl__le32(p);
}

/* The table at t: 1 with its vtable (*vt, *vtn bytes) where it lies inside b, else 0. */
static int sl_fb_table(const struct sl_fb *b, size_t t, size_t *vt, size_t *vtn)
{
	int64_t at;

	if (!sl_fb_has(b, t, 4))
		return 0;
	at = (int64_t)t - (int32_t)sl_rd32(b->p + t);
	if (at < 0 || !sl_fb_has(b, (size_t)at, 4))
		return 0;
	*vt = (size_t)at;
	*vtn = (size_t)(b->p[at] | b->p[at + 1] << 8);
	return *vtn >= 4 && !(*vtn & 1) && sl_fb_has(b, *vt, *vtn);
}

/* Where field id of table t lies (size bytes of it inside b), or 0 where it is absent or does not fit. */
static size_t sl_fb_field(const struct sl_fb *b, size_t t, unsigned id, size_t size)
{
	size_t vt, vtn, off;

	if (!sl_fb_table(b, t, &vt, &vtn) || 4 + 2 * (size_t)id + 2 > vtn)
		return 0;
	off = (size_t)(b->p[vt + 4 + 2 * id] | b->p[vt + 5 + 2 * id] << 8);
	return off && sl_fb_has(b, t + off, size) ? t + off : 0;
}

static int64_t sl_fb_int(const struct sl_fb *b, size_t t, unsigned id, size_t size, int64_t dflt)
{
	size_t at = sl_fb_field(b, t, id, size);

	if (!at)
		return dflt;
	switch (size) {
	case 1:
		return b->p[at];
	case 2:
		return (int16_t)(b->p[at] | b->p[at + 1] << 8);
	case 4:
		return (int32_t)sl_rd32(b->p + at);
	default:
		return (int64_t)sl__le64(b->p + at);
	}
}

/* What field id of t refers to (a table, vector or string): its position, or 0. */
static size_t sl_fb_ref(const struct sl_fb *b, size_t t, unsigned id)
{
	size_t at = sl_fb_field(b, t, id, 4), to;

	if (!at)
		return 0;
	to = at + sl_rd32(b->p + at);
	return to > at && sl_fb_has(b, to, 4) ? to : 0;
}

/* A vector at v of elements of esize bytes: its count, its first element at *first; -1 where it does not fit. */
static int64_t sl_fb_vec(const struct sl_fb *b, size_t v, size_t esize, size_t *first)
{
	uint32_t n;

	if (!v || !sl_fb_has(b, v, 4))
		return -1;
	n = sl_rd32(b->p + v);
	*first = v + 4;
	return (uint64_t)n <= (b->n - *first) / (esize ? esize : 1) ? (int64_t)n : -1;
}

/* ---- Arrow's schema and record batches ---- */

enum { SL_MSG_SCHEMA = 1, SL_MSG_DICTIONARY = 2, SL_MSG_BATCH = 3 };
enum { SL_T_NULL = 1, SL_T_INT = 2, SL_T_FLOAT = 3, SL_T_BINARY = 4, SL_T_UTF8 = 5, SL_T_BOOL = 6,
       SL_T_LARGE_BINARY = 19, SL_T_LARGE_UTF8 = 20 };

static const char *const sl_type_names[] = {
	"NONE", "null", "int", "float", "binary", "string", "bool", "decimal", "date", "time", "timestamp",
	"interval", "list", "struct", "union", "fixed_size_binary", "fixed_size_list", "map", "duration",
	"large_binary", "large_string", "large_list", "run_end_encoded", "binary_view", "string_view", "list_view",
	"large_list_view",
};

/* Column c of the schema's Field table f; SLUICE_EFORMAT naming it where sluice has no field for it. */
static int sl_arrow_col(const struct sl_fb *b, size_t f, unsigned c, struct sl__acol *col, const char *name)
{
	size_t s = sl_fb_ref(b, f, 0), first, ty = sl_fb_ref(b, f, 3), kids = sl_fb_ref(b, f, 5);
	int64_t ns = s ? sl_fb_vec(b, s, 1, &first) : -1, nk = kids ? sl_fb_vec(b, kids, 4, &first) : 0;
	unsigned type = (unsigned)sl_fb_int(b, f, 2, 1, 0);
	const char *tn = type < sizeof(sl_type_names) / sizeof(sl_type_names[0]) ? sl_type_names[type] : "unknown";

	memset(col, 0, sizeof(*col));
	if (ns < 0 || (size_t)ns >= sizeof(col->name) || memchr(b->p + s + 4, 0, (size_t)ns))
		return sl__err(SLUICE_EFORMAT, "%s: column %u: its name", name, c);
	memcpy(col->name, b->p + s + 4, (size_t)ns);
	if (sl_fb_ref(b, f, 4))
		return sl__err(SLUICE_EFORMAT, "%s: column '%s' is dictionary-encoded, which sluice does not read", name,
			       col->name);
	if (nk < 0 || (nk > 0 && type != 12 && type != 13 && type != 16 && type != 17 && type != 21))
		return sl__err(SLUICE_EFORMAT, "%s: column '%s': its children", name, col->name);
	switch (type) {
	case SL_T_INT: {
		int64_t bits = ty ? sl_fb_int(b, ty, 0, 4, 0) : 0, sign = ty ? sl_fb_int(b, ty, 1, 1, 0) : 0;
		static const enum sluice_dtype s8[] = { SLUICE_DTYPE_I8, SLUICE_DTYPE_I16, SLUICE_DTYPE_I32, SLUICE_DTYPE_I64 };
		static const enum sluice_dtype u8[] = { SLUICE_DTYPE_U8, SLUICE_DTYPE_U16, SLUICE_DTYPE_U32 };
		int k = bits == 8 ? 0 : bits == 16 ? 1 : bits == 32 ? 2 : bits == 64 ? 3 : -1;

		if (k < 0 || (!sign && k == 3))
			return sl__err(SLUICE_EFORMAT, "%s: column '%s': %s%lld, which sluice has no type for", name,
				       col->name, sign ? "int" : "uint", (long long)bits);
		col->dtype = sign ? s8[k] : u8[k];
		col->kind = SL_ACOL_FIXED;
		break;
	}
	case SL_T_FLOAT: {
		int64_t prec = ty ? sl_fb_int(b, ty, 0, 2, 0) : -1;

		if (prec < 0 || prec > 2)
			return sl__err(SLUICE_EFORMAT, "%s: column '%s': a float of precision %lld", name, col->name,
				       (long long)prec);
		col->dtype = prec == 0 ? SLUICE_DTYPE_F16 : prec == 1 ? SLUICE_DTYPE_F32 : SLUICE_DTYPE_F64;
		col->kind = SL_ACOL_FIXED;
		break;
	}
	case SL_T_BOOL:
		col->dtype = SLUICE_DTYPE_U8;
		col->kind = SL_ACOL_BOOL;
		break;
	case SL_T_BINARY:
	case SL_T_UTF8:
	case SL_T_LARGE_BINARY:
	case SL_T_LARGE_UTF8:
		col->dtype = SLUICE_DTYPE_BYTES;
		col->kind = type >= SL_T_LARGE_BINARY ? SL_ACOL_VAR64 : SL_ACOL_VAR32;
		break;
	case SL_T_NULL:
		return sl__err(SLUICE_EFORMAT, "%s: column '%s' holds only nulls (LitData's None), which sluice has no "
			       "value for", name, col->name);
	default:
		return sl__err(SLUICE_EFORMAT, "%s: column '%s' is of Arrow type %s; sluice reads rows of numbers, bools, "
			       "strings and bytes (a sample that is one flat dict of them)", name, col->name, tn);
	}
	col->width = col->kind == SL_ACOL_FIXED ? (unsigned)sluice_dtype_size(col->dtype) : col->kind == SL_ACOL_BOOL;
	return 0;
}

static int sl_arrow_schema(const struct sl_fb *b, size_t sch, struct sl__arrow *a, const char *name)
{
	size_t fs = sl_fb_ref(b, sch, 1), first;
	int64_t n = fs ? sl_fb_vec(b, fs, 4, &first) : -1;
	int rc = 0;

	if (sl_fb_int(b, sch, 0, 2, 0) != 0)
		return sl__err(SLUICE_EFORMAT, "%s: a big-endian Arrow table", name);
	if (n < 1 || n > SLUICE_MAX_FIELDS)
		return sl__err(SLUICE_EFORMAT, "%s: an Arrow table of %lld columns (1 to %u)", name, (long long)n,
			       SLUICE_MAX_FIELDS);
	if (!(a->col = calloc((size_t)n, sizeof(*a->col))))
		return -ENOMEM;
	a->ncols = (unsigned)n;
	for (unsigned c = 0; !rc && c < a->ncols; c++) {
		size_t at = first + 4 * (size_t)c, f = at + sl_rd32(b->p + at);

		rc = f > at && sl_fb_has(b, f, 4) ? sl_arrow_col(b, f, c, &a->col[c], name)
						  : sl__err(SLUICE_EFORMAT, "%s: column %u of its schema", name, c);
	}
	return rc;
}

/* The buffers one column of kind k has in a record batch: validity and values, or validity, offsets and data. */
static unsigned sl_nbufs(int kind)
{
	return kind == SL_ACOL_VAR32 || kind == SL_ACOL_VAR64 ? 3 : 2;
}

static int sl_arrow_batch(const struct sl_fb *b, size_t rb, uint64_t body, uint64_t body_len, struct sl__arrow *a,
			  const char *name)
{
	size_t nodes_at = 0, bufs_at = 0, comp = sl_fb_ref(b, rb, 3);
	int64_t rows = sl_fb_int(b, rb, 0, 8, -1);
	int64_t nn = sl_fb_vec(b, sl_fb_ref(b, rb, 1), 16, &nodes_at), nb = sl_fb_vec(b, sl_fb_ref(b, rb, 2), 16, &bufs_at);
	unsigned want = 0, k = 0;
	struct sl__abatch *ab;
	int codec = comp ? (int)sl_fb_int(b, comp, 0, 1, 0) : -1;

	for (unsigned c = 0; c < a->ncols; c++)
		want += sl_nbufs(a->col[c].kind);
	if (rows < 0 || rows > UINT32_MAX || nn != (int64_t)a->ncols || nb != (int64_t)want)
		return sl__err(SLUICE_EFORMAT, "%s: record batch %llu: %lld rows, %lld nodes and %lld buffers for %u "
			       "columns", name, (unsigned long long)a->nbatches, (long long)rows, (long long)nn,
			       (long long)nb, a->ncols);
	if (comp && codec != 1)
		return sl__err(SLUICE_EFORMAT, "%s: Arrow buffers compressed with %s; sluice reads uncompressed and zstd "
			       "ones (LitData's compression=\"zstd\")", name, codec == 0 ? "LZ4" : "an unknown codec");
	if (sl__reserve(&a->b, &a->cap, (size_t)(a->nbatches + 1) * sizeof(*a->b)))
		return -ENOMEM;
	ab = &a->b[a->nbatches];
	*ab = (struct sl__abatch){ body, body_len, (uint64_t)rows, a->rows, NULL, 0, comp ? SL_ACODEC_ZSTD : SL_ACODEC_NONE };
	if (!(ab->buf = calloc(want, sizeof(*ab->buf))))
		return -ENOMEM;
	a->nbatches++; /* freed with the rest from here on */
	for (unsigned c = 0; c < a->ncols; c++) {
		int64_t len = (int64_t)sl__le64(b->p + nodes_at + 16 * c), nulls = (int64_t)sl__le64(b->p + nodes_at + 16 * c + 8);

		if (len != rows || nulls < 0 || nulls > rows)
			return sl__err(SLUICE_EFORMAT, "%s: record batch %llu, column '%s': %lld values, %lld nulls in %lld "
				       "rows", name, (unsigned long long)a->nbatches - 1, a->col[c].name, (long long)len,
				       (long long)nulls, (long long)rows);
		ab->nulls |= (uint64_t)(nulls != 0) << c;
		for (unsigned j = 0; j < sl_nbufs(a->col[c].kind); j++, k++) {
			uint64_t off = sl__le64(b->p + bufs_at + 16 * k), l = sl__le64(b->p + bufs_at + 16 * k + 8);

			if (off > body_len || l > body_len - off)
				return sl__err(SLUICE_EFORMAT, "%s: record batch %llu, column '%s': a buffer outside its body",
					       name, (unsigned long long)a->nbatches - 1, a->col[c].name);
			ab->buf[k] = (struct sl__abuf){ off, l };
		}
	}
	a->rows += (uint64_t)rows;
	return 0;
}

int sl__arrow_parse(const unsigned char *p, size_t n, uint64_t base, struct sl__arrow *a, const char *name)
{
	struct sl_fb b = { p, n };
	size_t at = n >= 8 && !memcmp(p, "ARROW1\0\0", 8) ? 8 : 0;
	int rc = 0, schema = 0;

	memset(a, 0, sizeof(*a));
	while (!rc) {
		size_t meta, mlen, msg;
		uint64_t blen, body;
		unsigned type;

		if (!sl_fb_has(&b, at, 4)) {
			rc = sl__err(SLUICE_EFORMAT, "%s: its Arrow stream ends without its end marker", name);
			break;
		}
		if (sl_rd32(p + at) == 0xffffffffu) { /* the continuation marker, then the length (Arrow 0.15 on) */
			at += 4;
			if (!sl_fb_has(&b, at, 4)) {
				rc = sl__err(SLUICE_EFORMAT, "%s: its Arrow stream is cut short", name);
				break;
			}
		}
		mlen = sl_rd32(p + at);
		meta = at + 4;
		if (!mlen)
			break; /* end of stream */
		if (mlen > INT32_MAX || !sl_fb_has(&b, meta, mlen) || mlen < 8) {
			rc = sl__err(SLUICE_EFORMAT, "%s: an Arrow message of %zu bytes at %zu runs past its %zu", name, mlen,
				     at, n);
			break;
		}
		/* The message's own flatbuffer: offsets inside it, never into what follows. */
		struct sl_fb m = { p + meta, mlen };

		msg = sl_rd32(m.p);
		type = (unsigned)sl_fb_int(&m, msg, 1, 1, 0);
		blen = (uint64_t)sl_fb_int(&m, msg, 3, 8, 0);
		body = meta + mlen;
		if (!sl_fb_table(&m, msg, &(size_t){ 0 }, &(size_t){ 0 }) || sl_fb_int(&m, msg, 0, 2, 0) < 3 ||
		    (int64_t)blen < 0 || blen > n - body) {
			rc = sl__err(SLUICE_EFORMAT, "%s: an Arrow message at %zu: its header or its body's length", name, at);
			break;
		}
		if (type == SL_MSG_SCHEMA && !schema) {
			size_t s = sl_fb_ref(&m, msg, 2);

			rc = s ? sl_arrow_schema(&m, s, a, name) : sl__err(SLUICE_EFORMAT, "%s: its schema", name);
			schema = 1;
		} else if (type == SL_MSG_BATCH && schema) {
			size_t r = sl_fb_ref(&m, msg, 2);

			rc = r ? sl_arrow_batch(&m, r, base + body, blen, a, name)
			       : sl__err(SLUICE_EFORMAT, "%s: record batch %llu's header", name, (unsigned long long)a->nbatches);
		} else {
			rc = sl__err(SLUICE_EFORMAT, "%s: an Arrow message of type %u where %s", name, type,
				     schema ? "record batches belong (dictionaries are not read)" : "its schema belongs");
		}
		at = (size_t)(body + blen);
	}
	if (!rc && !schema)
		rc = sl__err(SLUICE_EFORMAT, "%s: an Arrow stream without a schema", name);
	if (rc)
		sl__arrow_free(a);
	return rc;
}

void sl__arrow_free(struct sl__arrow *a)
{
	for (uint64_t k = 0; a->b && k < a->nbatches; k++)
		free(a->b[k].buf);
	free(a->b);
	free(a->col);
	memset(a, 0, sizeof(*a));
}

/* ---- a batch's buffers, decompressed where they are, and its rows ---- */

/*
 * Buffer j of batch ab (its body's bytes at body) as it holds values:
 * itself, or, compressed, decoded into a malloc'd *own (the caller frees
 * it).  An Arrow compressed buffer is its decoded length (i64; -1: left
 * uncompressed) then a zstd frame of exactly that many bytes.
 */
static int sl_abuf(const struct sl__arrow *a, const struct sl__abatch *ab, unsigned j, const unsigned char *body,
		   const unsigned char **out, uint64_t *len, unsigned char **own, const char *name)
{
	const struct sl__abuf *f = &ab->buf[j];
	int64_t want;
	size_t got;

	*own = NULL;
	*out = body + f->off;
	*len = f->len;
	(void)a;
	if (ab->codec == SL_ACODEC_NONE || !f->len)
		return 0;
	if (f->len < 8)
		return sl__err(SLUICE_EFORMAT, "%s: a compressed Arrow buffer of %llu bytes", name,
			       (unsigned long long)f->len);
	want = (int64_t)sl__le64(*out);
	*out += 8;
	*len -= 8;
	if (want == -1)
		return 0;
	if (want < 0 || (uint64_t)want > SL_ARROW_BUF_MAX)
		return sl__err(SLUICE_EFORMAT, "%s: a compressed Arrow buffer says it holds %lld bytes (at most %llu)", name,
			       (long long)want, (unsigned long long)SL_ARROW_BUF_MAX);
	if (!(*own = malloc(want ? (size_t)want : 1)))
		return -ENOMEM;
	got = ZSTD_decompress(*own, (size_t)want, *out, (size_t)*len);
	if (ZSTD_isError(got) || got != (size_t)want) {
		free(*own);
		*own = NULL;
		return sl__err(SLUICE_EFORMAT, "%s: a zstd Arrow buffer: %s", name,
			       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "of another length than it says");
	}
	*out = *own;
	*len = (uint64_t)want;
	return 0;
}

/*
 * Column c's buffers of batch ab: its values (or a variable column's
 * offsets) in *v, a variable column's data in *d; every value of its rows
 * inside them (offsets rising, inside the data), and no null among them
 * (the first named).  What it decompressed is in own[], for sl_cols_free.
 */
struct sl_acols {
	const unsigned char *v, *d;
	uint64_t vlen, dlen;
	unsigned char *own[3];
};

static void sl_cols_free(struct sl_acols *x, unsigned n)
{
	for (unsigned c = 0; c < n; c++)
		for (int j = 0; j < 3; j++)
			free(x[c].own[j]);
}

static uint64_t sl_off(const struct sl__acol *col, const unsigned char *v, uint64_t r)
{
	return col->kind == SL_ACOL_VAR64 ? sl__le64(v + 8 * r) : sl__le32(v + 4 * r);
}

static int sl_acol(const struct sl__arrow *a, const struct sl__abatch *ab, unsigned c, unsigned j0,
		   const unsigned char *body, struct sl_acols *x, const char *name)
{
	const struct sl__acol *col = &a->col[c];
	uint64_t rows = ab->rows, ow = col->kind == SL_ACOL_VAR64 ? 8 : 4, prev = 0, vl;
	const unsigned char *valid;
	int rc;

	if (ab->nulls >> c & 1) { /* the first null named: sluice has no value for it */
		if ((rc = sl_abuf(a, ab, j0, body, &valid, &vl, &x->own[0], name)))
			return rc;
		for (uint64_t r = 0; r < rows; r++)
			if (r / 8 >= vl || !(valid[r / 8] >> (r % 8) & 1))
				return sl__err(SLUICE_EFORMAT, "%s: row %llu: column '%s' is null (LitData's None), which "
					       "sluice has no value for", name, (unsigned long long)(ab->first + r), col->name);
	}
	if ((rc = sl_abuf(a, ab, j0 + 1, body, &x->v, &x->vlen, &x->own[1], name)))
		return rc;
	if (col->kind == SL_ACOL_FIXED || col->kind == SL_ACOL_BOOL) {
		uint64_t need = col->kind == SL_ACOL_BOOL ? (rows + 7) / 8 : rows * col->width;

		return x->vlen < need ? sl__err(SLUICE_EFORMAT, "%s: column '%s': %llu bytes of values for %llu rows", name,
						col->name, (unsigned long long)x->vlen, (unsigned long long)rows) : 0;
	}
	if ((rc = sl_abuf(a, ab, j0 + 2, body, &x->d, &x->dlen, &x->own[2], name)))
		return rc;
	if (x->vlen / ow < rows + 1)
		return sl__err(SLUICE_EFORMAT, "%s: column '%s': %llu bytes of offsets for %llu rows", name, col->name,
			       (unsigned long long)x->vlen, (unsigned long long)rows);
	for (uint64_t r = 0; r <= rows; r++) {
		uint64_t o = sl_off(col, x->v, r);

		if (o > x->dlen || (r && (o < prev || o - prev > UINT32_MAX)))
			return sl__err(SLUICE_EFORMAT, "%s: row %llu: column '%s': its offsets out of order or past its "
				       "%llu bytes", name, (unsigned long long)(ab->first + (r ? r - 1 : 0)), col->name,
				       (unsigned long long)x->dlen);
		prev = o;
	}
	return 0;
}

/* Every column's buffers of batch ab, checked (sl_acol); x holds a->ncols of them. */
static int sl_acols(const struct sl__arrow *a, const struct sl__abatch *ab, const unsigned char *body,
		    struct sl_acols *x, const char *name)
{
	int rc = 0;

	memset(x, 0, a->ncols * sizeof(*x)); /* what a failure frees: none past the column at fault */
	for (unsigned c = 0, j = 0; !rc && c < a->ncols; j += sl_nbufs(a->col[c].kind), c++)
		rc = sl_acol(a, ab, c, j, body, &x[c], name);
	if (rc)
		sl_cols_free(x, a->ncols);
	return rc;
}

/* Column c's bytes in row r. */
static uint64_t sl_val_len(const struct sl__arrow *a, const struct sl_acols *x, unsigned c, uint64_t r)
{
	return a->col[c].kind == SL_ACOL_VAR32 || a->col[c].kind == SL_ACOL_VAR64
		       ? sl_off(&a->col[c], x[c].v, r + 1) - sl_off(&a->col[c], x[c].v, r)
		       : a->col[c].width;
}

/* Row r's length as laid out: every column's u32 size, then every column's bytes. */
static uint64_t sl_row_len(const struct sl__arrow *a, const struct sl_acols *x, uint64_t r)
{
	uint64_t len = 4 * (uint64_t)a->ncols;

	for (unsigned c = 0; c < a->ncols; c++)
		len += sl_val_len(a, x, c, r);
	return len;
}

int sl__arrow_rows_len(const struct sl__arrow *a, uint64_t k, const unsigned char *body, uint64_t *off,
		       const char *name)
{
	const struct sl__abatch *ab = &a->b[k];
	struct sl_acols x[SLUICE_MAX_FIELDS];
	int rc = sl_acols(a, ab, body, x, name), held = !rc;

	for (uint64_t r = 0; !rc && r < ab->rows; r++) {
		uint64_t len = sl_row_len(a, x, r);

		if (len > UINT32_MAX)
			rc = sl__err(SLUICE_EFORMAT, "%s: row %llu: %llu bytes (sluice reads records under 4 GiB)", name,
				     (unsigned long long)(ab->first + r), (unsigned long long)len);
		off[r + 1] = off[r] + len;
	}
	if (held)
		sl_cols_free(x, a->ncols);
	return rc;
}

int sl__arrow_rows(const struct sl__arrow *a, uint64_t k, const unsigned char *body, const uint64_t *off,
		   unsigned char *dst, const char *name)
{
	const struct sl__abatch *ab = &a->b[k];
	struct sl_acols x[SLUICE_MAX_FIELDS];
	int rc = sl_acols(a, ab, body, x, name), held = !rc;
	unsigned char *o = dst;

	for (uint64_t r = 0; !rc && r < ab->rows; r++) {
		/* The bytes read now are checked against the open's sizes: a file changed since is no wrong record. */
		if (sl_row_len(a, x, r) != off[r + 1] - off[r]) {
			rc = sl__err(SLUICE_EFORMAT, "%s: row %llu is not the size it was when the dataset opened", name,
				     (unsigned long long)(ab->first + r));
			break;
		}
		for (unsigned c = 0; c < a->ncols; c++, o += 4)
			sl__put32(o, (uint32_t)sl_val_len(a, x, c, r));
		for (unsigned c = 0; c < a->ncols; c++) {
			const struct sl__acol *col = &a->col[c];

			if (col->kind == SL_ACOL_BOOL) {
				*o++ = x[c].v[r / 8] >> (r % 8) & 1;
			} else if (col->kind == SL_ACOL_FIXED) {
				memcpy(o, x[c].v + r * col->width, col->width);
				o += col->width;
			} else {
				uint64_t b0 = sl_off(col, x[c].v, r), n = sl_off(col, x[c].v, r + 1) - b0;

				memcpy(o, x[c].d + b0, (size_t)n);
				o += n;
			}
		}
	}
	if (held)
		sl_cols_free(x, a->ncols);
	return rc;
}
