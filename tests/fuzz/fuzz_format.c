/*
 * libFuzzer target: every decoder of dataset files (docs/FORMAT.md).
 * The input is taken as an index file, a Megatron .idx, a WebDataset tar
 * a WebDataset sidecar index, JSON lines (split into lines under a small
 * SLUICE_MAX_RECORD, and the first two converted) and a .npy header; if it parses, the bytes after the
 * index header are also decoded as records of its schema.  The input is
 * also parsed as a shard header, as a record of a fixed schema, as a
 * safetensors file (its header), as a sharded checkpoint's index (every
 * tensor's file one of its files, each a plain name, names found by search),
 * as a sluice.dcp checkpoint's .metadata (checked whole, or refused), as a TFRecord file (every record it
 * accepts lies inside the input, after its header, in order), and as an
 * MDS shard or LitData chunk (offsets rising inside the input), a sample
 * of columns laid out by its first bytes (every column inside it), and an
 * Arrow IPC table (a LitData row footer: batches inside it, rows laid out
 * exactly).
 * Properties: no crash or sanitizer report; decoded fields lie inside
 * the input.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/format.h"

static void check_record(const struct sluice_field *f, unsigned n, const uint8_t *p, size_t len)
{
	struct sluice_record rec;

	if (sl__record_decode(f, n, p, len, &rec) == 0)
		for (unsigned i = 0; i < n; i++)
			if ((const uint8_t *)rec.data[i] < p || (const uint8_t *)rec.data[i] + rec.len[i] > p + len)
				abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct sluice_field fixed[3] = {
		{ "tokens", SLUICE_DTYPE_U16, 1, { -1 } },
		{ "label", SLUICE_DTYPE_I64, 0, { 0 } },
		{ "img", SLUICE_DTYPE_F32, 2, { 2, 3 } },
	};
	struct sl__index ix;
	struct sl__shard_hdr sh;
	struct sl__st_header st;

	/* As an MDS shard or LitData chunk, and as one sample of up to 8 columns its first bytes describe. */
	if (size >= 4 && sl__le32(data) < (1u << 20)) {
		uint32_t *off = malloc(((size_t)sl__le32(data) + 1) * sizeof(uint32_t));

		if (off && sl__offsets_parse(data, size, off) == 0)
			for (uint32_t k = 0; k <= sl__le32(data); k++)
				if (off[k] > size || (k && off[k] < off[k - 1]))
					abort();
		free(off);
	}
	if (size >= 9) {
		struct sl__cols cols = { .n = 1 + data[0] % 8 };
		const void *cd[SLUICE_MAX_FIELDS];
		size_t cl[SLUICE_MAX_FIELDS];
		unsigned bad;

		for (unsigned c = 0; c < cols.n; c++) {
			cols.size[c] = data[1 + c] & 1 ? data[1 + c] >> 1 : 0;
			cols.unit[c] = 1u << (data[1 + c] >> 6);
		}
		if (sl__cols_split(&cols, data + 9, size - 9, cd, cl, &bad) == 0)
			for (unsigned c = 0; c < cols.n; c++)
				if ((const uint8_t *)cd[c] < data + 9 || (const uint8_t *)cd[c] + cl[c] > data + size)
					abort();
	}
	/*
	 * As an Arrow IPC file or stream (a LitData row footer): every record
	 * batch it accepts lies inside the input, and one whose rows check out
	 * lays them out into exactly the bytes their lengths say.
	 */
	{
		struct sl__arrow a;

		if (sl__arrow_parse(data, size, 0, &a, "fuzz") == 0) {
			for (uint64_t k = 0; k < a.nbatches; k++) {
				const struct sl__abatch *ab = &a.b[k];
				uint64_t *off;

				if (ab->body > size || ab->body_len > size - ab->body)
					abort();
				if (ab->rows > (1u << 20) || !(off = calloc(ab->rows + 1, sizeof(uint64_t))))
					continue;
				if (sl__arrow_rows_len(&a, k, data + ab->body, off, "fuzz") == 0 && off[ab->rows] < (1u << 26)) {
					unsigned char *dst = malloc(off[ab->rows] + 1);

					if (dst && sl__arrow_rows(&a, k, data + ab->body, off, dst, "fuzz") != 0)
						abort();
					free(dst);
				}
				free(off);
			}
			sl__arrow_free(&a);
		}
	}
	/* As a TFRecord file. */
	{
		struct sl__tfr_rec *tr = NULL;
		uint64_t ntr = 0;

		if (sl__tfr_scan(data, size, "fuzz", &tr, &ntr) == 0)
			for (uint64_t k = 0; k < ntr; k++)
				if (tr[k].off < 12 || tr[k].off + tr[k].len + 4 > size || (k && tr[k].off <= tr[k - 1].off))
					abort();
		free(tr);
	}
	/* As a safetensors file: every tensor it accepts lies inside the file's data, in order, without overlap. */
	if (sl__st_parse((const char *)data, size, size, "fuzz", &st) == 0) {
		uint64_t at = 0;

		for (size_t i = 0; i < st.n; i++) {
			if (st.t[i].begin != at || st.t[i].end < st.t[i].begin || st.data_start + st.t[i].end > size)
				abort();
			at = st.t[i].end;
		}
		sl__st_free(&st);
	}

	/* As a sluice.dcp .metadata: a document, or an error. */
	json_t *dcp = NULL;

	if (sl__dcp_meta_parse((const char *)data, size, "fuzz", &dcp) == 0 && !json_is_object(dcp))
		abort();
	json_decref(dcp);
	/* As a model.safetensors.index.json: each tensor placed in one of its files, each file a plain name. */
	struct sl__st_index sx;

	if (sl__st_index_parse((const char *)data, size, "fuzz", &sx) == 0) {
		for (size_t i = 0; i < sx.n; i++)
			if (sx.file[i] >= sx.nfiles || strchr(sx.files[sx.file[i]], '/') || sl__st_index_find(&sx, sx.names[i]) != (long)i)
				abort();
		sl__st_index_free(&sx);
	}

	if (sl__index_parse(data, size, size, &ix) == 0) {
		if (ix.entries_off > size || ix.nfields > SLUICE_MAX_FIELDS)
			abort();
		check_record(ix.fields, ix.nfields, data + ix.entries_off, size - ix.entries_off);
		sl__index_free(&ix);
	}
	/* As a shard header, and what follows its first 64 bytes as its block table. */
	if (sl__shard_header_parse(data, size, &sh) == 0 && sh.flags && size > 64 && sh.nblocks <= (size - 64) / SL_BLOCK_ENTRY) {
		struct sl__block *b = malloc(sizeof(*b) * sh.nblocks + 1);

		if (b && sl__blocks_parse(data + 64, size - 64, &sh, b) == 0)
			for (uint64_t k = 0; k < sh.nblocks; k++)
				if (b[k].file + b[k].stored > sh.table_off || b[k].logical + b[k].len > SL_HDR_SIZE + sh.data_len)
					abort();
		free(b);
	}
	/* As a Megatron .idx: every array it accepts must lie inside the input. */
	struct sl__mmidx mm;

	if (sl__mmidx_parse(data, size, &mm) == 0) {
		volatile uint64_t sum = 0;

		if (mm.docs_off + 8 * mm.ndoc > size || mm.pointers_off + 8 * mm.nseq > size)
			abort();
		for (uint64_t i = 0; i < mm.nseq; i++)
			sum += sl__le32(data + mm.lengths_off + 4 * i) + sl__le64(data + mm.pointers_off + 8 * i);
		for (uint64_t d = 0; d < mm.ndoc; d++)
			sum += sl__le64(data + mm.docs_off + 8 * d);
		(void)sum;
	}
	check_record(fixed, 3, data, size);
	/* As a WebDataset tar (libarchive underneath) and as its sidecar index. */
	unsigned char *img = NULL;
	size_t img_len = 0;
	char keys[SLUICE_MAX_FIELDS][256];
	unsigned nkeys;
	uint64_t nsamp;
	size_t eoff;

	uint32_t skipped;

	if (sl__wds_scan_mem(data, size, &img, &img_len) == 0) {
		/* What the scanner writes, the parser must accept. */
		struct sl__wds_stamp stamp = { .size = size };

		if (sl__wds_parse(img, img_len, &stamp, &nkeys, keys, &nsamp, &eoff, &skipped) != 0)
			abort();
		free(img);
	}
	if (size >= 64) {
		/* A sidecar image as found on disk, its stamp taken from itself so that parsing goes on. */
		struct sl__wds_stamp stamp = { sl__le64(data + 16), sl__le64(data + 24), sl__le64(data + 40),
					       sl__le64(data + 48), sl__le32(data + 56) };

		(void)sl__wds_parse(data, size, &stamp, &nkeys, keys, &nsamp, &eoff, &skipped);
	}

	/* As a .npy header. */
	enum sluice_dtype nd;
	uint64_t ncount, noff;

	if (sl__npy_parse(data, size, &nd, &ncount, &noff) == 0 && (noff > size || !sluice_dtype_name(nd)))
		abort();

	/* As a stream of lines under a small limit: every line whole, none longer, the end reached or refused. */
	FILE *mf = size ? fmemopen((void *)data, size, "r") : NULL;

	if (mf) {
		struct sl__lines lr = { .f = mf, .max = 64 };
		const char *ln;
		size_t ll, total = 0;
		int got;

		while ((got = sl__lines_next(&lr, &ln, &ll)) == 1) {
			if (ll > lr.max || ln < lr.buf || ln + ll > lr.buf + lr.cap || memchr(ln, '\n', ll))
				abort();
			total += ll + 1;
		}
		if ((got == 0 && total < size) || lr.cap > lr.max + 1)
			abort();
		sl__lines_free(&lr);
		fclose(mf);
	}
	/* As a shard list with braces: bounded however it nests, every name no longer than the pattern allows. */
	if (size < 256) {
		char pat[256], **names;
		unsigned nn;

		memcpy(pat, data, size);
		pat[size] = 0;
		if (sl__brace_expand(pat, 1000, &names, &nn) == 0) {
			if (nn < 1 || nn > 1000)
				abort();
			for (unsigned i = 0; i < nn; i++)
				free(names[i]);
			free(names);
		}
	}
	/* As JSON lines: the first line fixes a schema, the rest must convert or be refused. */
	static const char *const names[3] = { "text", "label", "tokens" };
	const uint8_t *nl = memchr(data, '\n', size);
	struct sluice_field f[3];

	if (nl && sl__json_schema((const char *)data, (size_t)(nl - data), names, 3, f) == 0) {
		unsigned char *scratch = NULL;
		size_t cap = 0, lens[3];
		const void *vals[3];

		if (sl__json_values(f, 3, (const char *)nl + 1, size - (size_t)(nl - data) - 1, &scratch, &cap, vals,
				    lens) == 0)
			for (int i = 0; i < 3; i++)
				if ((const unsigned char *)vals[i] < scratch || (const unsigned char *)vals[i] + lens[i] > scratch + cap)
					abort();
		free(scratch);
	}
	return 0;
}
