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

void t_loader_epoch(struct sluice_dataset *ds, uint32_t B, uint64_t window_bytes)
{
	struct sluice_engine *eng = t_engine();
	struct sluice_loader_options o = { .size = sizeof(struct sluice_loader_options), .batch_size = B, .seed = 3, .shuffle = 1, .window_bytes = window_bytes };
	struct sluice_loader *ld = NULL;
	struct sluice_batch b = SLUICE_BATCH_INIT;
	struct sluice_record rec;
	const uint64_t n = sluice_dataset_count(ds);
	const size_t cap = 1 << 20;
	unsigned char *once = calloc(n ? n : 1, 1);
	char *buf = malloc(cap);
	uint64_t seen = 0;
	int rc = -1;

	T_CHECK(sluice_loader_open(&ld, eng, ds, &o) == 0);
	while (ld && (rc = sluice_loader_next(ld, &b, NULL)) == 1)
		for (uint32_t j = 0; j < b.size; j++) {
			uint64_t id = b.ids[j];

			T_CHECK(id < n && sluice_dataset_read(ds, id, buf, cap, &rec) >= 0);
			if (id >= n)
				continue;
			seen += !once[id];
			once[id] = 1;
			for (unsigned k = 0; k < b.nfields; k++) {
				const struct sluice_batch_field *f = &b.field[k];
				size_t es = sluice_dtype_size(f->dtype); /* offsets count elements */
				const char *p = (const char *)f->data + (f->item_bytes ? j * f->item_bytes : f->offsets[j] * es);
				size_t len = f->item_bytes ? f->item_bytes : (f->offsets[j + 1] - f->offsets[j]) * es;
				unsigned fi = 0;

				while (fi + 1 < sluice_dataset_nfields(ds) && strcmp(sluice_dataset_field(ds, fi)->name, f->name))
					fi++;
				T_CHECK(len == rec.len[fi] && !memcmp(p, rec.data[fi], len));
			}
		}
	T_CHECK(rc == 0 && seen == n);
	sluice_loader_close(ld);
	sluice_engine_close(eng);
	free(once);
	free(buf);
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
