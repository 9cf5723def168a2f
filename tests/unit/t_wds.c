/*
 * WebDataset shards read in place: samples grouped by key across fields,
 * long (pax) names, missing fields, several shards; the sidecar index is
 * cached, reused, and rebuilt when the tar changes or the sidecar is
 * damaged or the tar rewritten in place; members webdataset skips are
 * skipped, sparse members and malformed tars refused, naming tar and member.
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"
#include "t_util.h"

static const char *dir;

struct member {
	const char *name;
	size_t len;
	uint64_t seed;
	int type; /* 0 file, 1 dir, 2 symlink */
};

static void write_tar(const char *path, const struct member *m, size_t n)
{
	struct archive *a = archive_write_new();
	char buf[20000];

	archive_write_set_format_pax_restricted(a);
	if (archive_write_open_filename(a, path) != ARCHIVE_OK)
		exit(1);
	for (size_t i = 0; i < n; i++) {
		struct archive_entry *e = archive_entry_new();

		archive_entry_set_pathname(e, m[i].name);
		archive_entry_set_perm(e, 0644);
		if (m[i].type == 1) {
			archive_entry_set_filetype(e, AE_IFDIR);
		} else if (m[i].type == 2) {
			archive_entry_set_filetype(e, AE_IFLNK);
			archive_entry_set_symlink(e, "target");
		} else {
			archive_entry_set_filetype(e, AE_IFREG);
			archive_entry_set_size(e, (la_int64_t)m[i].len);
		}
		archive_write_header(a, e);
		if (m[i].type == 0) {
			t_fill(buf, m[i].len, m[i].seed);
			archive_write_data(a, buf, m[i].len);
		}
		archive_entry_free(e);
	}
	archive_write_close(a);
	archive_write_free(a);
}

/* Shard s, sample j: jpg always, cls always, json on even j; sample 5 has a long name. */
static void make_shard(const char *path, int s)
{
	struct member m[40];
	static char names[40][300];
	size_t n = 0;

	m[n++] = (struct member){ "train", 0, 0, 1 };
	for (int j = 0; j < 10; j++) {
		char key[260];

		if (j == 5)
			snprintf(key, sizeof(key), "train/%0150d/s%d_%02d", 7, s, j);
		else
			snprintf(key, sizeof(key), "train/s%d_%02d", s, j);
		snprintf(names[n], 300, "%s.jpg", key);
		m[n] = (struct member){ names[n], (size_t)(100 + 97 * j + s), (uint64_t)(s * 100 + j), 0 };
		n++;
		snprintf(names[n], 300, "%s.cls", key);
		m[n] = (struct member){ names[n], 1 + (size_t)j % 3, (uint64_t)(s * 100 + j + 50), 0 };
		n++;
		if (j % 2 == 0) {
			snprintf(names[n], 300, "%s.seg.json", key);
			m[n] = (struct member){ names[n], 20, (uint64_t)(s * 100 + j + 70), 0 };
			n++;
		}
	}
	write_tar(path, m, n);
}

static void check_all(const char *open_as, uint64_t nrec, int shards)
{
	struct sluice_dataset *ds;
	struct sluice_record rec;
	char buf[8192], want[4096];

	T_CHECK(sluice_dataset_open(&ds, open_as) == 0);
	if (!ds)
		return;
	T_CHECK(!strcmp(sluice_dataset_format(ds), "webdataset"));
	T_CHECK(sluice_dataset_count(ds) == nrec && sluice_dataset_nfields(ds) == 4);
	T_CHECK(!strcmp(sluice_dataset_field(ds, 0)->name, "jpg") && !strcmp(sluice_dataset_field(ds, 2)->name, "seg.json"));
	T_CHECK(!strcmp(sluice_dataset_field(ds, 3)->name, "__key__"));
	for (int s = 0; s < shards; s++)
		for (int j = 0; j < 10; j++) {
			uint64_t i = (uint64_t)(s * 10 + j);

			T_CHECK(sluice_dataset_read(ds, i, buf, sizeof(buf), &rec) > 0);
			/* The sample's key, as webdataset's __key__. */
			if (j == 5)
				snprintf(want, sizeof(want), "train/%0150d/s%d_%02d", 7, s, j);
			else
				snprintf(want, sizeof(want), "train/s%d_%02d", s, j);
			T_CHECK(rec.len[3] == strlen(want) && !memcmp(rec.data[3], want, rec.len[3]));
			t_fill(want, (size_t)(100 + 97 * j + s), (uint64_t)(s * 100 + j));
			T_CHECK(rec.len[0] == (size_t)(100 + 97 * j + s) && !memcmp(rec.data[0], want, rec.len[0]));
			t_fill(want, 1 + (size_t)j % 3, (uint64_t)(s * 100 + j + 50));
			T_CHECK(rec.len[1] == 1 + (size_t)j % 3 && !memcmp(rec.data[1], want, rec.len[1]));
			if (j % 2 == 0) {
				t_fill(want, 20, (uint64_t)(s * 100 + j + 70));
				T_CHECK(rec.len[2] == 20 && !memcmp(rec.data[2], want, 20));
			} else {
				T_CHECK(rec.len[2] == 0);
			}
		}
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
}

