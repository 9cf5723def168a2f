/*
 * sluice_copy of a local tree (sluice cp -r): links that lead out of it
 * skipped and named, links inside it copied as their targets or kept as
 * links, loops walked once, a link swapped in after the listing refused;
 * the temporaries of killed copies removed by the next, a live one's
 * kept; progress told in order, ending at the total.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/names.h"
#include "store/store.h"
#include "t_util.h"

static const char *dir;
static char out_dir[600], src_dir[600];

/* path below the test directory, in one of a few static buffers used in turn. */
static const char *at(const char *fmt, const char *name)
{
	static char buf[8][1200];
	static unsigned next;
	char *b = buf[next++ % 8];

	snprintf(b, sizeof(buf[0]), fmt, dir, name);
	return b;
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f)) {
		perror(path);
		exit(1);
	}
}

/* The file's text ("" where it is absent or not a regular file, links followed). */
static const char *text(const char *path)
{
	static char buf[256];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

static int absent(const char *path)
{
	struct stat st;

	return lstat(path, &st) < 0 && errno == ENOENT;
}

/* What the copy said on stderr while fn ran (its warnings), into a static buffer. */
static const char *said_during(int (*fn)(void *), void *arg, int *rc)
{
	static char buf[16384];
	const char *log = at("%s/%s", "stderr.txt");
	int saved = dup(2), fd = open(log, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ssize_t n;

	fflush(stderr);
	dup2(fd, 2);
	*rc = fn(arg);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	buf[n > 0 ? n : 0] = 0;
	return buf;
}

struct t_call {
	const char *src, *dst;
	unsigned flags;
	struct sluice_copy_report rep;
};

static int t_run(void *arg)
{
	struct t_call *c = arg;

	c->rep = (struct sluice_copy_report)SLUICE_COPY_REPORT_INIT;
	return sluice_copy(c->src, c->dst, c->flags, &c->rep);
}

/*
 * The tree every link test copies: two files, a directory, and links of
 * each kind, in and out of it.  Outside it: a secret file and directory.
 */
static void make_tree(void)
{
	char cmd[2000];

	snprintf(src_dir, sizeof(src_dir), "%s/tree", dir);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/tree' '%s/outside' '%s/out'", dir, dir, dir);
	if (system(cmd))
		exit(1);
	mkdir(at("%s/%s", "outside"), 0755);
	mkdir(at("%s/%s", "outside/dir"), 0755);
	mkdir(at("%s/%s", "out"), 0755);
	put(at("%s/%s", "outside/secret"), "SECRET");
	put(at("%s/%s", "outside/dir/inner"), "SECRET-INNER");
	mkdir(src_dir, 0755);
	mkdir(at("%s/%s", "tree/sub"), 0755);
	put(at("%s/%s", "tree/a"), "A");
	put(at("%s/%s", "tree/sub/f"), "F");
	/* Out of the tree, each a different way. */
	T_CHECK(symlink(at("%s/%s", "outside/secret"), at("%s/%s", "tree/abs_out")) == 0);
	T_CHECK(symlink("../outside/secret", at("%s/%s", "tree/creds")) == 0);
	T_CHECK(symlink("../outside/dir", at("%s/%s", "tree/dir_out")) == 0);
	T_CHECK(symlink("../tree/../tree/sub/../../outside/secret", at("%s/%s", "tree/dotdot")) == 0);
	T_CHECK(symlink("creds", at("%s/%s", "tree/link_to_out_link")) == 0);
	T_CHECK(symlink("/etc/passwd", at("%s/%s", "tree/passwd")) == 0);
	T_CHECK(symlink("nothing-here", at("%s/%s", "tree/dangling")) == 0);
	T_CHECK(symlink("loop2", at("%s/%s", "tree/loop1")) == 0);
	T_CHECK(symlink("loop1", at("%s/%s", "tree/loop2")) == 0);
	/* Inside it. */
	T_CHECK(symlink("sub/f", at("%s/%s", "tree/rel_in")) == 0);
	T_CHECK(symlink(at("%s/%s", "tree/sub/f"), at("%s/%s", "tree/abs_in")) == 0);
	T_CHECK(symlink("../a", at("%s/%s", "tree/sub/up_a")) == 0);
	T_CHECK(symlink("sub", at("%s/%s", "tree/sub_link")) == 0);
	T_CHECK(symlink("..", at("%s/%s", "tree/sub/up")) == 0);
	T_CHECK(symlink(".", at("%s/%s", "tree/self")) == 0);
	T_CHECK(mkfifo(at("%s/%s", "tree/fifo"), 0644) == 0);
	snprintf(out_dir, sizeof(out_dir), "%s/out", dir);
}

static const char *const leaving[] = { "abs_out", "creds", "dir_out", "dotdot", "link_to_out_link", "passwd" };

/* No file outside the tree reached the copy: every way out skipped, and each named. */
static int test_links_out_of_the_tree_are_skipped_and_named(void)
{
	struct t_call c = { src_dir, at("%s/%s", "out/d"), SLUICE_COPY_RECURSIVE, SLUICE_COPY_REPORT_INIT };
	const char *said;
	int rc, f0 = t_failures;

	make_tree();
	c.dst = at("%s/%s", "out/d");
	alarm(60); /* a walk round a loop fails the test rather than hanging it */
	said = said_during(t_run, &c, &rc);
	alarm(0);
	T_CHECK(rc == 0);
	for (size_t i = 0; i < sizeof(leaving) / sizeof(leaving[0]); i++) {
		char want[700];

		T_CHECK(absent(at("%s/out/d/%s", leaving[i])));
		snprintf(want, sizeof(want), "tree/%s: links out of %s", leaving[i], src_dir);
		T_CHECK(strstr(said, want) != NULL);
	}
	T_CHECK(strstr(said, "tree/dangling: a dangling link, skipped") != NULL);
	T_CHECK(strstr(said, "tree/loop1: a loop of symbolic links, skipped") != NULL);
	T_CHECK(strstr(said, "tree/fifo: not a regular file (a FIFO), skipped") != NULL);
	T_CHECK(absent(at("%s/%s", "out/d/dangling")) && absent(at("%s/%s", "out/d/loop1")) && absent(at("%s/%s", "out/d/fifo")));
	/* 6 ways out, a dangling link, two of a loop, a FIFO; sub/up, self, sub_link/up: links back up. */
	T_CHECK(c.rep.skipped == 6 + 1 + 2 + 1 + 3);
	T_CHECK(!strstr(text(at("%s/%s", "out/d/creds")), "SECRET"));
	return t_failures != f0;
}

/* Links inside the tree are copied as the files they lead to; a link back up is walked once, never again. */
static int test_links_inside_are_copied_as_their_targets(void)
{
	struct t_call c = { src_dir, NULL, SLUICE_COPY_RECURSIVE, SLUICE_COPY_REPORT_INIT };
	struct stat st;
	int f0 = t_failures;

	make_tree();
	c.dst = at("%s/%s", "out/d");
	alarm(60);
	T_CHECK(t_run(&c) == 0);
	alarm(0);
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/a")), "A") && !strcmp(text(at("%s/%s", "out/d/sub/f")), "F"));
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/rel_in")), "F") && !strcmp(text(at("%s/%s", "out/d/abs_in")), "F"));
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/sub/up_a")), "A"));
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/sub_link/f")), "F"));
	/* Regular files, not links, in the copy. */
	T_CHECK(lstat(at("%s/%s", "out/d/abs_in"), &st) == 0 && S_ISREG(st.st_mode));
	T_CHECK(lstat(at("%s/%s", "out/d/sub_link"), &st) == 0 && S_ISDIR(st.st_mode));
	/* "self" (.) and "sub/up" (..) lead back to a directory above: the tree is copied once. */
	T_CHECK(absent(at("%s/%s", "out/d/self")) && absent(at("%s/%s", "out/d/sub/up")));
	/* a, sub/f, rel_in, abs_in, sub/up_a, sub_link/f, sub_link/up_a. */
	T_CHECK(c.rep.files == 7);
	return t_failures != f0;
}

/* SLUICE_COPY_LINKS: links inside stay links, relative, leading to the same file in the copy. */
static int test_links_kept_as_links(void)
{
	struct t_call c = { src_dir, NULL, SLUICE_COPY_RECURSIVE | SLUICE_COPY_LINKS, SLUICE_COPY_REPORT_INIT };
	char l[PATH_MAX];
	ssize_t n;
	int f0 = t_failures;

	make_tree();
	c.dst = at("%s/%s", "out/d");
	T_CHECK(t_run(&c) == 0);
	T_CHECK((n = readlink(at("%s/%s", "out/d/rel_in"), l, sizeof(l) - 1)) > 0 && (l[n] = 0, !strcmp(l, "sub/f")));
	/* The absolute link into the tree becomes a relative one into the copy (not back into the source). */
	T_CHECK((n = readlink(at("%s/%s", "out/d/abs_in"), l, sizeof(l) - 1)) > 0 && (l[n] = 0, !strcmp(l, "sub/f")));
	T_CHECK((n = readlink(at("%s/%s", "out/d/sub/up_a"), l, sizeof(l) - 1)) > 0 && (l[n] = 0, !strcmp(l, "../a")));
	T_CHECK((n = readlink(at("%s/%s", "out/d/sub_link"), l, sizeof(l) - 1)) > 0 && (l[n] = 0, !strcmp(l, "sub")));
	T_CHECK((n = readlink(at("%s/%s", "out/d/self"), l, sizeof(l) - 1)) > 0 && (l[n] = 0, !strcmp(l, ".")));
	T_CHECK((n = readlink(at("%s/%s", "out/d/sub/up"), l, sizeof(l) - 1)) > 0 && (l[n] = 0, !strcmp(l, "..")));
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/abs_in")), "F"));
	for (size_t i = 0; i < sizeof(leaving) / sizeof(leaving[0]); i++)
		T_CHECK(absent(at("%s/out/d/%s", leaving[i])));
	/* Into a store of files alone: refused before anything is copied, saying why. */
	c.dst = "s3://t-copy-never/x/";
	T_CHECK(t_run(&c) == -EOPNOTSUPP && strstr(sluice_last_error_detail(), "links cannot be kept"));
	c.dst = "http://127.0.0.1:9/dav/";
	T_CHECK(t_run(&c) == -EOPNOTSUPP && strstr(sluice_last_error_detail(), "symbolic links"));
	return t_failures != f0;
}

/* SLUICE_COPY_FOLLOW takes links out of the tree too, as their targets. */
static int test_follow_copies_links_out(void)
{
	struct t_call c = { src_dir, NULL, SLUICE_COPY_RECURSIVE | SLUICE_COPY_FOLLOW, SLUICE_COPY_REPORT_INIT };
	int f0 = t_failures;

	make_tree();
	c.dst = at("%s/%s", "out/d");
	T_CHECK(t_run(&c) == 0);
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/creds")), "SECRET") && !strcmp(text(at("%s/%s", "out/d/dotdot")), "SECRET"));
	T_CHECK(!strcmp(text(at("%s/%s", "out/d/dir_out/inner")), "SECRET-INNER"));
	T_CHECK(absent(at("%s/%s", "out/d/dangling")));
	return t_failures != f0;
}

/* Swapped in after the listing: a file for a link out, a directory for a link to one outside. */
static int t_swap_mode;

static void t_swap(void)
{
	if (t_swap_mode == 0) {
		unlink(at("%s/%s", "tree/a"));
		T_CHECK(symlink(at("%s/%s", "outside/secret"), at("%s/%s", "tree/a")) == 0);
	} else {
		char cmd[1300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s/tree/sub' && mkdir -p '%s/outside/sub' && echo SECRET > "
			 "'%s/outside/sub/f' && ln -s '%s/outside/sub' '%s/tree/sub'", dir, dir, dir, dir, dir);
		T_CHECK(system(cmd) == 0);
	}
}

static int test_a_link_swapped_in_after_listing_is_refused(void)
{
	int f0 = t_failures;

	for (t_swap_mode = 0; t_swap_mode < 2; t_swap_mode++) {
		struct t_call c = { src_dir, NULL, SLUICE_COPY_RECURSIVE, SLUICE_COPY_REPORT_INIT };
		int rc;

		make_tree();
		c.dst = at("%s/%s", "out/d");
		sl__test_copy_listed = t_swap;
		rc = t_run(&c);
		sl__test_copy_listed = NULL;
		T_CHECK(rc == -ELOOP && strstr(sluice_last_error_detail(), "symbolic link now"));
		T_CHECK(!strstr(text(at("%s/%s", "out/d/a")), "SECRET") && !strstr(text(at("%s/%s", "out/d/sub/f")), "SECRET"));
	}
	return t_failures != f0;
}

/* A pid no process has: a child's, reaped. */
static pid_t gone_pid(void)
{
	pid_t p = fork();

	if (p == 0)
		_exit(0);
	waitpid(p, NULL, 0);
	return p;
}

static void t_die(void)
{
	raise(SIGKILL);
}

/*
 * A copy killed between its temporary's last byte and its rename leaves
 * it whole; the next copy to the same name removes it (and any other of a
 * writer gone), never a live copy's nor another user's.
 */
static int test_killed_copies_temporaries_are_removed(void)
{
	char host[64] = "host", name[900];
	int f0 = t_failures, status;
	struct stat st;
	pid_t kid, dead = gone_pid();
	DIR *d;
	struct dirent *e;
	unsigned left = 0;

	gethostname(host, sizeof(host) - 1);
	for (char *h = host; *h; h++)
		if (*h == '/' || *h == '-')
			*h = '_';
	mkdir(at("%s/%s", "k"), 0755);
	free(t_make_file(at("%s/%s", "k/big.src"), 4 << 20, 7));
	if ((kid = fork()) == 0) {
		sl__test_part_written = t_die;
		_exit(sluice_copy(at("%s/%s", "k/big.src"), at("%s/%s", "k/big"), 0, NULL) == 0 ? 3 : 4);
	}
	T_CHECK(waitpid(kid, &status, 0) == kid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	T_CHECK(absent(at("%s/%s", "k/big")));
	/* Another temporary of a writer gone, one of a live writer (this process), and one of another user. */
	snprintf(name, sizeof(name), "%s/k/.big.sluice-tmp-%s-%d-0", dir, host, (int)dead);
	put(name, "dead");
	snprintf(name, sizeof(name), "%s/k/.big.sluice-tmp-%s-%d-99", dir, host, (int)getpid());
	put(name, "live");
	snprintf(name, sizeof(name), "%s/k/.big.sluice-tmp-%s-%d-1", dir, host, (int)dead);
	put(name, "theirs");
	if (geteuid() == 0)
		T_CHECK(chown(name, 4242, 4242) == 0);
	T_CHECK(sluice_copy(at("%s/%s", "k/big.src"), at("%s/%s", "k/big"), 0, NULL) == 0);
	T_CHECK(stat(at("%s/%s", "k/big"), &st) == 0 && st.st_size == 4 << 20);
	d = opendir(at("%s/%s", "k"));
	while (d && (e = readdir(d))) {
		if (!strstr(e->d_name, ".sluice-tmp-"))
			continue;
		left++;
		snprintf(name, sizeof(name), "%d-99", (int)getpid());
		T_CHECK(strstr(e->d_name, name) || (geteuid() == 0 && strstr(e->d_name, "-1")));
	}
	if (d)
		closedir(d);
	T_CHECK(left == (geteuid() == 0 ? 2u : 1u));
	return t_failures != f0;
}

struct t_told {
	uint64_t last, total, calls, files_done, files;
	int returned, out_of_order;
};

static void t_tell(uint64_t bytes, uint64_t total, uint64_t files_done, uint64_t files, void *arg)
{
	struct t_told *t = arg;

	t->out_of_order |= bytes < t->last || t->returned || (total && bytes > total);
	t->last = bytes;
	t->total = total;
	t->files_done = files_done;
	t->files = files;
	t->calls++;
}

/* Progress: never backwards, never past the total, ending at it; nothing after the call returns. */
static int test_progress_is_told_in_order(void)
{
	struct t_told t = { 0 };
	int f0 = t_failures;

	mkdir(at("%s/%s", "p"), 0755);
	mkdir(at("%s/%s", "p/src"), 0755);
	for (int i = 0; i < 6; i++) {
		char n[32];

		snprintf(n, sizeof(n), "p/src/f%d", i);
		free(t_make_file(at("%s/%s", n), (size_t)(3 + i) << 20, (uint64_t)i));
	}
	T_CHECK(sluice_copy_with_progress(at("%s/%s", "p/src"), at("%s/%s", "p/dst"), SLUICE_COPY_RECURSIVE, NULL, t_tell,
					  &t) == 0);
	t.returned = 1;
	usleep(300 * 1000);
	T_CHECK(!t.out_of_order && t.calls >= 1);
	T_CHECK(t.total == 33u << 20 && t.last == t.total && t.files_done == 6 && t.files == 6);
	return t_failures != f0;
}

/* A source written to between its copy's first byte and its rename: refused, never renamed into place. */
static void t_append(void)
{
	FILE *f = fopen(at("%s/%s", "c/src.bin"), "a");

	T_CHECK(f && fputs("more", f) >= 0 && fclose(f) == 0);
}

static int test_a_source_changed_while_copied_is_refused(void)
{
	int f0 = t_failures, rc;

	mkdir(at("%s/%s", "c"), 0755);
	free(t_make_file(at("%s/%s", "c/src.bin"), 1 << 20, 9));
	sl__test_part_written = t_append;
	rc = sluice_copy(at("%s/%s", "c/src.bin"), at("%s/%s", "c/dst.bin"), 0, NULL);
	sl__test_part_written = NULL;
	T_CHECK(rc == -ESTALE && strstr(sluice_last_error_detail(), "changed while it was copied"));
	T_CHECK(absent(at("%s/%s", "c/dst.bin")));
	return t_failures != f0;
}

/*
 * Links inside a tree that lead to the same directories again and again
 * (each level's a and b to the next: 2^30 paths after 30 levels) end with
 * an error naming the tree, not a walk that never ends; and a link's name
 * with escape sequences reaches stderr as \xHH, never as them.
 */
static int test_links_that_multiply_a_tree_are_bounded(void)
{
	struct t_call c = { NULL, NULL, SLUICE_COPY_RECURSIVE, SLUICE_COPY_REPORT_INIT };
	char d[700], l[720], t[64];
	const char *said;
	int f0 = t_failures, rc;

	mkdir(at("%s/%s", "m"), 0755);
	for (int i = 0; i <= 30; i++) {
		snprintf(d, sizeof(d), "%s/m/d%d", dir, i);
		mkdir(d, 0755);
		for (int k = 0; i < 30 && k < 2; k++) {
			snprintf(l, sizeof(l), "%s/%c", d, "ab"[k]);
			snprintf(t, sizeof(t), "../d%d", i + 1);
			T_CHECK(symlink(t, l) == 0);
		}
	}
	put(at("%s/%s", "m/d30/leaf"), "L");
	T_CHECK(symlink("/etc/passwd", at("%s/%s", "m/d30/\033]0;owned\007")) == 0);
	c.src = at("%s/%s", "m");
	c.dst = at("%s/%s", "out/m");
	sl__test_tree_max = 5000;
	alarm(60);
	rc = t_run(&c);
	alarm(0);
	T_CHECK(rc == -E2BIG && strstr(sluice_last_error_detail(), "more than 5000 files and directories"));
	/* The deepest level alone: its one link out named printably. */
	c.src = at("%s/%s", "m/d30");
	c.dst = at("%s/%s", "out/m30");
	said = said_during(t_run, &c, &rc);
	sl__test_tree_max = 0;
	T_CHECK(rc == 0 && strstr(said, "d30/\\x1b]0;owned\\x07: links out of") && !strchr(said, '\033'));
	return t_failures != f0;
}

static const struct {
	const char *name;
	int (*fn)(void);
} tests[] = {
	{ "links out of the tree are skipped and named", test_links_out_of_the_tree_are_skipped_and_named },
	{ "links inside are copied as their targets", test_links_inside_are_copied_as_their_targets },
	{ "links kept as links", test_links_kept_as_links },
	{ "follow copies links out", test_follow_copies_links_out },
	{ "a link swapped in after listing is refused", test_a_link_swapped_in_after_listing_is_refused },
	{ "killed copies' temporaries are removed", test_killed_copies_temporaries_are_removed },
	{ "progress is told in order", test_progress_is_told_in_order },
	{ "a source changed while copied is refused", test_a_source_changed_while_copied_is_refused },
	{ "links that multiply a tree are bounded", test_links_that_multiply_a_tree_are_bounded },
};

int main(void)
{
	dir = t_dir("t_copy");
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
		if (tests[i].fn())
			fprintf(stderr, "t_copy: FAILED: %s\n", tests[i].name);
	return t_done("t_copy");
}
