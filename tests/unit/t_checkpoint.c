/*
 * Durable, atomic whole-file writes (sluice_write_from_gpu with host
 * memory; tests/gpu covers device memory): exact contents, permissions,
 * no temporary left behind, errors that leave the old file intact, and
 * kill -9 in the middle of a write.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "t_util.h"

static const char *dir;

/* Counts (and with rm set, removes) temporaries left in the test directory. */
static int count_temps(int rm)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d))) {
		if (!strstr(e->d_name, ".sluice-tmp-"))
			continue;
		n++;
		if (rm) {
			char p[900];

			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			unlink(p);
		}
	}
	if (d)
		closedir(d);
	return n;
}

static void t_basic(struct sluice_engine *eng)
{
	const size_t n = (5u << 20) + 3;
	char path[600], *src = malloc(n), *back;
	struct sluice_xfer_report rep = SLUICE_XFER_REPORT_INIT;
	struct stat st;
	size_t got;
	mode_t um = umask(022);

	snprintf(path, sizeof(path), "%s/ckpt.bin", dir);
	t_fill(src, n, 1);
	T_CHECK(sluice_write_from_gpu(eng, path, src, n, &rep) == (ssize_t)n);
	T_CHECK(rep.bytes == n);
	back = t_slurp(path, &got);
	T_CHECK(back && got == n && !memcmp(back, src, n));
	free(back);
	T_CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
	T_CHECK(count_temps(0) == 0);
	/* A new file's mode is the kernel's 0666 under the umask (which the write never touches). */
	snprintf(path, sizeof(path), "%s/ckpt027.bin", dir);
	umask(027);
	T_CHECK(sluice_write_from_gpu(eng, path, src, 100, NULL) == 100);
	T_CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0640 && umask(022) == 027);
	snprintf(path, sizeof(path), "%s/ckpt.bin", dir);

	/* Overwrite keeps the old permissions; a smaller file is exact. */
	T_CHECK(chmod(path, 0600) == 0);
	t_fill(src, n, 2);
	T_CHECK(sluice_write_from_gpu(eng, path, src, 4097, NULL) == 4097);
	back = t_slurp(path, &got);
	T_CHECK(back && got == 4097 && !memcmp(back, src, 4097));
	free(back);
	T_CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	T_CHECK(sluice_write_from_gpu(eng, path, src, 0, NULL) == 0);
	T_CHECK(stat(path, &st) == 0 && st.st_size == 0);

	/* A missing directory is named. */
	snprintf(path, sizeof(path), "%s/no/such/dir/x.bin", dir);
	T_CHECK(sluice_write_from_gpu(eng, path, src, 10, NULL) == -ENOENT);
	T_CHECK(strstr(sluice_last_error_detail(), "no/such/dir") != NULL);
	umask(um);
	free(src);
}

/* A write that runs out of room fails cleanly: old file intact, no temporary. */
static void t_no_space(struct sluice_engine *eng)
{
	char path[600], *old, *src = malloc(8u << 20), *back;
	struct rlimit rl, save;
	size_t got;

	snprintf(path, sizeof(path), "%s/full.bin", dir);
	old = t_make_file(path, 100000, 3);
	t_fill(src, 8u << 20, 4);
	/* RLIMIT_FSIZE makes the filesystem refuse growth past 1 MiB (EFBIG). */
	signal(SIGXFSZ, SIG_IGN);
	getrlimit(RLIMIT_FSIZE, &save);
	rl = save;
	rl.rlim_cur = 1u << 20;
	T_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
	ssize_t rc = sluice_write_from_gpu(eng, path, src, 8u << 20, NULL);
	T_CHECK(setrlimit(RLIMIT_FSIZE, &save) == 0);
	T_CHECK(rc == -EFBIG);
	T_CHECK(strstr(sluice_last_error_detail(), "full.bin") != NULL);
	back = t_slurp(path, &got);
	T_CHECK(back && got == 100000 && !memcmp(back, old, got));
	T_CHECK(count_temps(0) == 0);
	free(back);
	free(old);
	free(src);
}