static void expect_bad(const char *name, const struct member *m, size_t n, const char *what)
{
	char p[700];
	struct sluice_dataset *ds;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	write_tar(p, m, n);
	T_CHECK(sluice_dataset_open(&ds, p) == SLUICE_EFORMAT && ds == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), what) && strstr(sluice_last_error_detail(), name));
	if (!strstr(sluice_last_error_detail(), what))
		fprintf(stderr, "  got: %s\n", sluice_last_error_detail());
}


/* name read as webdataset reads it: nsamples samples, these fields (comma-separated), skipped members warned of. */
static void expect_read(const char *name, const struct member *m, size_t n, uint64_t nsamples, const char *fields,
			int skipped)
{
	char p[700], got[512] = "";
	struct sluice_dataset *ds;

	(void)skipped;
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	write_tar(p, m, n);
	T_CHECK(sluice_dataset_open(&ds, p) == 0);
	if (!ds)
		return;
	T_CHECK(sluice_dataset_count(ds) == nsamples);
	for (unsigned f = 0; f < sluice_dataset_nfields(ds); f++)
		snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", f ? "," : "", sluice_dataset_field(ds, f)->name);
	T_CHECK(!strcmp(got, fields ? fields : ""));
	if (strcmp(got, fields ? fields : ""))
		fprintf(stderr, "  %s: fields %s\n", name, got);
	T_CHECK(sluice_dataset_verify(ds, NULL, NULL) == 0);
	sluice_dataset_close(ds);
}

/* A GNU sparse member (tar --sparse) is refused by name, not read as its stored chunks. */
static void t_sparse(void)
{
	char src[700], tar[700], cmd[1600];
	struct sluice_dataset *ds;
	int fd;

	if (system("tar --version >/dev/null 2>&1") != 0) {
		printf("t_wds: no GNU tar: sparse members not tried\n");
		return;
	}
	snprintf(src, sizeof(src), "%s/sp", dir);
	mkdir(src, 0755);
	snprintf(cmd, sizeof(cmd), "%s/s1.bin", src);
	fd = open(cmd, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	T_CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0 && pwrite(fd, "data", 4, 512 << 10) == 4);
	close(fd);
	snprintf(tar, sizeof(tar), "%s/sparse.tar", dir);
	snprintf(cmd, sizeof(cmd), "tar --sparse --format=gnu -C %s -cf %s s1.bin", src, tar);
	T_CHECK(system(cmd) == 0);
	T_CHECK(sluice_dataset_open(&ds, tar) == SLUICE_EFORMAT && !ds);
	T_CHECK(strstr(sluice_last_error_detail(), "sparse") && strstr(sluice_last_error_detail(), "s1.bin"));
}

/*
 * A tar rewritten in place with the same size and its mtime restored (as
 * rsync -t or cp -p leave it) is not read through its old sidecar.
 */
