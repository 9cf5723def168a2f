/*
 * sluice pack: a tree of small files, any dataset sluice reads (WebDataset
 * tars, Megatron .bin/.idx, sluice shards), JSON lines or token arrays into
 * sluice shards: the options of sluice_pack (sluice.h), which does the work.
 * Parquet and Hugging Face datasets go through the Python package's reader
 * (sluice.arrow, over pyarrow), run with SLUICE_PYTHON as `sluice journey` is.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define CMD "pack"

/* Records done so far, on stderr (not with --quiet, nor where stderr is no terminal). */
static void show_progress(uint64_t done, uint64_t total, uint64_t bytes, void *arg)
{
	(void)arg;
	if (total)
		fprintf(stderr, "\rsluice pack: %llu/%llu records, %.1f MB%s", (unsigned long long)done,
			(unsigned long long)total, (double)bytes / 1e6, done == total ? "\n" : "");
	else
		fprintf(stderr, "\rsluice pack: %llu records", (unsigned long long)done);
}

static void print_report(const struct sluice_pack_options *o, const struct sluice_pack_report *r, const char *out,
			 int json)
{
	if (json) {
		printf("{\"records\":%llu,\"documents\":%llu,\"tokens\":%llu,\"dtype\":\"%s\",\"bytes\":%llu,"
		       "\"seconds\":%.3f,\"from_format\":\"%s\",\"labelled\":%s,\"files_per_s\":%.1f,\"packed_context\":%u,"
		       "\"fill\":%.6f}\n",
		       (unsigned long long)r->records, (unsigned long long)r->documents, (unsigned long long)r->tokens,
		       r->dtype, (unsigned long long)r->bytes, r->seconds, r->from_format, r->labelled ? "true" : "false",
		       r->seconds > 0 ? (double)r->records / r->seconds : 0.0, o->pack_context, r->fill);
	} else if (o->source == SLUICE_PACK_DIR) {
		printf("packed %llu files (%.1f MB) from %s into %s in %.2f s (%.0f files/s)\n", (unsigned long long)r->records,
		       (double)r->bytes / 1e6, o->from, out, r->seconds, r->seconds > 0 ? (double)r->records / r->seconds : 0.0);
	} else if (o->source == SLUICE_PACK_JSONL) {
		printf("packed %llu JSON lines from %s into %s\n", (unsigned long long)r->records, o->from, out);
	} else if (o->source == SLUICE_PACK_TOKENS && o->pack_context) {
		printf("packed %llu documents (%llu tokens) into %llu rows of %u in %s: %.2f%% of slots filled (%s)\n",
		       (unsigned long long)r->documents, (unsigned long long)r->tokens, (unsigned long long)r->records,
		       o->pack_context, out, 100.0 * r->fill, o->greedy ? "greedy" : "best-fit decreasing");
	} else if (o->source == SLUICE_PACK_TOKENS) {
		printf("packed %llu documents (%llu %s tokens) into %s\n", (unsigned long long)r->documents,
		       (unsigned long long)r->tokens, r->dtype, out);
	} else {
		printf("packed %llu %s records (%.1f MB) from %s into %s in %.2f s\n", (unsigned long long)r->records,
		       r->from_format, (double)r->bytes / 1e6, o->from, out, r->seconds);
	}
}

/*
 * --from-parquet / --from-hf: sluice.arrow's main(KIND SRC OUT SHARD_SIZE ZSTD BLOCK_SIZE [--json] [--overwrite]),
 * run by cli_python_exec (the current directory off the module path: a numpy.py beside the data does not run).
 */
static int pack_arrow(const char *kind, const char *src, const char *out, uint64_t shard_size, unsigned zstd,
		      uint64_t block_size, int json, int overwrite)
{
	char ss[32], zs[16], bs[32];
	char *args[] = { (char *)kind, (char *)src, (char *)out, ss, zs, bs, NULL, NULL, NULL };
	int n = 6; /* the flags given follow, then NULL */

	if (json)
		args[n++] = "--json";
	if (overwrite)
		args[n++] = "--overwrite";
	snprintf(ss, sizeof(ss), "%llu", (unsigned long long)shard_size);
	snprintf(zs, sizeof(zs), "%u", zstd);
	snprintf(bs, sizeof(bs), "%llu", (unsigned long long)block_size);
	return cli_python_exec(CMD, NULL, "sluice.arrow", args, "sluice and pyarrow", 1);
}

