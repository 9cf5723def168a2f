/*
 * sluice pack: turn a tree of small files, or any dataset sluice reads
 * (WebDataset tars, Megatron .bin/.idx, sluice shards), into sluice shards.
 *
 * --from PATH: copies every record of the dataset at PATH, with its fields,
 * in order.
 *
 * --from-dir DIR: ImageFolder layout, as torchvision takes it (see
 * walk_imagefolder).  Each file is a record with fields "data" (the
 * bytes), "label" (i64, its class's index) and "key" (the path relative to
 * DIR).  Files directly in DIR, with no subdirectories, give records
 * without a label.  The order is fixed by the names, so the output is the
 * same on every run; files are read by several threads.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CMD "pack"

struct item {
	char *rel;     /* path relative to DIR */
	int64_t label;
};

struct list {
	struct item *v;
	size_t n, cap;
};

struct st_list {
	char **v;
	size_t n, cap;
};

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add_item(struct list *l, char *rel, int64_t label)
{
	if (l->n == l->cap) {
		struct item *t = realloc(l->v, (l->cap = l->cap ? 2 * l->cap : 1024) * sizeof(*t));

		if (!t)
			return -1;
		l->v = t;
	}
	l->v[l->n++] = (struct item){ rel, label };
	return 0;
}

/*
 * --from-dir walks the tree as torchvision.datasets.ImageFolder does, so
 * that a model trained from either sees the same samples and labels: the
 * classes are every subdirectory of DIR (hidden ones too), sorted, label =
 * index; a class's samples are the files of each directory below it,
 * directories in the order of their sorted paths (as sorted(os.walk())),
 * files sorted within each; only files with an image extension
 * (torchvision's IMG_EXTENSIONS, any case) unless --all-files.  Symbolic
 * links are followed within DIR; one that leads out of it is skipped
 * unless --follow-symlinks, a dangling one skipped, each with a warning.
 */
struct walker {
	const char *root;
	char real[4096];      /* DIR's real path: links must land under it */
	int all_files, follow;
	unsigned skipped;
	struct { dev_t dev; ino_t ino; } seen[256]; /* the directories on the current path: loops */
	unsigned depth;
};

static int image_name(const char *name)
{
	static const char *const ext[] = { ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp" };
	size_t l = strlen(name);

	for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++)
		if (l >= strlen(ext[i]) && !strcasecmp(name + l - strlen(ext[i]), ext[i]))
			return 1;
	return 0;
}

/*
 * stat(2) of path as the walk may use it: 1 to use it, 0 to skip it (a
 * dangling link, one leading out of DIR: warned), -1 on another error.
 */
static int walk_stat(struct walker *wk, const char *path, struct stat *st)
{
	struct stat ls;
	char real[4096];
	size_t rl = strlen(wk->real);

	if (lstat(path, &ls) < 0)
		return -1;
	if (!S_ISLNK(ls.st_mode)) {
		*st = ls;
		return 1;
	}
	if (stat(path, st) < 0 || !realpath(path, real)) {
		fprintf(stderr, "sluice pack: warning: %s: a dangling link, skipped\n", path);
		wk->skipped++;
		return 0;
	}
	if (!wk->follow && !(strncmp(real, wk->real, rl) == 0 && (real[rl] == '/' || !real[rl]))) {
		fprintf(stderr, "sluice pack: warning: %s: links out of %s (to %s), skipped (--follow-symlinks "
			"takes it)\n", path, wk->root, real);
		wk->skipped++;
		return 0;
	}
	return 1;
}

/* Sorted names of dir's entries but . and ..; NULL on error (errno). */
static char **dir_names(const char *path, size_t *n)
{
	DIR *d = opendir(path);
	struct dirent *e;
	char **v = NULL;
	size_t cap = 0;

	*n = 0;
	if (!d)
		return NULL;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (*n == cap) {
			char **t = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof(*v));

			if (!t)
				break;
			v = t;
		}
		v[(*n)++] = strdup(e->d_name);
	}
	closedir(d);
	if (v)
		qsort(v, *n, sizeof(*v), cmp_str);
	else
		v = calloc(1, sizeof(*v));
	return v;
}