static void t_rewritten_in_place(void)
{
	struct member a[] = { { "k1.jpg", 1000, 1, 0 }, { "k2.jpg", 3000, 2, 0 } };
	struct member b[] = { { "k1.jpg", 3000, 3, 0 }, { "k2.jpg", 1000, 4, 0 } };
	char p[700], q[720], buf[8192], want[4096];
	struct sluice_dataset *ds;
	struct sluice_record rec;
	struct stat st, st2;
	struct timespec ts[2];

	snprintf(p, sizeof(p), "%s/rewrite.tar", dir);
	snprintf(q, sizeof(q), "%s/rewrite.tmp", dir);
	write_tar(p, a, 2);
	T_CHECK(sluice_dataset_open(&ds, p) == 0);
	sluice_dataset_close(ds);
	T_CHECK(stat(p, &st) == 0);
	write_tar(q, b, 2);
	T_CHECK(stat(q, &st2) == 0 && st2.st_size == st.st_size);
	/* Copied over the old bytes, the inode kept, the mtime put back. */
	{
		int in = open(q, O_RDONLY), out = open(p, O_WRONLY);
		ssize_t n;

		while ((n = read(in, buf, sizeof(buf))) > 0)
			T_CHECK(write(out, buf, (size_t)n) == n);
		close(in);
		close(out);
	}
	ts[0] = st.st_atim;
	ts[1] = st.st_mtim;
	T_CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
	T_CHECK(sluice_dataset_open(&ds, p) == 0);
	if (!ds)
		return;
	T_CHECK(sluice_dataset_read(ds, 0, buf, sizeof(buf), &rec) > 0);
	t_fill(want, 3000, 3);
	T_CHECK(rec.len[0] == 3000 && !memcmp(rec.data[0], want, 3000));
	sluice_dataset_close(ds);
}

/* Brace patterns expand as webdataset's braceexpand: each pattern's names joined by spaces. */
static void test_brace_patterns(void)
{
	static const char *const cases[][2] = {
		{ "s-{000..002}.tar", "s-000.tar s-001.tar s-002.tar" },
		{ "s-{8..10}.tar", "s-8.tar s-9.tar s-10.tar" },
		{ "s-{08..10}.tar", "s-08.tar s-09.tar s-10.tar" },
		{ "s-{3..1}", "s-3 s-2 s-1" },
		{ "{0..10..5}", "0 5 10" },
		{ "{a..c}{1,2}", "a1 a2 b1 b2 c1 c2" },
		{ "x{a,{b,c}d}y", "xay xbdy xcdy" },
		{ "{a}{,z}", "{a} {a}z" },
		{ "open{1..2", "open{1..2" },
		{ "{-1..1}", "-1 0 1" },
		{ "{-01..1}", "-01 000 001" },
		{ "{a..e..2}{1..3..0}", "a1 a2 a3 c1 c2 c3 e1 e2 e3" },
		{ "{a..1}{}", "{a..1}{}" },
	};
	char **v, got[256];
	unsigned n;

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		got[0] = 0;
		T_CHECK(sl__brace_expand(cases[c][0], 100, &v, &n) == 0);
		for (unsigned i = 0; i < n; i++) {
			snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", i ? " " : "", v[i]);
			free(v[i]);
		}
		free(v);
		T_CHECK(!strcmp(got, cases[c][1]));
		if (strcmp(got, cases[c][1]))
			fprintf(stderr, "  %s: %s\n", cases[c][0], got);
	}
	T_CHECK(sl__brace_expand("{0..99999999999}", 1000, &v, &n) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sl__brace_expand("{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}", 1000, &v, &n) ==
		SLUICE_EINVAL_CONFIG);
}