int cmd_pack(int argc, char **argv)
{
	const char *from = NULL, *out = NULL, *from_ds = NULL, *from_jsonl = NULL, *fields_arg = NULL;
	const char *from_tokens = NULL, *doc_lengths = NULL, *dtype_arg = NULL, *from_parquet = NULL, *from_hf = NULL;
	uint64_t shard_size = 0, block_size = 0;
	unsigned threads = 0, zstd = 0, pack_context = 0, greedy = 0;
	int quiet = !isatty(2), json = 0, rc, all_files = 0, follow = 0, overwrite = 0;
	struct sluice_pack_options opt = SLUICE_PACK_OPTIONS_INIT;
	struct sluice_pack_report rep = SLUICE_PACK_REPORT_INIT;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help")) {
			printf("usage: sluice pack (--from-dir DIR | --from DATASET | --from-jsonl FILE --fields K1,K2 |\n"
			       "                    --from-tokens FILE --doc-lengths FILE |\n"
			       "                    --from-parquet FILE|DIR | --from-hf DIR)\n"
			       "                   [--shard-size N] [--zstd LEVEL [--block-size N]] [--threads N] [--overwrite]\n"
			       "                   [--quiet] [--json] OUT\n"
			       "  --overwrite      OUT may hold a sluice dataset, which the new one replaces whole, or\n"
			       "                   not at all: written beside it and swapped in by one rename (a local\n"
			       "                   OUT; a directory of other files is refused, an empty one taken)\n"
			       "  --zstd LEVEL     store shards as zstd blocks (level 1-22) of --block-size uncompressed\n"
			       "                   bytes or more (default and least 1M), whole records each\n"
			       "  --from-jsonl F   one record per JSON line; --fields picks top-level keys: string -> bytes,\n"
			       "                   integer -> i64, real -> f64, bool -> u8, [ints] -> i64[*], [numbers] -> f32[*]\n"
			       "  --from-tokens F --doc-lengths L [--dtype u16|u32] [--pack-context N [--greedy]]\n"
			       "                   token array (.npy, or raw .bin of --dtype) cut into one record per\n"
			       "                   document by L (.npy of integers, or raw .bin of i64); with\n"
			       "                   --pack-context, documents packed into rows of N tokens (best-fit\n"
			       "                   decreasing, or --greedy): input_ids, position_ids, labels, cu_seqlens\n"
			       "  --from-dir DIR [--all-files] [--follow-symlinks]\n"
			       "                   ImageFolder layout DIR/<class>/<files>: fields data, label (i64), key;\n"
			       "                   classes, labels, files and order as torchvision's ImageFolder takes them\n"
			       "                   (image extensions only, unless --all-files), the class map stored in the\n"
			       "                   dataset's metadata; links leading out of DIR skipped unless --follow-symlinks\n"
			       "  --from DATASET   any dataset sluice reads: WebDataset tars (a .tar or a directory of them),\n"
			       "                   Megatron PREFIX(.bin/.idx), sluice shards; fields kept\n"
			       "  --from-parquet F a Parquet file, or a directory of them; --from-hf DIR: a Hugging Face\n"
			       "                   dataset saved with save_to_disk (or its Arrow cache files). Each column a\n"
			       "                   field of its type, rows streamed; through the Python package and pyarrow\n"
			       "                   (SLUICE_PYTHON, default python3)\n");
			return 0;
		} else if (!strcmp(a, "--quiet")) {
			quiet = 1;
		} else if (!strcmp(a, "--json")) {
			json = 1;
		} else if (!strcmp(a, "--greedy")) {
			greedy = 1;
		} else if (!strcmp(a, "--all-files")) {
			all_files = 1;
		} else if (!strcmp(a, "--follow-symlinks")) {
			follow = 1;
		} else if (!strcmp(a, "--overwrite")) {
			overwrite = 1;
		} else if (!strcmp(a, "--from-dir") || !strcmp(a, "--from") || !strcmp(a, "--shard-size") ||
			   !strcmp(a, "--threads") || !strcmp(a, "--from-jsonl") || !strcmp(a, "--fields") ||
			   !strcmp(a, "--from-tokens") || !strcmp(a, "--doc-lengths") || !strcmp(a, "--dtype") ||
			   !strcmp(a, "--zstd") || !strcmp(a, "--block-size") || !strcmp(a, "--pack-context") ||
			   !strcmp(a, "--from-parquet") || !strcmp(a, "--from-hf")) {
			if (!v || !*v)
				return cli_fail(CMD, "%s needs a value", a);
			if (!strcmp(a, "--from-dir"))
				from = v;
			else if (!strcmp(a, "--from-jsonl"))
				from_jsonl = v;
			else if (!strcmp(a, "--fields"))
				fields_arg = v;
			else if (!strcmp(a, "--from-tokens"))
				from_tokens = v;
			else if (!strcmp(a, "--doc-lengths"))
				doc_lengths = v;
			else if (!strcmp(a, "--dtype"))
				dtype_arg = v;
			else if (!strcmp(a, "--from"))
				from_ds = v;
			else if (!strcmp(a, "--from-parquet"))
				from_parquet = v;
			else if (!strcmp(a, "--from-hf"))
				from_hf = v;
			else if (!strcmp(a, "--shard-size") && cli_size(CMD, a, v, &shard_size))
				return 2;
			else if (!strcmp(a, "--threads") && cli_uint(CMD, a, v, 1, 64, &threads))
				return 2;
			else if (!strcmp(a, "--zstd") && cli_uint(CMD, a, v, 1, 22, &zstd))
				return 2;
			else if (!strcmp(a, "--block-size") && cli_size(CMD, a, v, &block_size))
				return 2;
			else if (!strcmp(a, "--pack-context") && cli_uint(CMD, a, v, 1, 1u << 24, &pack_context))
				return 2;
			i++;
		} else if (a[0] == '-') {
			return cli_fail(CMD, "unknown option '%s' (see --help)", a);
		} else if (out) {
			return cli_fail(CMD, "more than one OUT given ('%s', '%s')", out, a);
		} else {
			out = a;
		}
	}
	if (!out || !!from + !!from_ds + !!from_jsonl + !!from_tokens + !!from_parquet + !!from_hf != 1)
		return cli_fail(CMD, "need one of --from-dir DIR, --from DATASET, --from-jsonl FILE, --from-tokens FILE, "
				"--from-parquet FILE or --from-hf DIR, and OUT (see --help)");
	if (block_size && !zstd)
		return cli_fail(CMD, "--block-size needs --zstd");
	if ((from_parquet || from_hf) && (fields_arg || doc_lengths || dtype_arg || pack_context || greedy || threads ||
					  all_files || follow))
		return cli_fail(CMD, "--from-%s takes only --shard-size, --zstd, --block-size, --overwrite, --quiet and --json",
				from_parquet ? "parquet" : "hf");
	if (from_parquet || from_hf)
		return pack_arrow(from_parquet ? "parquet" : "hf", from_parquet ? from_parquet : from_hf, out, shard_size,
				  zstd, block_size, json, overwrite);
	if ((pack_context || greedy) && !from_tokens)
		return cli_fail(CMD, "--pack-context and --greedy need --from-tokens");
	if (greedy && !pack_context)
		return cli_fail(CMD, "--greedy needs --pack-context L");
	if (from_jsonl && !fields_arg)
		return cli_fail(CMD, "--from-jsonl needs --fields KEY[,KEY...]");
	if (from_tokens && !doc_lengths)
		return cli_fail(CMD, "--from-tokens needs --doc-lengths FILE");
	opt.source = from ? SLUICE_PACK_DIR : from_ds ? SLUICE_PACK_DATASET : from_jsonl ? SLUICE_PACK_JSONL : SLUICE_PACK_TOKENS;
	opt.from = from ? from : from_ds ? from_ds : from_jsonl ? from_jsonl : from_tokens;
	opt.fields = fields_arg;
	opt.doc_lengths = doc_lengths;
	opt.dtype = dtype_arg;
	opt.pack_context = pack_context;
	opt.greedy = (int)greedy;
	opt.all_files = all_files;
	opt.follow_symlinks = follow;
	opt.threads = threads;
	opt.overwrite = overwrite;
	opt.writer = (struct sluice_writer_options){ .size = sizeof(struct sluice_writer_options), .shard_size = shard_size, .zstd_level = (int)zstd,
						     .block_size = (size_t)block_size };
	opt.progress = quiet || json ? NULL : show_progress;
	rc = sluice_pack(out, &opt, &rep);
	/*
	 * The detail names the input (FILE:LINE) or the output (one is there
	 * already, a full disk): cli_error then adds no name of its own; the
	 * input is looked for first, as the output's name may lie inside it.
	 */
	if (rc) {
		const char *d = sluice_last_error_detail();
		int input = opt.from && strstr(d, cli_shown(opt.from));

		return cli_error(CMD, input || !strstr(d, cli_shown(out)) ? opt.from : out, rc);
	}
	print_report(&opt, &rep, out, json);
	return 0;
}