static void free_names(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

/* Appends rel and every directory below it (relative to root, links followed as walk_stat allows) to dirs. */
static int walk_dirs(struct walker *wk, const char *rel, struct st_list *dirs)
{
	char *path, **names;
	size_t n;
	struct stat st;
	int rc = 0;

	if (asprintf(&path, "%s/%s", wk->root, rel) < 0)
		return cli_fail(CMD, "out of memory");
	if (stat(path, &st) == 0) {
		for (unsigned k = 0; k < wk->depth; k++)
			if (wk->seen[k].dev == st.st_dev && wk->seen[k].ino == st.st_ino) {
				fprintf(stderr, "sluice pack: warning: %s: a link back to a directory above it, skipped\n", path);
				wk->skipped++;
				free(path);
				return 0;
			}
	}
	if (wk->depth == sizeof(wk->seen) / sizeof(wk->seen[0])) {
		free(path);
		return cli_fail(CMD, "%s/%s: directories nested over %u deep", wk->root, rel, wk->depth);
	}
	wk->seen[wk->depth].dev = st.st_dev;
	wk->seen[wk->depth++].ino = st.st_ino;
	if (dirs->n == dirs->cap) {
		char **t = realloc(dirs->v, (dirs->cap = dirs->cap ? 2 * dirs->cap : 64) * sizeof(*t));

		if (!t) {
			free(path);
			return cli_fail(CMD, "out of memory");
		}
		dirs->v = t;
	}
	dirs->v[dirs->n++] = strdup(rel);
	names = dir_names(path, &n);
	if (!names)
		rc = cli_fail(CMD, "%s: %s", path, strerror(errno));
	for (size_t i = 0; i < n && !rc; i++) {
		char *r = NULL, *p = NULL;
		int use;

		if (asprintf(&r, "%s/%s", rel, names[i]) < 0 || asprintf(&p, "%s/%s", wk->root, r) < 0)
			rc = cli_fail(CMD, "out of memory");
		else if ((use = walk_stat(wk, p, &st)) < 0)
			rc = cli_fail(CMD, "%s: %s", p, strerror(errno));
		else if (use && S_ISDIR(st.st_mode))
			rc = walk_dirs(wk, r, dirs);
		free(r);
		free(p);
	}
	free_names(names, n);
	free(path);
	wk->depth--;
	return rc;
}

/* The samples of one class (or of DIR itself, rel ""), in torchvision's order. */
static int walk_class(struct walker *wk, const char *rel, int64_t label, struct list *l)
{
	struct st_list dirs = { 0 };
	int rc = *rel ? walk_dirs(wk, rel, &dirs) : 0;

	if (!*rel)
		dirs.v = calloc(1, sizeof(char *)), dirs.v[0] = strdup(""), dirs.n = 1;
	qsort(dirs.v, dirs.n, sizeof(*dirs.v), cmp_str);
	for (size_t d = 0; d < dirs.n && !rc; d++) {
		char *path, **names;
		size_t n;

		if (asprintf(&path, "%s/%s", wk->root, dirs.v[d]) < 0)
			return cli_fail(CMD, "out of memory");
		names = dir_names(path, &n);
		if (!names)
			rc = cli_fail(CMD, "%s: %s", path, strerror(errno));
		for (size_t i = 0; i < n && !rc; i++) {
			char *r = NULL, *p = NULL;
			struct stat st;
			int use;

			if (asprintf(&r, "%s%s%s", dirs.v[d], *dirs.v[d] ? "/" : "", names[i]) < 0 ||
			    asprintf(&p, "%s/%s", wk->root, r) < 0) {
				rc = cli_fail(CMD, "out of memory");
			} else if ((use = walk_stat(wk, p, &st)) < 0) {
				rc = cli_fail(CMD, "%s: %s", p, strerror(errno));
			} else if (use && S_ISREG(st.st_mode) && (wk->all_files || image_name(names[i]))) {
				if (add_item(l, r, label))
					rc = cli_fail(CMD, "out of memory");
				else
					r = NULL;
			}
			free(r);
			free(p);
		}
		free_names(names, n);
		free(path);
	}
	free_names(dirs.v, dirs.n);
	return rc;
}

/* A JSON string of s appended to *j (l bytes used, cap). */
static int json_append(char **j, size_t *l, size_t *cap, const char *s, int quote)
{
	for (const char *p = s;; p++) {
		char e[8];
		size_t k = 0;

		if (*l + 8 >= *cap) {
			char *t = realloc(*j, *cap = *cap ? 2 * *cap : 4096);

			if (!t)
				return -1;
			*j = t;
		}
		if (!*p)
			break;
		if (!quote)
			e[k++] = *p;
		else if (*p == '"' || *p == '\\')
			e[k++] = '\\', e[k++] = *p;
		else if ((unsigned char)*p < 0x20)
			k = (size_t)snprintf(e, sizeof(e), "\\u%04x", (unsigned char)*p);
		else
			e[k++] = *p;
		memcpy(*j + *l, e, k);
		*l += k;
	}
	(*j)[*l] = 0;
	return 0;
}

/*
 * The ImageFolder at wk->root into l; *labelled when it has classes, and
 * then *meta is {"class_to_idx": {...}} (malloc'd) for the dataset.
 */
static int walk_imagefolder(struct walker *wk, struct list *l, int *labelled, char **meta)
{
	size_t n, ml = 0, mcap = 0, ncls = 0;
	char **names = dir_names(wk->root, &n), **cls;
	int rc = 0;

	*labelled = 0;
	*meta = NULL;
	if (!names)
		return cli_fail(CMD, "%s: %s", wk->root, strerror(errno));
	if (!realpath(wk->root, wk->real)) {
		free_names(names, n);
		return cli_fail(CMD, "%s: %s", wk->root, strerror(errno));
	}
	cls = calloc(n + 1, sizeof(char *));
	for (size_t i = 0; cls && i < n && !rc; i++) {
		char *p;
		struct stat st;
		int use;

		if (asprintf(&p, "%s/%s", wk->root, names[i]) < 0) {
			rc = cli_fail(CMD, "out of memory");
			break;
		}
		use = walk_stat(wk, p, &st);
		if (use < 0)
			rc = cli_fail(CMD, "%s: %s", p, strerror(errno));
		else if (use && S_ISDIR(st.st_mode))
			cls[ncls++] = names[i];
		free(p);
	}
	if (!cls)
		rc = cli_fail(CMD, "out of memory");
	*labelled = ncls > 0;
	if (!rc && !ncls)
		rc = walk_class(wk, "", 0, l);
	if (!rc && ncls && json_append(meta, &ml, &mcap, "{\"class_to_idx\": {", 0))
		rc = cli_fail(CMD, "out of memory");
	for (size_t c = 0; c < ncls && !rc; c++) {
		size_t before = l->n;
		char idx[32];

		rc = walk_class(wk, cls[c], (int64_t)c, l);
		if (!rc && l->n == before)
			fprintf(stderr, "sluice pack: warning: class '%s' (label %zu) has no %sfiles\n", cls[c], c,
				wk->all_files ? "" : "image ");
		snprintf(idx, sizeof(idx), "\": %zu%s", c, c + 1 < ncls ? ", " : "}}");
		if (!rc && (json_append(meta, &ml, &mcap, "\"", 0) || json_append(meta, &ml, &mcap, cls[c], 1) ||
			    json_append(meta, &ml, &mcap, idx, 0)))
			rc = cli_fail(CMD, "out of memory");
	}
	if (wk->skipped)
		fprintf(stderr, "sluice pack: %u links skipped (see above)\n", wk->skipped);
	free(cls);
	free_names(names, n);
	return rc;
}

/* Reader threads fill a window of slots; the writer drains them in order. */
struct slot {
	char *data;
	size_t len;
	int err; /* errno of a failed read */
	int ready;
};

struct pack {
	const char *root;
	struct list *items;
	struct slot *slots;
	size_t window;
	_Atomic size_t next;   /* next item to read */
	size_t written;        /* items handed to the writer (lock) */
	int stop;
	size_t main_waits;     /* item the writer sleeps on, or SIZE_MAX (lock) */
	unsigned readers_waiting; /* readers sleeping for room in the window (lock) */
	pthread_mutex_t lock;
	pthread_cond_t ready;  /* the writer waits here for its item */
	pthread_cond_t room;   /* readers wait here for the window to move */
};

static void *reader(void *arg)
{
	struct pack *pk = arg;

	for (;;) {
		size_t i = atomic_fetch_add(&pk->next, 1);
		struct slot *s;
		char *p;
		struct stat st;
		int fd, err = 0;
		char *data = NULL;
		size_t len = 0;

		if (i >= pk->items->n)
			return NULL;
		pthread_mutex_lock(&pk->lock);
		while (i >= pk->written + pk->window && !pk->stop) {
			pk->readers_waiting++;
			pthread_cond_wait(&pk->room, &pk->lock);
			pk->readers_waiting--;
		}
		pthread_mutex_unlock(&pk->lock);
		if (pk->stop)
			return NULL;
		if (asprintf(&p, "%s/%s", pk->root, pk->items->v[i].rel) < 0)
			err = ENOMEM;
		else {
			fd = open(p, O_RDONLY | O_CLOEXEC);
			if (fd < 0 || fstat(fd, &st) < 0)
				err = errno;
			else if (!(data = malloc((size_t)st.st_size + 1)))
				err = ENOMEM;
			else {
				while (len < (size_t)st.st_size) {
					ssize_t r = read(fd, data + len, (size_t)st.st_size - len);

					if (r < 0 && errno == EINTR)
						continue;
					if (r <= 0) {
						err = r < 0 ? errno : EIO;
						break;
					}
					len += (size_t)r;
				}
			}
			if (fd >= 0)
				close(fd);
			free(p);
		}
		s = &pk->slots[i % pk->window];
		pthread_mutex_lock(&pk->lock);
		s->data = data;
		s->len = len;
		s->err = err;
		s->ready = 1;
		/* Wake the writer only if it sleeps on this very item. */
		if (pk->main_waits == i)
			pthread_cond_signal(&pk->ready);
		pthread_mutex_unlock(&pk->lock);
	}
}

/* Converts any readable dataset to sluice shards, record by record, in order. */
static int pack_dataset(const char *from, const char *out, const struct sluice_writer_options *opt, int quiet, int json)
{
	struct sluice_dataset *ds;
	struct sluice_writer *w = NULL;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	unsigned char *buf = NULL;
	size_t cap = 0;
	uint64_t n, bytes = 0;
	struct timespec t0, t1;
	int rc = sluice_dataset_open(&ds, from);

	if (rc)
		return cli_error(CMD, from, rc);
	for (unsigned f = 0; f < sluice_dataset_nfields(ds); f++)
		fields[f] = *sluice_dataset_field(ds, f);
	rc = sluice_writer_open(&w, out, fields, sluice_dataset_nfields(ds), opt);
	if (rc) {
		sluice_dataset_close(ds);
		return cli_error(CMD, out, rc);
	}
	n = sluice_dataset_count(ds);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (uint64_t i = 0; i < n && !rc; i++) {
		struct sluice_record_loc loc;
		struct sluice_record rec;
		ssize_t r;

		if ((rc = sluice_dataset_locate(ds, i, &loc)))
			break;
		if (loc.length > cap) {
			unsigned char *b = realloc(buf, loc.length);

			if (!b) {
				rc = -12;
				break;
			}
			buf = b;
			cap = loc.length;
		}
		r = sluice_dataset_read(ds, i, buf, cap, &rec);
		if (r < 0) {
			rc = (int)r;
			break;
		}
		rc = sluice_writer_add(w, rec.data, rec.len);
		bytes += (uint64_t)r;
		if (!quiet && (i % 10000 == 9999 || i + 1 == n)) {
			fprintf(stderr, "\rsluice pack: %llu/%llu records, %.1f MB", (unsigned long long)(i + 1),
				(unsigned long long)n, (double)bytes / 1e6);
			if (i + 1 == n)
				fputc('\n', stderr);
		}
	}
	free(buf);
	if (rc) {
		sluice_writer_abort(w);
		sluice_dataset_close(ds);
		return cli_error(CMD, from, rc);
	}
	rc = sluice_writer_close(w);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc) {
		sluice_dataset_close(ds);
		return cli_error(CMD, out, rc);
	}
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;

	if (json)
		printf("{\"records\":%llu,\"bytes\":%llu,\"seconds\":%.3f,\"from_format\":\"%s\"}\n", (unsigned long long)n,
		       (unsigned long long)bytes, s, sluice_dataset_format(ds));
	else
		printf("packed %llu %s records (%.1f MB) from %s into %s in %.2f s\n", (unsigned long long)n,
		       sluice_dataset_format(ds), (double)bytes / 1e6, from, out, s);
	sluice_dataset_close(ds);
	return 0;
}

