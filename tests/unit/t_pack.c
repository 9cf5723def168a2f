/*
 * Token packing: every document lands once, whole and in order, in one
 * row; positions restart and labels are masked at each document's start
 * and in the padding; documents longer than the context are cut; on an
 * Alpaca-like length distribution best-fit decreasing fills >= 99% of the
 * capacity and beats greedy packing.
 *
 * sluice_pack's overwrite: the new dataset replaces the old whole; a
 * directory that is not a sluice dataset is refused by name, untouched;
 * and a kill -9 before any one of the file system steps the pack takes
 * (each mkdir, rename, unlink, rmdir and sync, counted by wrappers of
 * those calls defined here, which the static library's calls reach)
 * leaves the old dataset or the new one whole at the path, never a mix
 * and never nothing; the next overwrite removes what the killed one left.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t_util.h"

#define L 4096

static uint64_t rng = 12345;

static double uniform(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

/* Alpaca-like lengths (the Data Journey report: min 13, median 83, mean 95, max 307): lognormal, clipped. */
static uint32_t alpaca_len(void)
{
	double z = sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform());
	double v = exp(log(83.0) + 0.52 * z);

	return v < 13 ? 13 : v > 307 ? 307 : (uint32_t)v;
}

/* Document k's token i: the document is recognisable from any of its tokens. */
static int32_t tok(uint32_t k, uint32_t i)
{
	return (int32_t)((k << 12) | (i & 0xfff));
}

/* One row: each document whole, once, positions restarting, labels masked at starts and in the padding. */
static int check_row(const struct sluice_packed_row *r, const uint32_t *len, uint32_t n, unsigned char *seen)
{
	int ok = r->cu_seqlens[0] == 0 && (uint32_t)r->cu_seqlens[r->ndocs] == r->tokens && r->tokens <= L;

	for (uint32_t d = 0; d < r->ndocs; d++) {
		int32_t a = r->cu_seqlens[d], b = r->cu_seqlens[d + 1];
		uint32_t k = (uint32_t)r->input_ids[a] >> 12;

		ok &= k < n && !seen[k] && (uint32_t)(b - a) == len[k];
		if (k < n)
			seen[k] = 1;
		for (int32_t i = a; i < b; i++)
			ok &= r->input_ids[i] == tok(k, (uint32_t)(i - a)) && r->position_ids[i] == i - a &&
			      r->labels[i] == (i == a ? -100 : r->input_ids[i]);
	}
	for (uint32_t i = r->tokens; i < L; i++)
		ok &= r->input_ids[i] == -7 && r->labels[i] == -100 && r->position_ids[i] == (int32_t)(i - r->tokens);
	return ok;
}

/* Packs documents of the given lengths (<= L), checking every row; returns the share of the capacity filled. */
static double pack(const uint32_t *len, uint32_t n, int greedy)
{
	struct sluice_packer_options o = { .size = sizeof(struct sluice_packer_options), .context = L, .greedy = greedy, .pad_id = -7 };
	struct sluice_packer *p;
	struct sluice_packed_row r;
	unsigned char *seen = calloc(n, 1);
	int32_t buf[L];
	uint64_t tokens, capacity, real = 0;
	int rc = 0, ok = 1;

	T_CHECK(sluice_packer_new(&p, &o) == 0);
	for (uint32_t k = 0; k <= n; k++) {
		if (k < n) {
			for (uint32_t i = 0; i < len[k]; i++)
				buf[i] = tok(k, i);
			T_CHECK(sluice_packer_add(p, buf, len[k]) == 0);
		}
		/* Rows come out as soon as they are finished; at the end, flushed. */
		while ((rc = sluice_packer_row(p, &r, k == n)) == 1) {
			ok &= check_row(&r, len, n, seen);
			real += r.tokens;
		}
	}
	T_CHECK(rc == 0 && ok);
	for (uint32_t k = 0; k < n; k++)
		T_CHECK(seen[k]);
	sluice_packer_stats(p, &tokens, &capacity);
	T_CHECK(tokens == real && capacity % L == 0);
	sluice_packer_free(p);
	free(seen);
	return (double)tokens / (double)capacity;
}