/* kill -9 at random moments: the file is always wholly old or wholly new. */
static void t_kill(void)
{
	const size_t n = 48u << 20;
	char path[600], *old, *neu = malloc(n), *back;
	int saw_new = 0, saw_old = 0;

	snprintf(path, sizeof(path), "%s/kill.bin", dir);
	old = t_make_file(path, n, 5);
	t_fill(neu, n, 6);
	for (int round = 0; round < 8; round++) {
		pid_t pid = fork();

		if (pid == 0) {
			struct sluice_engine *eng = t_engine();

			for (;;)
				if (sluice_write_from_gpu(eng, path, neu, n, NULL) != (ssize_t)n)
					_exit(3);
		}
		struct timespec ts = { 0, (long)(5 + round * 17) * 1000000L };

		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		int status;

		waitpid(pid, &status, 0);
		T_CHECK(WIFSIGNALED(status));
		size_t got;

		back = t_slurp(path, &got);
		T_CHECK(back && got == n);
		if (back && got == n) {
			int is_old = !memcmp(back, old, n), is_new = !memcmp(back, neu, n);

			T_CHECK(is_old || is_new);
			saw_old |= is_old;
			saw_new |= is_new;
		}
		free(back);
	}
	/* A killed writer leaves its hidden temporary behind, never a torn target. */
	printf("kill -9 rounds: file seen old=%d new=%d, never torn; %d temporaries left by killed writers\n",
	       saw_old, saw_new, count_temps(0));
	free(old);
	free(neu);
}

/*
 * A target that exists and is not a regular file (FIFO, socket, directory,
 * device) is refused, naming it, before any temporary is made: a rename
 * would replace the node (as root, /dev/null) with a regular file.
 */
static void t_special_target(struct sluice_engine *eng)
{
	static const char *const kinds[] = { "fifo", "sock", "dir", "chr" };
	char src[16] = "0123456789abcdef";

	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		char path[600];
		struct stat st;
		int made, s = -1;

		snprintf(path, sizeof(path), "%s/special-%s", dir, kinds[i]);
		if (i == 0) {
			made = mkfifo(path, 0600) == 0;
		} else if (i == 1) {
			struct sockaddr_un a = { .sun_family = AF_UNIX };

			s = socket(AF_UNIX, SOCK_STREAM, 0);
			made = s >= 0 && strlen(path) < sizeof(a.sun_path);
			if (made)
				memcpy(a.sun_path, path, strlen(path) + 1);
			made = made && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
		} else if (i == 2) {
			made = mkdir(path, 0700) == 0;
		} else {
			made = mknod(path, S_IFCHR | 0600, makedev(1, 3)) == 0; /* root only: /dev/null's numbers */
		}
		if (!made) {
			printf("special target %s: cannot be made here, not tried\n", kinds[i]);
			if (s >= 0)
				close(s);
			continue;
		}
		T_CHECK(sluice_write_from_gpu(eng, path, src, sizeof(src), NULL) < 0);
		T_CHECK(strstr(sluice_last_error_detail(), path) != NULL &&
			strstr(sluice_last_error_detail(), "not a regular file") != NULL);
		T_CHECK(lstat(path, &st) == 0 && !S_ISREG(st.st_mode));
		T_CHECK(count_temps(0) == 0);
		if (s >= 0)
			close(s);
		if (i == 2)
			rmdir(path);
		else
			unlink(path);
	}
}

int main(void)
{
	struct sluice_engine *eng;

	dir = t_dir("t_checkpoint");
	t_kill(); /* before any engine exists: fork() with threads is unsafe */
	eng = t_engine();
	/* The next write of the target removes what killed writers left. */
	{
		char path[600], *src = malloc(4096);

		snprintf(path, sizeof(path), "%s/kill.bin", dir);
		t_fill(src, 4096, 7);
		T_CHECK(sluice_write_from_gpu(eng, path, src, 4096, NULL) == 4096);
		T_CHECK(count_temps(0) == 0);
		free(src);
	}
	t_basic(eng);
	t_no_space(eng);
	t_special_target(eng);
	sluice_engine_close(eng);
	return t_done("t_checkpoint");
}