/* JSON lines, one record per non-empty line, fields chosen by key. */
static int pack_jsonl(const char *from, const char *fields_arg, const char *out, const struct sluice_writer_options *opt,
		      int json)
{
	struct sluice_writer *w = NULL;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	const char *names[SLUICE_MAX_FIELDS];
	char *list = strdup(fields_arg ? fields_arg : ""), *save = NULL, *line = NULL;
	unsigned n = 0;
	size_t cap = 0;
	uint64_t lineno = 0;
	ssize_t len;
	int rc = 0;
	FILE *f;

	for (char *t = strtok_r(list, ",", &save); t && n < SLUICE_MAX_FIELDS; t = strtok_r(NULL, ",", &save))
		names[n++] = t;
	if (!n) {
		free(list);
		return cli_fail(CMD, "--from-jsonl needs --fields KEY[,KEY...]");
	}
	f = fopen(from, "r");
	if (!f) {
		free(list);
		return cli_fail(CMD, "%s: %s", from, strerror(errno));
	}
	while (!rc && (len = getline(&line, &cap, f)) >= 0) {
		char *l = line;

		lineno++;
		/* A UTF-8 byte order mark before the first line, as editors on Windows write it. */
		if (lineno == 1 && len >= 3 && !memcmp(l, "\xEF\xBB\xBF", 3))
			l += 3, len -= 3;
		while (len && (l[len - 1] == '\n' || l[len - 1] == '\r' || l[len - 1] == ' ' || l[len - 1] == '\t'))
			len--;
		/* Blank lines (whitespace only) hold no record. */
		if (!len || strspn(l, " \t") >= (size_t)len)
			continue;
		if (!w) {
			rc = sluice_json_schema(l, (size_t)len, names, n, fields);
			if (!rc)
				rc = sluice_writer_open(&w, out, fields, n, opt);
			if (rc) {
				rc = w ? 1 : cli_fail(CMD, "%s:%llu: %s", from, (unsigned long long)lineno, sluice_last_error_detail());
				break;
			}
		}
		if (sluice_writer_add_json(w, l, (size_t)len))
			rc = cli_fail(CMD, "%s:%llu: %s", from, (unsigned long long)lineno, sluice_last_error_detail());
	}
	if (!rc && ferror(f))
		rc = cli_fail(CMD, "%s: %s", from, strerror(errno));
	fclose(f);
	free(line);
	if (!rc && !w)
		rc = cli_fail(CMD, "%s: no records (empty file)", from);
	if (rc) {
		sluice_writer_abort(w);
		free(list);
		return rc;
	}
	uint64_t count = sluice_writer_count(w);

	rc = sluice_writer_close(w);
	if (rc)
		rc = cli_error(CMD, out, rc);
	else if (json)
		printf("{\"records\":%llu,\"from_format\":\"jsonl\"}\n", (unsigned long long)count);
	else
		printf("packed %llu JSON lines from %s into %s\n", (unsigned long long)count, from, out);
	free(list);
	return rc;
}