static void test_packer_fills_rows(void)
{
	const uint32_t n = 100000;
	uint32_t *len = malloc(n * sizeof(uint32_t));
	uint64_t sum = 0;
	struct sluice_packer *p;
	struct sluice_packer_options bad = { .size = sizeof(struct sluice_packer_options), .context = 0 };

	for (uint32_t k = 0; k < n; k++)
		sum += len[k] = alpaca_len();
	double naive = (double)sum / n / L, bfd = pack(len, n, 0), greedy = pack(len, n, 1);
	double bfd2k = pack(len, 2000, 0), greedy2k = pack(len, 2000, 1);
	uint64_t s2k = 0;

	for (uint32_t k = 0; k < 2000; k++)
		s2k += len[k];
	printf("alpaca-like, mean %.1f tokens, L = %d: naive padding %.4f; %u docs: BFD %.4f, greedy %.4f; "
	       "first 2000 docs: BFD %.4f, greedy %.4f (bound with whole rows %.4f)\n",
	       (double)sum / n, L, naive, n, bfd, greedy, bfd2k, greedy2k,
	       (double)s2k / (double)(L * ((s2k + L - 1) / L)));
	T_CHECK(bfd >= 0.99 && bfd > greedy && greedy > 0.9);
	T_CHECK(sluice_packer_new(&p, &bad) == SLUICE_EINVAL_CONFIG && !p);
	sluice_packer_free(NULL);
	free(len);
}

/* A document longer than the context becomes pieces of at most L tokens. */
static void test_packer_cuts_long_documents(void)
{
	static int32_t big[10000];
	struct sluice_packer *p;
	struct sluice_packed_row r;
	struct sluice_packer_options o = { .size = sizeof(struct sluice_packer_options), .context = L };
	uint32_t rows = 0, total = 0;

	T_CHECK(sluice_packer_new(&p, &o) == 0);
	T_CHECK(sluice_packer_add(p, big, 10000) == 0);
	while (sluice_packer_row(p, &r, 1) == 1) {
		T_CHECK(r.ndocs == 1 && (r.tokens == L || r.tokens == 10000 - 2 * L));
		rows++;
		total += r.tokens;
	}
	T_CHECK(rows == 3 && total == 10000);
	sluice_packer_free(p);
}

/*
 * Kill points.  Each wrapper counts a step and, when the count reaches
 * kill_at (0: never), dies by SIGKILL before the step is taken: the state
 * a kill -9 leaves between two steps.  The real call is libc's, found by
 * dlsym(RTLD_NEXT).
 */
static long steps, kill_at;

static void step(void)
{
	if (++steps == kill_at)
		raise(SIGKILL);
}