int main(void)
{
	char shards[600], p[700], side[760];
	struct stat st1, st2;

	dir = t_dir("t_wds");
	test_brace_patterns();
	snprintf(shards, sizeof(shards), "%s/shards", dir);
	mkdir(shards, 0755);
	for (int s = 0; s < 3; s++) {
		snprintf(p, sizeof(p), "%s/data-%06d.tar", shards, s);
		make_shard(p, s);
	}
	check_all(shards, 30, 3);
	snprintf(p, sizeof(p), "%s/data-000000.tar", shards);
	check_all(p, 10, 1);
	/* Through the loader: shuffled batches of 4 over the three shards. */
	{
		struct sluice_dataset *ds;

		struct sluice_record rec;

		T_CHECK(sluice_dataset_open(&ds, shards) == 0);
		t_loader_epoch(ds, 4, 2048);
		T_CHECK(sluice_dataset_decode(ds, 30, p, 0, &rec) == SLUICE_ERANGE && strstr(sluice_last_error_detail(), "record 30"));
		sluice_dataset_close(ds);
	}

	/* The sidecar is cached and reused... */
	snprintf(side, sizeof(side), "%s.sluice-idx", p);
	T_CHECK(stat(side, &st1) == 0);
	sleep(1);
	check_all(shards, 30, 3);
	T_CHECK(stat(side, &st2) == 0 && st2.st_mtime == st1.st_mtime);
	/* ...rebuilt when the tar changes... */
	make_shard(p, 0);
	check_all(shards, 30, 3);
	T_CHECK(stat(side, &st2) == 0 && st2.st_mtime != st1.st_mtime);
	/* ...and when it is damaged. */
	{
		int fd = open(side, O_RDWR);

		T_CHECK(fd >= 0 && pwrite(fd, "XX", 2, 20) == 2);
		close(fd);
	}
	check_all(shards, 30, 3);

	/* Members webdataset skips are skipped; names it reads are read, fields lowercased. */
	struct member dotdot[] = { { "a.jpg", 10, 1, 0 }, { "../evil.jpg", 10, 2, 0 } };
	struct member abs[] = { { "/etc/passwd.txt", 10, 1, 0 } };
	struct member link[] = { { "k1.jpg", 10, 1, 0 }, { "k2.jpg", 0, 0, 2 }, { "k3.jpg", 11, 3, 0 } };
	struct member nodot[] = { { "README", 10, 1, 0 } };
	struct member odd[] = { { "__index__", 5, 1, 0 },  { ".hidden", 5, 2, 0 },    { "a.JPG", 7, 3, 0 },
				{ "a.cls", 1, 4, 0 },      { "b.jpg", 8, 5, 0 },      { "__meta__/x.txt", 3, 6, 0 },
				{ "d/.dot", 4, 7, 0 },     { "x.y/c.tar.gz", 9, 8, 0 } };

	expect_read("dotdot.tar", dotdot, 2, 2, "jpg,__key__", 0);
	expect_read("abs.tar", abs, 1, 1, "txt,__key__", 0);
	expect_read("link.tar", link, 3, 2, "jpg,__key__", 1);
	expect_read("nodot.tar", nodot, 1, 0, "__key__", 1);
	/* a.JPG and b.jpg share the field jpg; "d/.dot" is key "d/", field "dot" (webdataset's split). */
	expect_read("odd.tar", odd, 8, 4, "jpg,cls,dot,tar.gz,__key__", 3);
	/* Unsafe and malformed tars. */
	struct member twice[] = { { "k1.jpg", 10, 1, 0 }, { "k1.jpg", 10, 2, 0 } };
	struct member twice_case[] = { { "k1.jpg", 10, 1, 0 }, { "k1.JPG", 10, 2, 0 } };

	expect_bad("twice.tar", twice, 2, "twice");
	expect_bad("twice_case.tar", twice_case, 2, "twice");
	/* A member whose field would be the key's own name: refused, as webdataset refuses it. */
	struct member keyfield[] = { { "k1.jpg", 10, 1, 0 }, { "k1.__key__", 4, 2, 0 } };

	expect_bad("keyfield.tar", keyfield, 2, "__key__");
	t_sparse();
	t_rewritten_in_place();
	/* A member whose size runs past the end of a truncated tar. */
	{
		struct member big[] = { { "k.jpg", 15000, 3, 0 } };
		struct sluice_dataset *ds;

		snprintf(p, sizeof(p), "%s/trunc.tar", dir);
		write_tar(p, big, 1);
		T_CHECK(truncate(p, 5000) == 0);
		T_CHECK(sluice_dataset_open(&ds, p) == SLUICE_EFORMAT);
		T_CHECK(strstr(sluice_last_error_detail(), "trunc.tar") != NULL);
		/* An empty tar: zero samples. */
		snprintf(p, sizeof(p), "%s/empty.tar", dir);
		write_tar(p, NULL, 0);
		T_CHECK(sluice_dataset_open(&ds, p) == 0 && sluice_dataset_count(ds) == 0);
		sluice_dataset_close(ds);
	}
	return t_done("t_wds");
}