/* Reads an array file (.npy, or raw .bin of bin_dtype): its dtype, count and data offset. */
static int array_header(const char *path, enum sluice_dtype bin_dtype, enum sluice_dtype *dt, uint64_t *count,
			uint64_t *off)
{
	size_t l = strlen(path);
	struct stat st;
	int rc;

	if (l > 4 && !strcmp(path + l - 4, ".npy")) {
		rc = sluice_npy_header(path, dt, count, off);
		return rc ? cli_error(CMD, path, rc) : 0;
	}
	if (stat(path, &st) < 0)
		return cli_fail(CMD, "%s: %s", path, strerror(errno));
	*dt = bin_dtype;
	*off = 0;
	*count = (uint64_t)st.st_size / sluice_dtype_size(bin_dtype);
	if ((uint64_t)st.st_size % sluice_dtype_size(bin_dtype))
		return cli_fail(CMD, "%s: %lld bytes is not a whole number of %s values", path, (long long)st.st_size,
				sluice_dtype_name(bin_dtype));
	return 0;
}

/*
 * Packed rows (--pack-context L): documents go through sluice's packer and
 * each row becomes one record of input_ids, position_ids and labels (i32
 * [L]) and cu_seqlens (i32, one more than its documents).
 */
struct rows {
	struct sluice_packer *pk;
	int32_t *conv;
	size_t conv_cap;
	uint64_t rows;
};

