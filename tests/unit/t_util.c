#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t_util.h"

int t_failures;

static char t_dir_made[512];

const char *t_dir(const char *name)
{
	char *buf = t_dir_made;
	const char *base = getenv("SLUICE_TEST_DIR");
	const char *be = getenv("SLUICE_BACKEND");
	char cmd[600];

	snprintf(buf, sizeof(t_dir_made), "%s/%s-%s-%d", base ? base : "/tmp", name, be ? be : "auto", (int)getpid());
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", buf);
	if (system(cmd) != 0)
		exit(1);
	if (mkdir(buf, 0755) < 0) {
		perror(buf);
		exit(1);
	}
	return buf;
}

void t_fill(void *p, size_t n, uint64_t seed)
{
	unsigned char *c = p;

	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		c[i] = (unsigned char)(seed >> 56);
	}
}

char *t_make_file(const char *path, size_t n, uint64_t seed)
{
	char *d = malloc(n ? n : 1);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	if (!d || fd < 0) {
		perror(path);
		exit(1);
	}
	t_fill(d, n, seed);
	if (n && write(fd, d, n) != (ssize_t)n) {
		perror(path);
		exit(1);
	}
	close(fd);
	return d;
}

char *t_slurp(const char *path, size_t *n)
{
	struct stat st;
	int fd = open(path, O_RDONLY);
	char *d;

	if (fd < 0 || fstat(fd, &st) < 0)
		return NULL;
	d = malloc((size_t)st.st_size + 1);
	*n = (size_t)st.st_size;
	if (!d || pread(fd, d, *n, 0) != (ssize_t)*n) {
		close(fd);
		free(d);
		return NULL;
	}
	close(fd);
	return d;
}

struct sluice_engine *t_engine(void)
{
	struct sluice_engine *eng;
	int rc = sluice_engine_open(&eng, NULL);

	if (rc == SLUICE_EBACKEND) {
		printf("SKIP: backend unusable here: %s\n", sluice_last_error_detail());
		exit(T_SKIP);
	}
	if (rc) {
		fprintf(stderr, "engine_open: %s: %s\n", sluice_strerror(rc), sluice_last_error_detail());
		exit(1);
	}
	return eng;
}

int t_done(const char *name)
{
	if (t_failures) {
		printf("%s: FAIL (%d checks)\n", name, t_failures);
		return 1;
	}
	printf("%s: PASS\n", name);
	if (t_dir_made[0]) {
		/* A passing test leaves nothing behind; a failing one keeps its files to look at. */
		char cmd[600];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t_dir_made);
		if (system(cmd) != 0)
			return 1;
	}
	return 0;
}