#define T_WRAP(ret, name, params, args)                                  \
	ret name params                                                   \
	{                                                                 \
		static ret(*real) params;                                 \
		if (!real)                                                \
			*(void **)&real = dlsym(RTLD_NEXT, #name);        \
		step();                                                   \
		return real args;                                         \
	}
T_WRAP(int, mkdir, (const char *p, mode_t m), (p, m))
T_WRAP(int, rmdir, (const char *p), (p))
T_WRAP(int, unlink, (const char *p), (p))
T_WRAP(int, unlinkat, (int d, const char *p, int f), (d, p, f))
T_WRAP(int, rename, (const char *a, const char *b), (a, b))
T_WRAP(int, renameat2, (int da, const char *a, int db, const char *b, unsigned f), (da, a, db, b, f))
T_WRAP(int, fsync, (int fd), (fd))
T_WRAP(int, fdatasync, (int fd), (fd))

/* JSON lines of n records {"v": "TAG-i"}, written to path. */
static void write_jsonl(const char *path, const char *tag, int n)
{
	FILE *f = fopen(path, "w");

	for (int i = 0; f && i < n; i++)
		fprintf(f, "{\"v\": \"%s-%d\"}\n", tag, i);
	T_CHECK(f && fclose(f) == 0);
}

static int pack_jsonl(const char *out, const char *jsonl, int overwrite)
{
	struct sluice_pack_options o = SLUICE_PACK_OPTIONS_INIT;

	o.source = SLUICE_PACK_JSONL;
	o.from = jsonl;
	o.fields = "v";
	o.writer.shard_size = 1024; /* shards of a few dozen records: a pack takes many steps */
	o.overwrite = overwrite;
	return sluice_pack(out, &o, NULL);
}

/* 'a' or 'b' where path opens as a whole dataset of n_a records "a-i" or n_b "b-i"; 0 where it does not. */
static char whole(const char *path, int n_a, int n_b)
{
	struct sluice_dataset *ds;
	char want[32], buf[256], tag = 0;
	struct sluice_record rec;

	if (sluice_dataset_open(&ds, path))
		return 0;
	uint64_t n = sluice_dataset_count(ds);

	if (n == (uint64_t)n_a || n == (uint64_t)n_b)
		tag = n == (uint64_t)n_a ? 'a' : 'b';
	for (uint64_t i = 0; tag && i < n; i++) {
		snprintf(want, sizeof(want), "%c-%llu", tag, (unsigned long long)i);
		if (sluice_dataset_read(ds, i, buf, sizeof(buf), &rec) < 0 || rec.len[0] != strlen(want) ||
		    memcmp(rec.data[0], want, rec.len[0]))
			tag = 0;
	}
	if (tag && sluice_dataset_verify(ds, NULL, NULL) != 0)
		tag = 0;
	sluice_dataset_close(ds);
	return tag;
}

/* The names in dir starting with prefix. */
static int count_names(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += !strncmp(e->d_name, prefix, strlen(prefix));
	if (d)
		closedir(d);
	return n;
}

/* The new dataset replaces the old whole, and nothing is left beside it; without overwrite, -EEXIST. */
static void test_overwrite_replaces_a_dataset(void)
{
	const char *d = t_dir("t_pack_ow");
	char a[600], b[600], out[600];

	snprintf(a, sizeof(a), "%s/a.jsonl", d);
	snprintf(b, sizeof(b), "%s/b.jsonl", d);
	snprintf(out, sizeof(out), "%s/ds", d);
	write_jsonl(a, "a", 300);
	write_jsonl(b, "b", 70);
	T_CHECK(pack_jsonl(out, a, 0) == 0 && whole(out, 300, 70) == 'a');
	T_CHECK(pack_jsonl(out, b, 0) == -EEXIST && strstr(sluice_last_error_detail(), "overwrite"));
	T_CHECK(whole(out, 300, 70) == 'a');
	T_CHECK(pack_jsonl(out, b, 1) == 0 && whole(out, 300, 70) == 'b');
	/* The old directory's permissions are the new one's. */
	struct stat st;

	T_CHECK(chmod(out, 0750) == 0);
	T_CHECK(pack_jsonl(out, a, 1) == 0 && whole(out, 300, 70) == 'a');
	T_CHECK(stat(out, &st) == 0 && (st.st_mode & 07777) == 0750);
	T_CHECK(count_names(d, ".ds.") == 0);
	/* Absent, or an empty directory: made. */
	snprintf(out, sizeof(out), "%s/new/ds", d);
	T_CHECK(pack_jsonl(out, b, 1) == 0 && whole(out, 300, 70) == 'b');
	snprintf(out, sizeof(out), "%s/empty", d);
	T_CHECK(mkdir(out, 0755) == 0 && pack_jsonl(out, b, 1) == 0 && whole(out, 300, 70) == 'b');
	/* Through a link: the link stays, the directory it names is replaced. */
	snprintf(out, sizeof(out), "%s/link", d);
	T_CHECK(symlink("ds", out) == 0 && pack_jsonl(out, b, 1) == 0);
	T_CHECK(lstat(out, &st) == 0 && S_ISLNK(st.st_mode));
	snprintf(out, sizeof(out), "%s/ds", d);
	T_CHECK(whole(out, 300, 70) == 'b');
}

/* What is not a sluice dataset is refused by name and left as it was; nothing is made beside it. */
static void test_overwrite_refuses_what_is_no_dataset(void)
{
	const char *d = t_dir("t_pack_ow_refuse");
	char b[600], out[600], f[700];
	struct stat st;

	snprintf(b, sizeof(b), "%s/b.jsonl", d);
	write_jsonl(b, "b", 70);
	/* A user's directory of other files, beside what could pass for a dataset's. */
	snprintf(out, sizeof(out), "%s/photos", d);
	T_CHECK(mkdir(out, 0755) == 0);
	snprintf(f, sizeof(f), "%s/cat.jpg", out);
	free(t_make_file(f, 100, 1));
	snprintf(f, sizeof(f), "%s/shard-000000.sls", out);
	free(t_make_file(f, 100, 2));
	T_CHECK(pack_jsonl(out, b, 1) == -ENOTEMPTY && strstr(sluice_last_error_detail(), "cat.jpg"));
	snprintf(f, sizeof(f), "%s/cat.jpg", out);
	T_CHECK(stat(f, &st) == 0 && st.st_size == 100);
	/* A directory where a shard's name is. */
	snprintf(out, sizeof(out), "%s/odd", d);
	snprintf(f, sizeof(f), "%s/odd/shard-000001.sls", d);
	T_CHECK(mkdir(out, 0755) == 0 && mkdir(f, 0755) == 0);
	T_CHECK(pack_jsonl(out, b, 1) == -ENOTEMPTY && strstr(sluice_last_error_detail(), "directory"));
	/* A file, and a link to nothing. */
	snprintf(out, sizeof(out), "%s/b.jsonl", d);
	T_CHECK(pack_jsonl(out, b, 1) == -ENOTDIR && strstr(sluice_last_error_detail(), "b.jsonl"));
	snprintf(out, sizeof(out), "%s/dangling", d);
	T_CHECK(symlink("nowhere", out) == 0 && pack_jsonl(out, b, 1) == -ENOENT);
	T_CHECK(count_names(d, ".") == 2); /* "." and "..": no staging directory made */
	/* A remote one: objects cannot be swapped at once (refused before any request). */
	T_CHECK(pack_jsonl("s3://bucket/ds", b, 1) == -EOPNOTSUPP);
}

/*
 * sluice_writer_open_overwrite, the writer itself: the target is checked
 * again at close, so files put in it while the new dataset was written
 * are never removed (the close fails naming one, the old dataset stays,
 * and nothing is left beside it); written alone, the new one takes its place.
 */
static void test_overwrite_checks_the_target_again_at_close(void)
{
	const char *d = t_dir("t_pack_ow_close");
	struct sluice_field f = { "v", SLUICE_DTYPE_BYTES, 0, { 0 } };
	struct sluice_writer_options wo = SLUICE_WRITER_OPTIONS_INIT;
	struct sluice_writer *w;
	char a[600], out[600], mine[700];
	const void *val = "b-0";
	size_t len = 3;

	snprintf(a, sizeof(a), "%s/a.jsonl", d);
	snprintf(out, sizeof(out), "%s/ds", d);
	snprintf(mine, sizeof(mine), "%s/ds/notes.txt", d);
	write_jsonl(a, "a", 300);
	T_CHECK(pack_jsonl(out, a, 0) == 0);
	T_CHECK(sluice_writer_open_overwrite(&w, out, &f, 1, &wo) == 0);
	T_CHECK(sluice_writer_add(w, &val, &len) == 0);
	free(t_make_file(mine, 10, 3)); /* a user's file, put there meanwhile */
	T_CHECK(sluice_writer_close(w) == -ENOTEMPTY && strstr(sluice_last_error_detail(), "notes.txt"));
	T_CHECK(whole(out, 300, 1) == 'a' && access(mine, F_OK) == 0 && count_names(d, ".ds.") == 0);
	T_CHECK(unlink(mine) == 0);
	T_CHECK(sluice_writer_open_overwrite(&w, out, &f, 1, &wo) == 0);
	T_CHECK(sluice_writer_add(w, &val, &len) == 0);
	T_CHECK(sluice_writer_close(w) == 0 && whole(out, 300, 1) == 'b' && count_names(d, ".ds.") == 0);
	/* An aborted one leaves the old dataset and nothing beside it. */
	T_CHECK(sluice_writer_open_overwrite(&w, out, &f, 1, &wo) == 0);
	sluice_writer_abort(w);
	T_CHECK(whole(out, 300, 1) == 'b' && count_names(d, ".ds.") == 0);
}

/*
 * kill -9 before each step of an overwrite (then one more: it completes):
 * the path holds the old dataset or the new one whole, the old one until
 * the swap and the new one from then on; the next overwrite, not killed,
 * removes what the killed one left beside it.
 */
static void test_overwrite_killed_at_every_step(void)
{
	const char *d = t_dir("t_pack_ow_kill");
	char a[600], b[600], out[700], round[600];
	int saw_a = 0, saw_b = 0, after_swap = 0;
	long total;

	snprintf(a, sizeof(a), "%s/a.jsonl", d);
	snprintf(b, sizeof(b), "%s/b.jsonl", d);
	write_jsonl(a, "a", 300);
	write_jsonl(b, "b", 200);
	/* How many steps an overwrite takes. */
	snprintf(out, sizeof(out), "%s/count", d);
	T_CHECK(pack_jsonl(out, a, 0) == 0);
	steps = 0;
	T_CHECK(pack_jsonl(out, b, 1) == 0);
	total = steps;
	T_CHECK(total > 10);
	for (long k = 1; k <= total + 1; k++) {
		snprintf(round, sizeof(round), "%s/r%ld", d, k);
		snprintf(out, sizeof(out), "%s/ds", round);
		T_CHECK(mkdir(round, 0755) == 0 && pack_jsonl(out, a, 0) == 0);
		pid_t pid = fork();
		int status;

		if (pid == 0) {
			steps = 0;
			kill_at = k;
			_exit(pack_jsonl(out, b, 1) == 0 ? 0 : 3);
		}
		T_CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
		T_CHECK(k <= total ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
				   : WIFEXITED(status) && WEXITSTATUS(status) == 0);
		char got = whole(out, 300, 200);

		if (!got)
			fprintf(stderr, "killed before step %ld of %ld: %s is neither dataset whole\n", k, total, out);
		T_CHECK(got == 'a' || got == 'b');
		T_CHECK(!(after_swap && got == 'a')); /* once the new one is in place, it stays */
		after_swap |= got == 'b';
		saw_a += got == 'a';
		saw_b += got == 'b';
		/* The next overwrite takes the path as it is and clears what the killed one left. */
		T_CHECK(pack_jsonl(out, got == 'a' ? b : a, 1) == 0 && whole(out, 300, 200) == (got == 'a' ? 'b' : 'a'));
		T_CHECK(count_names(round, ".ds.") == 0);
	}
	printf("overwrite killed before each of its %ld steps: old whole %d times, new whole %d, never a mix\n", total,
	       saw_a, saw_b);
	T_CHECK(saw_a > 0 && saw_b > 0);
}

static const struct {
	const char *name;
	void (*fn)(void);
} tests[] = {
	{ "packer_fills_rows", test_packer_fills_rows },
	{ "packer_cuts_long_documents", test_packer_cuts_long_documents },
	{ "overwrite_replaces_a_dataset", test_overwrite_replaces_a_dataset },
	{ "overwrite_refuses_what_is_no_dataset", test_overwrite_refuses_what_is_no_dataset },
	{ "overwrite_checks_the_target_again_at_close", test_overwrite_checks_the_target_again_at_close },
	{ "overwrite_killed_at_every_step", test_overwrite_killed_at_every_step },
};

int main(void)
{
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		int before = t_failures;

		tests[i].fn();
		if (t_failures != before)
			fprintf(stderr, "t_pack: %s failed\n", tests[i].name);
	}
	return t_done("t_pack");
}