static const struct sluice_field rows_fields[4] = {
	{ "input_ids", SLUICE_DTYPE_I32, 1, { 0 } },
	{ "position_ids", SLUICE_DTYPE_I32, 1, { 0 } },
	{ "labels", SLUICE_DTYPE_I32, 1, { 0 } },
	{ "cu_seqlens", SLUICE_DTYPE_I32, 1, { -1 } },
};

/* Writes the rows the packer has finished (all of them with flush); errors printed, exit code returned. */
static int rows_drain(struct rows *r, struct sluice_writer *w, const char *out, uint32_t L, int flush)
{
	struct sluice_packed_row row;
	int rc = 0;

	while (!rc && sluice_packer_row(r->pk, &row, flush) == 1) {
		const void *v[4] = { row.input_ids, row.position_ids, row.labels, row.cu_seqlens };
		size_t l[4] = { 4 * (size_t)L, 4 * (size_t)L, 4 * (size_t)L, 4 * ((size_t)row.ndocs + 1) };

		if ((rc = sluice_writer_add(w, v, l)))
			rc = cli_error(CMD, out, rc);
		r->rows++;
	}
	return rc;
}

/* One document of n tokens of dtype dt: to i32, into the packer, finished rows out. */
static int rows_add(struct rows *r, struct sluice_writer *w, const char *out, uint32_t L, const void *tok,
		    size_t n, enum sluice_dtype dt, uint64_t doc)
{
	if (n > r->conv_cap) {
		int32_t *c = realloc(r->conv, n * sizeof(int32_t));

		if (!c)
			return cli_fail(CMD, "out of memory for a document of %zu tokens", n);
		r->conv = c;
		r->conv_cap = n;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t t = dt == SLUICE_DTYPE_U16   ? ((const uint16_t *)tok)[i]
			    : dt == SLUICE_DTYPE_U32 ? ((const uint32_t *)tok)[i]
			    : dt == SLUICE_DTYPE_I32 ? ((const int32_t *)tok)[i]
						     : ((const int64_t *)tok)[i];

		if (t < 0 || t > INT32_MAX)
			return cli_fail(CMD, "document %llu, token %zu: id %lld does not fit an i32 input id",
					(unsigned long long)doc, i, (long long)t);
		r->conv[i] = (int32_t)t;
	}
	if (sluice_packer_add(r->pk, r->conv, n))
		return cli_fail(CMD, "out of memory packing document %llu", (unsigned long long)doc);
	return rows_drain(r, w, out, L, 0);
}

/*
 * Token arrays: one record per document, field "tokens".  Lengths are
 * in tokens, in file order, and must add up to the token count exactly.
 */
static int pack_tokens(const char *tok_path, const char *len_path, const char *dtype_arg, const char *out,
		       const struct sluice_writer_options *opt, const struct sluice_packer_options *po, int json)
{
	enum sluice_dtype bin = !dtype_arg || !strcmp(dtype_arg, "u16") ? SLUICE_DTYPE_U16
				: !strcmp(dtype_arg, "u32")		  ? SLUICE_DTYPE_U32
									  : (enum sluice_dtype)-1;
	enum sluice_dtype tdt, ldt;
	uint64_t ntok, toff, ndoc, loff, sum = 0;
	struct sluice_writer *w = NULL;
	uint64_t *lens = NULL;
	unsigned char *buf = NULL, *raw = NULL;
	size_t cap = 0, es;
	FILE *tf = NULL, *lf = NULL;
	struct rows rows = { 0 };
	int rc;

	if ((int)bin < 0)
		return cli_fail(CMD, "--dtype: '%s' is not u16 or u32", dtype_arg);
	if (!len_path)
		return cli_fail(CMD, "--from-tokens needs --doc-lengths FILE");
	if ((rc = array_header(tok_path, bin, &tdt, &ntok, &toff)) ||
	    (rc = array_header(len_path, SLUICE_DTYPE_I64, &ldt, &ndoc, &loff)))
		return rc;
	if (tdt != SLUICE_DTYPE_U16 && tdt != SLUICE_DTYPE_U32 && tdt != SLUICE_DTYPE_I32 && tdt != SLUICE_DTYPE_I64)
		return cli_fail(CMD, "%s: tokens of dtype %s; sluice packs u16, u32, i32 or i64", tok_path, sluice_dtype_name(tdt));
	if (ldt != SLUICE_DTYPE_U16 && ldt != SLUICE_DTYPE_U32 && ldt != SLUICE_DTYPE_I32 && ldt != SLUICE_DTYPE_I64)
		return cli_fail(CMD, "%s: lengths of dtype %s; use an integer type", len_path, sluice_dtype_name(ldt));
	es = sluice_dtype_size(ldt);
	lens = malloc((ndoc ? ndoc : 1) * sizeof(uint64_t));
	raw = malloc((ndoc ? ndoc : 1) * es);
	lf = fopen(len_path, "rb");
	if (!lens || !raw || !lf || fseeko(lf, (off_t)loff, SEEK_SET) || fread(raw, es, ndoc, lf) != ndoc) {
		rc = cli_fail(CMD, "%s: cannot read %llu lengths", len_path, (unsigned long long)ndoc);
		goto out;
	}
	for (uint64_t d = 0; d < ndoc; d++) {
		int64_t v = 0;

		if (ldt == SLUICE_DTYPE_U16)
			v = ((const uint16_t *)raw)[d];
		else if (ldt == SLUICE_DTYPE_U32)
			v = ((const uint32_t *)raw)[d];
		else if (ldt == SLUICE_DTYPE_I32)
			v = ((const int32_t *)raw)[d];
		else
			memcpy(&v, raw + 8 * d, 8);
		if (v < 0 || (uint64_t)v > ntok) {
			rc = cli_fail(CMD, "%s: document %llu has length %lld", len_path, (unsigned long long)d, (long long)v);
			goto out;
		}
		lens[d] = (uint64_t)v;
		sum += lens[d];
	}
	if (sum != ntok) {
		rc = cli_fail(CMD, "%s: document lengths add up to %llu tokens, %s holds %llu", len_path,
			      (unsigned long long)sum, tok_path, (unsigned long long)ntok);
		goto out;
	}
	struct sluice_field f[1] = { { "tokens", tdt, 1, { -1 } } }, pf[4];

	memcpy(pf, rows_fields, sizeof(pf));
	for (int i = 0; i < 3; i++)
		pf[i].shape[0] = po ? po->context : 0;
	rc = po ? sluice_packer_new(&rows.pk, po) : 0;
	if (!rc)
		rc = po ? sluice_writer_open(&w, out, pf, 4, opt) : sluice_writer_open(&w, out, f, 1, opt);
	if (rc) {
		rc = cli_error(CMD, out, rc);
		goto out;
	}
	tf = fopen(tok_path, "rb");
	if (!tf || fseeko(tf, (off_t)toff, SEEK_SET)) {
		rc = cli_fail(CMD, "%s: %s", tok_path, strerror(errno));
		goto out;
	}
	es = sluice_dtype_size(tdt);
	for (uint64_t d = 0; d < ndoc && !rc; d++) {
		size_t n = (size_t)lens[d] * es;
		const void *v[1];

		if (n > cap) {
			unsigned char *b = realloc(buf, n);

			if (!b) {
				rc = cli_fail(CMD, "out of memory for a document of %zu bytes", n);
				break;
			}
			buf = b;
			cap = n;
		}
		if (n && fread(buf, 1, n, tf) != n) {
			rc = cli_fail(CMD, "%s: ends inside document %llu", tok_path, (unsigned long long)d);
			break;
		}
		v[0] = buf;
		if (rows.pk)
			rc = rows_add(&rows, w, out, po->context, buf, (size_t)lens[d], tdt, d);
		else if ((rc = sluice_writer_add(w, v, &n)))
			rc = cli_error(CMD, out, rc);
	}
	if (!rc && rows.pk)
		rc = rows_drain(&rows, w, out, po->context, 1);
	if (!rc) {
		uint64_t real = ntok, slots = ntok;

		if (rows.pk)
			sluice_packer_stats(rows.pk, &real, &slots);
		rc = sluice_writer_close(w);
		w = NULL;
		if (rc)
			rc = cli_error(CMD, out, rc);
		else if (json)
			printf("{\"records\":%llu,\"documents\":%llu,\"tokens\":%llu,\"dtype\":\"%s\",\"from_format\":\"tokens\","
			       "\"packed_context\":%u,\"fill\":%.6f}\n",
			       (unsigned long long)(rows.pk ? rows.rows : ndoc), (unsigned long long)ndoc,
			       (unsigned long long)ntok, sluice_dtype_name(tdt), po ? po->context : 0,
			       slots ? (double)real / (double)slots : 1.0);
		else if (rows.pk)
			printf("packed %llu documents (%llu tokens) into %llu rows of %u in %s: %.2f%% of slots filled (%s)\n",
			       (unsigned long long)ndoc, (unsigned long long)ntok, (unsigned long long)rows.rows, po->context, out,
			       slots ? 100.0 * (double)real / (double)slots : 100.0, po->greedy ? "greedy" : "best-fit decreasing");
		else
			printf("packed %llu documents (%llu %s tokens) into %s\n", (unsigned long long)ndoc,
			       (unsigned long long)ntok, sluice_dtype_name(tdt), out);
	}
out:
	sluice_packer_free(rows.pk);
	free(rows.conv);
	sluice_writer_abort(w);
	if (tf)
		fclose(tf);
	if (lf)
		fclose(lf);
	free(lens);
	free(raw);
	free(buf);
	return rc;
}

int cmd_pack(int argc, char **argv)
{
	const char *from = NULL, *out = NULL, *from_ds = NULL, *from_jsonl = NULL, *fields_arg = NULL;
	const char *from_tokens = NULL, *doc_lengths = NULL, *dtype_arg = NULL;
	uint64_t shard_size = 0, block_size = 0;
	unsigned threads = 0, zstd = 0, pack_context = 0, greedy = 0;
	int quiet = !isatty(2), json = 0, rc = 0, labelled = 0;
	struct list items = { 0 };
	struct sluice_writer *w = NULL;
	struct sluice_writer_options opt = { 0 };
	struct walker wk = { 0 };
	char *meta = NULL;
	struct pack pk;
	pthread_t tid[64];
	unsigned nt = 0;
	struct timespec t0, t1;
	uint64_t bytes = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help")) {
			printf("usage: sluice pack (--from-dir DIR | --from DATASET | --from-jsonl FILE --fields K1,K2 |\n"
			       "                    --from-tokens FILE --doc-lengths FILE)\n"
			       "                   [--shard-size N] [--zstd LEVEL [--block-size N]] [--threads N] [--quiet] [--json] OUT\n"
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
			       "                   Megatron PREFIX(.bin/.idx), sluice shards; fields kept\n");
			return 0;
		} else if (!strcmp(a, "--quiet")) {
			quiet = 1;
		} else if (!strcmp(a, "--json")) {
			json = 1;
		} else if (!strcmp(a, "--greedy")) {
			greedy = 1;
		} else if (!strcmp(a, "--all-files")) {
			wk.all_files = 1;
		} else if (!strcmp(a, "--follow-symlinks")) {
			wk.follow = 1;
		} else if (!strcmp(a, "--from-dir") || !strcmp(a, "--from") || !strcmp(a, "--shard-size") ||
			   !strcmp(a, "--threads") || !strcmp(a, "--from-jsonl") || !strcmp(a, "--fields") ||
			   !strcmp(a, "--from-tokens") || !strcmp(a, "--doc-lengths") || !strcmp(a, "--dtype") ||
			   !strcmp(a, "--zstd") || !strcmp(a, "--block-size") || !strcmp(a, "--pack-context")) {
			if (!v)
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
	if (!out || !!from + !!from_ds + !!from_jsonl + !!from_tokens != 1)
		return cli_fail(CMD, "need one of --from-dir DIR, --from DATASET, --from-jsonl FILE or --from-tokens FILE, and OUT (see --help)");
	if (block_size && !zstd)
		return cli_fail(CMD, "--block-size needs --zstd");
	opt = (struct sluice_writer_options){ .shard_size = shard_size, .zstd_level = (int)zstd,
					      .block_size = (size_t)block_size };
	if ((pack_context || greedy) && !from_tokens)
		return cli_fail(CMD, "--pack-context and --greedy need --from-tokens");
	if (greedy && !pack_context)
		return cli_fail(CMD, "--greedy needs --pack-context L");
	if (from_tokens) {
		struct sluice_packer_options po = { .context = pack_context, .greedy = (int)greedy };

		return pack_tokens(from_tokens, doc_lengths, dtype_arg, out, &opt, pack_context ? &po : NULL, json);
	}
	if (from_ds)
		return pack_dataset(from_ds, out, &opt, quiet, json);
	if (from_jsonl)
		return pack_jsonl(from_jsonl, fields_arg, out, &opt, json);

	/* The list of records: classes (subdirectories) or plain files, as torchvision lists them. */
	wk.root = from;
	rc = walk_imagefolder(&wk, &items, &labelled, &meta);
	opt.metadata = meta;
	if (rc)
		goto out;
	if (!items.n) {
		rc = cli_fail(CMD, "%s: no files to pack", from);
		goto out;
	}

	struct sluice_field fields[3] = {
		{ "data", SLUICE_DTYPE_BYTES, 0, { 0 } },
		{ "key", SLUICE_DTYPE_BYTES, 0, { 0 } },
		{ "label", SLUICE_DTYPE_I64, 0, { 0 } },
	};
	rc = sluice_writer_open(&w, out, fields, labelled ? 3 : 2, &opt);
	if (rc) {
		rc = cli_error(CMD, out, rc);
		goto out;
	}
	memset(&pk, 0, sizeof(pk));
	pk.root = from;
	pk.items = &items;
	nt = threads ? threads : (unsigned)(sysconf(_SC_NPROCESSORS_ONLN) > 8 ? 8 : sysconf(_SC_NPROCESSORS_ONLN));
	if (nt < 1)
		nt = 1;
	pk.window = 16 * (size_t)nt;
	pk.slots = calloc(pk.window, sizeof(*pk.slots));
	pthread_mutex_init(&pk.lock, NULL);
	pthread_cond_init(&pk.ready, NULL);
	pthread_cond_init(&pk.room, NULL);
	pk.main_waits = SIZE_MAX;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned t = 0; t < nt && pk.slots; t++)
		if (pthread_create(&tid[t], NULL, reader, &pk) != 0)
			nt = t; /* run with the threads that did start */
	if (!pk.slots || !nt)
		rc = cli_fail(CMD, "cannot start reader threads (out of memory or threads)");
	for (size_t i = 0; i < items.n && !rc; i++) {
		struct slot *s = &pk.slots[i % pk.window];

		pthread_mutex_lock(&pk.lock);
		while (!s->ready) {
			pk.main_waits = i;
			pthread_cond_wait(&pk.ready, &pk.lock);
		}
		pk.main_waits = SIZE_MAX;
		pthread_mutex_unlock(&pk.lock);
		if (s->err) {
			rc = cli_fail(CMD, "%s/%s: %s", from, items.v[i].rel, strerror(s->err));
		} else {
			const void *vals[3] = { s->data, items.v[i].rel, &items.v[i].label };
			size_t lens[3] = { s->len, strlen(items.v[i].rel), 8 };
			int e = sluice_writer_add(w, vals, lens);

			if (e)
				rc = cli_error(CMD, items.v[i].rel, e);
			bytes += s->len;
		}
		free(s->data);
		pthread_mutex_lock(&pk.lock);
		s->data = NULL;
		s->ready = 0;
		pk.written = i + 1;
		if (rc)
			pk.stop = 1;
		if (pk.readers_waiting || pk.stop)
			pthread_cond_broadcast(&pk.room);
		pthread_mutex_unlock(&pk.lock);
		if (!quiet && (i % 1000 == 999 || i + 1 == items.n)) {
			fprintf(stderr, "\rsluice pack: %zu/%zu files, %.1f MB", i + 1, items.n, (double)bytes / 1e6);
			if (i + 1 == items.n)
				fputc('\n', stderr);
		}
	}
	pthread_mutex_lock(&pk.lock);
	pk.stop = 1;
	pthread_cond_broadcast(&pk.room);
	pthread_mutex_unlock(&pk.lock);
	for (unsigned t = 0; t < nt; t++)
		pthread_join(tid[t], NULL);
	for (size_t k = 0; pk.slots && k < pk.window; k++)
		free(pk.slots[k].data);
	free(pk.slots);
	if (!rc) {
		int e = sluice_writer_close(w);

		w = NULL;
		if (e)
			rc = cli_error(CMD, out, e);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!rc) {
		double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;

		if (json)
			printf("{\"records\":%zu,\"bytes\":%llu,\"seconds\":%.3f,\"files_per_s\":%.1f,\"labelled\":%s}\n",
			       items.n, (unsigned long long)bytes, s, (double)items.n / s, labelled ? "true" : "false");
		else
			printf("packed %zu files (%.1f MB) from %s into %s in %.2f s (%.0f files/s)\n", items.n,
			       (double)bytes / 1e6, from, out, s, (double)items.n / s);
	}
out:
	sluice_writer_abort(w);
	for (size_t i = 0; i < items.n; i++)
		free(items.v[i].rel);
	free(items.v);
	free(meta);
	return rc;
}
