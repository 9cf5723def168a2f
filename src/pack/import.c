/*
 * sluice_pack (sluice.h): the importers.  A dataset sluice reads copied
 * record by record; an ImageFolder tree as torchvision takes it (see
 * walk_imagefolder), each file a record with fields "data" (the bytes),
 * "label" (i64, its class's index) and "key" (the path relative to DIR),
 * files directly in DIR with no subdirectories giving records without a
 * label, in an order fixed by the names, read by several threads; JSON
 * lines; token arrays, cut into documents or packed into rows.  pack/
 * depends on format/ (and core) alone: it reads and writes datasets, never
 * the engine.
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

#include <jansson.h>

#include "core/core.h"
#include "format/format.h"

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
	struct sl__dirs seen; /* the directories on the current path: loops */
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
 * dangling link, one leading out of DIR: warned and counted where warn,
 * the first of the walk's two looks at an entry), -1 on another error.
 */
static int walk_stat(struct walker *wk, const char *path, struct stat *st, int warn)
{
	char real[4096];
	int where = sl__link_where(wk->real, path, st, real);

	if (where < 0) {
		errno = -where;
		return -1;
	}
	if (where == SL_LINK_NONE || where == SL_LINK_IN || (where == SL_LINK_OUT && wk->follow))
		return 1;
	if (warn)
		sl__link_skipped("pack", where, path, wk->root, real, "--follow-symlinks"), wk->skipped++;
	return 0;
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
		return sl__err(-ENOMEM, "out of memory");
	if (stat(path, &st) < 0)
		memset(&st, 0, sizeof(st));
	if ((rc = sl__dirs_enter(&wk->seen, &st)) == 0) {
		sl__warn("pack", "%s: a link back to a directory above it, skipped", path);
		wk->skipped++;
		free(path);
		return 0;
	}
	if (rc < 0) {
		free(path);
		return sl__err(SLUICE_EINVAL_CONFIG, "%s/%s: directories nested over %u deep", wk->root, rel, wk->seen.n);
	}
	rc = 0;
	if (dirs->n == dirs->cap) {
		char **t = realloc(dirs->v, (dirs->cap = dirs->cap ? 2 * dirs->cap : 64) * sizeof(*t));

		if (!t) {
			free(path);
			return sl__err(-ENOMEM, "out of memory");
		}
		dirs->v = t;
	}
	dirs->v[dirs->n++] = strdup(rel);
	names = dir_names(path, &n);
	if (!names)
		rc = sl__err(-errno, "%s: %s", path, strerror(errno));
	for (size_t i = 0; i < n && !rc; i++) {
		char *r = NULL, *p = NULL;
		int use;

		if (asprintf(&r, "%s/%s", rel, names[i]) < 0 || asprintf(&p, "%s/%s", wk->root, r) < 0)
			rc = sl__err(-ENOMEM, "out of memory");
		else if ((use = walk_stat(wk, p, &st, 1)) < 0)
			rc = sl__err(-errno, "%s: %s", p, strerror(errno));
		else if (use && S_ISDIR(st.st_mode))
			rc = walk_dirs(wk, r, dirs);
		free(r);
		free(p);
	}
	free_names(names, n);
	free(path);
	sl__dirs_leave(&wk->seen);
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
			return sl__err(-ENOMEM, "out of memory");
		names = dir_names(path, &n);
		if (!names)
			rc = sl__err(-errno, "%s: %s", path, strerror(errno));
		for (size_t i = 0; i < n && !rc; i++) {
			char *r = NULL, *p = NULL;
			struct stat st;
			int use;

			if (asprintf(&r, "%s%s%s", dirs.v[d], *dirs.v[d] ? "/" : "", names[i]) < 0 ||
			    asprintf(&p, "%s/%s", wk->root, r) < 0) {
				rc = sl__err(-ENOMEM, "out of memory");
			} else if ((use = walk_stat(wk, p, &st, 0)) < 0) { /* walk_dirs or walk_imagefolder warned */
				rc = sl__err(-errno, "%s: %s", p, strerror(errno));
			} else if (use && S_ISREG(st.st_mode) && (wk->all_files || image_name(names[i]))) {
				if (add_item(l, r, label))
					rc = sl__err(-ENOMEM, "out of memory");
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

/*
 * The ImageFolder at wk->root into l; *labelled when it has classes, and
 * then *meta is {"class_to_idx": {...}} (malloc'd) for the dataset.  The
 * metadata is JSON, whose strings are UTF-8: a class folder whose name is
 * not is refused, named, before any file is read.
 */
static int walk_imagefolder(struct walker *wk, struct list *l, int *labelled, char **meta)
{
	size_t n, ncls = 0;
	char **names = dir_names(wk->root, &n), **cls;
	json_t *c2i = json_object(), *m;
	int rc = 0;

	*labelled = 0;
	*meta = NULL;
	if (!names) {
		json_decref(c2i);
		return sl__err(-errno, "%s: %s", wk->root, strerror(errno));
	}
	if (!realpath(wk->root, wk->real)) {
		free_names(names, n);
		json_decref(c2i);
		return sl__err(-errno, "%s: %s", wk->root, strerror(errno));
	}
	cls = calloc(n + 1, sizeof(char *));
	for (size_t i = 0; cls && c2i && i < n && !rc; i++) {
		char *p, shown[1024];
		struct stat st;
		json_t *name;
		int use;

		if (asprintf(&p, "%s/%s", wk->root, names[i]) < 0) {
			rc = sl__err(-ENOMEM, "out of memory");
			break;
		}
		use = walk_stat(wk, p, &st, 1);
		if (use < 0)
			rc = sl__err(-errno, "%s: %s", p, strerror(errno));
		else if (use && S_ISDIR(st.st_mode) && !(name = json_string(names[i])))
			rc = sl__err(SLUICE_EINVAL_CONFIG, "%s: a class folder whose name is not UTF-8: the class "
				     "names are kept as JSON, which holds UTF-8 alone; rename it",
				     sl__printable(p, shown, sizeof(shown)));
		else if (use && S_ISDIR(st.st_mode))
			json_decref(name), cls[ncls++] = names[i];
		free(p);
	}
	if (!cls || !c2i)
		rc = sl__err(-ENOMEM, "out of memory");
	*labelled = ncls > 0;
	if (!rc && !ncls)
		rc = walk_class(wk, "", 0, l);
	for (size_t c = 0; c < ncls && !rc; c++) {
		size_t before = l->n;

		rc = walk_class(wk, cls[c], (int64_t)c, l);
		if (!rc && l->n == before)
			sl__warn("pack", "class '%s' (label %zu) has no %sfiles", cls[c], c,
				wk->all_files ? "" : "image ");
		if (!rc && json_object_set_new(c2i, cls[c], json_integer((json_int_t)c)))
			rc = sl__err(-ENOMEM, "out of memory");
	}
	/* Keys in insertion order (jansson >= 2.8), the labels' order. */
	m = !rc && ncls ? json_pack("{s:O}", "class_to_idx", c2i) : NULL;
	if (m && !(*meta = json_dumps(m, 0)))
		rc = sl__err(-ENOMEM, "out of memory");
	else if (!rc && ncls && !m)
		rc = sl__err(-ENOMEM, "out of memory");
	json_decref(m);
	json_decref(c2i);
	if (wk->skipped)
		sl__warn("pack", "%u links skipped (see above)", wk->skipped);
	free(cls);
	free_names(names, n);
	return rc;
}

/* Reader threads read up to a window of files ahead of the writer, each into its entry of reads; the writer
 * takes them in order. */
struct file_read {
	char *data;
	size_t len;
	int err; /* errno of a failed read */
	int ready;
};

struct pack {
	const char *root;
	struct list *items;
	struct file_read *reads;
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
		struct file_read *s;
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
			fd = sl__open_file(p, O_RDONLY, 0);
			if (fd < 0)
				err = -fd;
			else if (fstat(fd, &st) < 0)
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
		s = &pk->reads[i % pk->window];
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

/* What every importer reports and calls back with. */
struct job {
	const char *out;
	const struct sluice_pack_options *opt;
	struct sluice_pack_report *rep;
};

static void progress(const struct job *j, uint64_t done, uint64_t total)
{
	if (j->opt->progress)
		j->opt->progress(done, total, j->rep->bytes, j->opt->progress_arg);
}

/* The writer of j's output (overwrite: beside out, swapped in at close). */
static int open_writer(const struct job *j, struct sluice_writer **w, const struct sluice_field *fields, unsigned n,
		       const struct sluice_writer_options *wo)
{
	return j->opt->overwrite ? sluice_writer_open_overwrite(w, j->out, fields, n, wo)
				 : sluice_writer_open(w, j->out, fields, n, wo);
}

/* An error of w's (its own detail, which names out) aborts it: nothing at out opens as a dataset. */
static int fail(struct sluice_writer *w, int rc)
{
	sluice_writer_abort(w);
	return rc;
}

/* Any readable dataset to sluice shards, record by record, in order. */
static int pack_dataset(struct job *j)
{
	const char *from = j->opt->from;
	struct sluice_dataset *ds;
	struct sluice_writer *w = NULL;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	unsigned char *buf = NULL;
	size_t cap = 0;
	uint64_t n;
	int rc = sluice_dataset_open(&ds, from);

	if (rc)
		return rc;
	for (unsigned f = 0; f < sluice_dataset_nfields(ds); f++)
		fields[f] = *sluice_dataset_field(ds, f);
	rc = open_writer(j, &w, fields, sluice_dataset_nfields(ds), &j->opt->writer);
	n = sluice_dataset_count(ds);
	for (uint64_t i = 0; i < n && !rc; i++) {
		struct sluice_record_loc loc;
		struct sluice_record rec;
		ssize_t r;

		if ((rc = sluice_dataset_locate(ds, i, &loc)))
			break;
		if (sl__reserve(&buf, &cap, loc.length)) {
			rc = sl__err(-ENOMEM, "%s: record %llu: no memory", from, (unsigned long long)i);
			break;
		}
		r = sluice_dataset_read(ds, i, buf, cap, &rec);
		if (r < 0) {
			rc = (int)r;
			break;
		}
		rc = sluice_writer_add(w, rec.data, rec.len);
		j->rep->bytes += (uint64_t)r;
		if (i % 10000 == 9999 || i + 1 == n)
			progress(j, i + 1, n);
	}
	free(buf);
	snprintf(j->rep->from_format, sizeof(j->rep->from_format), "%s", sluice_dataset_format(ds));
	sluice_dataset_close(ds);
	j->rep->records = n;
	return rc ? fail(w, rc) : sluice_writer_close(w);
}

/*
 * JSON lines, one record per non-empty line, fields chosen by key.  A line
 * is held whole, so none may pass SLUICE_MAX_RECORD; that, a failed read
 * or allocation is an error naming the line, never the end of the file.
 */
static int pack_jsonl(struct job *j)
{
	const char *from = j->opt->from;
	struct sluice_writer *w = NULL;
	struct sluice_field fields[SLUICE_MAX_FIELDS];
	const char *names[SLUICE_MAX_FIELDS];
	char *list = strdup(j->opt->fields ? j->opt->fields : ""), *save = NULL;
	struct sl__lines lr = { 0 };
	const char *line;
	uint64_t max = 0;
	unsigned n = 0;
	size_t len;
	int rc = 0, got;

	for (char *t = list ? strtok_r(list, ",", &save) : NULL; t && n < SLUICE_MAX_FIELDS; t = strtok_r(NULL, ",", &save))
		names[n++] = t;
	if (!n)
		rc = sl__err(SLUICE_EINVAL_CONFIG, "packing JSON lines needs fields (KEY[,KEY...])");
	/* fopen, not sl__open_file: JSON lines may come from a pipe (--from-jsonl /dev/stdin); lines are bounded. */
	else if ((rc = sl__setting_u64("SLUICE_MAX_RECORD", &max)) >= 0 && !(lr.f = fopen(from, "r")))
		rc = sl__err(-errno, "%s: %s", from, strerror(errno));
	if (rc < 0) {
		free(list);
		return rc;
	}
	lr.max = (size_t)max;
	rc = 0;
	while (!rc && (got = sl__lines_next(&lr, &line, &len)) == 1) {
		const char *l = line;

		/* A UTF-8 byte order mark before the first line, as editors on Windows write it. */
		if (lr.lineno == 1 && len >= 3 && !memcmp(l, "\xEF\xBB\xBF", 3))
			l += 3, len -= 3;
		while (len && (l[len - 1] == '\r' || l[len - 1] == ' ' || l[len - 1] == '\t'))
			len--;
		/* Blank lines (whitespace only, all trimmed above) hold no record. */
		if (!len)
			continue;
		/* A line's fault names the line; the writer's (the output's) names the output alone. */
		if (!w && (rc = sl__json_schema(l, len, names, n, fields)))
			rc = sl__err(rc, "%s:%llu: %s", from, (unsigned long long)lr.lineno, sluice_last_error_detail());
		else if (!w)
			rc = open_writer(j, &w, fields, n, &j->opt->writer);
		if (!rc)
			rc = sl__writer_add_json(w, l, len, from, lr.lineno);
		if (!rc && lr.lineno % 10000 == 0)
			progress(j, sluice_writer_count(w), 0);
	}
	if (!rc && got < 0)
		rc = sl__err(got, "%s:%llu: %s", from, (unsigned long long)lr.lineno, sluice_last_error_detail());
	fclose(lr.f);
	sl__lines_free(&lr);
	free(list);
	if (!rc && !w)
		rc = sl__err(SLUICE_EFORMAT, "%s: no records (empty file)", from);
	snprintf(j->rep->from_format, sizeof(j->rep->from_format), "jsonl");
	j->rep->records = w ? sluice_writer_count(w) : 0;
	return rc ? fail(w, rc) : sluice_writer_close(w);
}

/* Reads an array file (.npy, or raw .bin of bin_dtype): its dtype, count and data offset. */
static int array_header(const char *path, enum sluice_dtype bin_dtype, enum sluice_dtype *dt, uint64_t *count,
			uint64_t *off)
{
	size_t l = strlen(path);
	struct stat st;

	if (l > 4 && !strcmp(path + l - 4, ".npy"))
		return sl__npy_header(path, dt, count, off);
	int fd = sl__open_file(path, O_RDONLY, 0); /* a regular file, never a FIFO read forever */

	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return sl__err(-errno, "%s: %s", path, strerror(errno));
	}
	close(fd);
	*dt = bin_dtype;
	*off = 0;
	*count = (uint64_t)st.st_size / sluice_dtype_size(bin_dtype);
	if ((uint64_t)st.st_size % sluice_dtype_size(bin_dtype))
		return sl__err(SLUICE_EFORMAT, "%s: %lld bytes is not a whole number of %s values", path,
			       (long long)st.st_size, sluice_dtype_name(bin_dtype));
	return 0;
}

/* Element i of an integer array of dtype dt. */
static int64_t int_at(const void *a, enum sluice_dtype dt, size_t i)
{
	int64_t v;

	switch (dt) {
	case SLUICE_DTYPE_U16:
		return ((const uint16_t *)a)[i];
	case SLUICE_DTYPE_U32:
		return ((const uint32_t *)a)[i];
	case SLUICE_DTYPE_I32:
		return ((const int32_t *)a)[i];
	default:
		memcpy(&v, (const char *)a + 8 * i, 8);
		return v;
	}
}

static int int_dtype(enum sluice_dtype dt)
{
	return dt == SLUICE_DTYPE_U16 || dt == SLUICE_DTYPE_U32 || dt == SLUICE_DTYPE_I32 || dt == SLUICE_DTYPE_I64;
}

/*
 * Packed rows (pack_context L): documents go through sluice's packer and
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

/* Writes the rows the packer has finished (all of them with flush). */
static int rows_drain(struct rows *r, struct sluice_writer *w, uint32_t L, int flush)
{
	struct sluice_packed_row row;
	int rc = 0;

	while (!rc && sluice_packer_row(r->pk, &row, flush) == 1) {
		const void *v[4] = { row.input_ids, row.position_ids, row.labels, row.cu_seqlens };
		size_t l[4] = { 4 * (size_t)L, 4 * (size_t)L, 4 * (size_t)L, 4 * ((size_t)row.ndocs + 1) };

		rc = sluice_writer_add(w, v, l);
		r->rows++;
	}
	return rc;
}

/* One document of n tokens of dtype dt: to i32, into the packer, finished rows out. */
static int rows_add(struct rows *r, struct sluice_writer *w, uint32_t L, const void *tok, size_t n,
		    enum sluice_dtype dt, uint64_t doc)
{
	if (sl__reserve(&r->conv, &r->conv_cap, n * sizeof(int32_t)))
		return sl__err(-ENOMEM, "out of memory for a document of %zu tokens", n);
	for (size_t i = 0; i < n; i++) {
		int64_t t = int_at(tok, dt, i);

		if (t < 0 || t > INT32_MAX)
			return sl__err(SLUICE_EFORMAT, "document %llu, token %zu: id %lld does not fit an i32 input id",
				       (unsigned long long)doc, i, (long long)t);
		r->conv[i] = (int32_t)t;
	}
	if (sluice_packer_add(r->pk, r->conv, n))
		return sl__err(-ENOMEM, "out of memory packing document %llu", (unsigned long long)doc);
	return rows_drain(r, w, L, 0);
}

/* The documents' lengths from path (an integer array adding up to ntok): *lens, malloc'd. */
static int doc_lengths(const char *path, const char *tok_path, uint64_t ntok, uint64_t **lens, uint64_t *ndoc)
{
	enum sluice_dtype ldt;
	uint64_t loff, sum = 0;
	unsigned char *raw = NULL;
	FILE *lf = NULL;
	int rc = array_header(path, SLUICE_DTYPE_I64, &ldt, ndoc, &loff);

	if (!rc && !int_dtype(ldt))
		rc = sl__err(SLUICE_EFORMAT, "%s: lengths of dtype %s; use an integer type", path, sluice_dtype_name(ldt));
	if (rc)
		return rc;
	*lens = malloc((*ndoc ? *ndoc : 1) * sizeof(uint64_t));
	raw = malloc((*ndoc ? *ndoc : 1) * sluice_dtype_size(ldt));
	lf = fopen(path, "rb");
	if (!*lens || !raw || !lf || fseeko(lf, (off_t)loff, SEEK_SET) || fread(raw, sluice_dtype_size(ldt), *ndoc, lf) != *ndoc)
		rc = sl__err(-EIO, "%s: cannot read %llu lengths", path, (unsigned long long)*ndoc);
	for (uint64_t d = 0; d < *ndoc && !rc; d++) {
		int64_t v = int_at(raw, ldt, d);

		if (v < 0 || (uint64_t)v > ntok)
			rc = sl__err(SLUICE_EFORMAT, "%s: document %llu has length %lld", path, (unsigned long long)d, (long long)v);
		(*lens)[d] = (uint64_t)v;
		sum += (uint64_t)v;
	}
	if (!rc && sum != ntok)
		rc = sl__err(SLUICE_EFORMAT, "%s: document lengths add up to %llu tokens, %s holds %llu", path,
			     (unsigned long long)sum, tok_path, (unsigned long long)ntok);
	if (lf)
		fclose(lf);
	free(raw);
	return rc;
}

/* Document by document from tf (tokens of dtype tdt): a record each, or into the packer's rows. */
static int tokens_copy(struct job *j, FILE *tf, const uint64_t *lens, uint64_t ndoc, enum sluice_dtype tdt,
		       struct rows *rows, struct sluice_writer *w)
{
	unsigned char *buf = NULL;
	size_t cap = 0;
	int rc = 0;

	for (uint64_t d = 0; d < ndoc && !rc; d++) {
		size_t n = (size_t)lens[d] * sluice_dtype_size(tdt);
		const void *v[1];

		if (sl__reserve(&buf, &cap, n)) {
			rc = sl__err(-ENOMEM, "out of memory for a document of %zu bytes", n);
			break;
		}
		v[0] = buf;
		if (n && fread(buf, 1, n, tf) != n)
			rc = sl__err(SLUICE_EFORMAT, "%s: ends inside document %llu", j->opt->from, (unsigned long long)d);
		else if (rows->pk)
			rc = rows_add(rows, w, j->opt->pack_context, buf, (size_t)lens[d], tdt, d);
		else
			rc = sluice_writer_add(w, v, &n);
		j->rep->bytes += n;
		if (d % 100000 == 99999)
			progress(j, d + 1, ndoc);
	}
	free(buf);
	return rc;
}

/*
 * Token arrays: one record per document, field "tokens", or packed rows.
 * Lengths are in tokens, in file order, and must add up to the token count.
 */
static int pack_tokens(struct job *j)
{
	const struct sluice_pack_options *o = j->opt;
	const char *dt = o->dtype;
	enum sluice_dtype bin = !dt || !strcmp(dt, "u16") ? SLUICE_DTYPE_U16 : !strcmp(dt, "u32") ? SLUICE_DTYPE_U32
													: (enum sluice_dtype)-1;
	struct sluice_packer_options po = { .size = sizeof(struct sluice_packer_options), .context = o->pack_context, .greedy = o->greedy };
	struct sluice_field f[1] = { { "tokens", SLUICE_DTYPE_U16, 1, { -1 } } }, pf[4];
	enum sluice_dtype tdt;
	uint64_t ntok, toff, ndoc = 0, *lens = NULL;
	struct sluice_writer *w = NULL;
	FILE *tf = NULL;
	struct rows rows = { 0 };
	int rc = 0;

	if ((int)bin < 0)
		return sl__err(SLUICE_EINVAL_CONFIG, "dtype '%s' is not u16 or u32", dt);
	if (!o->doc_lengths)
		return sl__err(SLUICE_EINVAL_CONFIG, "packing tokens needs the documents' lengths (doc_lengths)");
	if (o->greedy && !o->pack_context)
		return sl__err(SLUICE_EINVAL_CONFIG, "greedy packing needs a pack_context");
	if ((rc = array_header(o->from, bin, &tdt, &ntok, &toff)))
		return rc;
	if (!int_dtype(tdt))
		return sl__err(SLUICE_EFORMAT, "%s: tokens of dtype %s; sluice packs u16, u32, i32 or i64", o->from,
			       sluice_dtype_name(tdt));
	if ((rc = doc_lengths(o->doc_lengths, o->from, ntok, &lens, &ndoc)))
		goto out;
	f[0].dtype = tdt;
	memcpy(pf, rows_fields, sizeof(pf));
	for (int i = 0; i < 3; i++)
		pf[i].shape[0] = o->pack_context;
	if (o->pack_context && (rc = sluice_packer_new(&rows.pk, &po)))
		goto out;
	if ((rc = o->pack_context ? open_writer(j, &w, pf, 4, &o->writer) : open_writer(j, &w, f, 1, &o->writer)))
		goto out;
	if (!(tf = fopen(o->from, "rb")) || fseeko(tf, (off_t)toff, SEEK_SET)) {
		rc = sl__err(-errno, "%s: %s", o->from, strerror(errno));
		goto out;
	}
	rc = tokens_copy(j, tf, lens, ndoc, tdt, &rows, w);
	if (!rc && rows.pk)
		rc = rows_drain(&rows, w, o->pack_context, 1);
	if (!rc) {
		uint64_t real = ntok, capacity = ntok;

		if (rows.pk)
			sluice_packer_stats(rows.pk, &real, &capacity);
		j->rep->fill = capacity ? (double)real / (double)capacity : 1.0;
		rc = sluice_writer_close(w);
		w = NULL;
	}
	j->rep->records = rows.pk ? rows.rows : ndoc;
	j->rep->documents = ndoc;
	j->rep->tokens = ntok;
	snprintf(j->rep->dtype, sizeof(j->rep->dtype), "%s", sluice_dtype_name(tdt));
	snprintf(j->rep->from_format, sizeof(j->rep->from_format), "tokens");
out:
	sluice_packer_free(rows.pk);
	free(rows.conv);
	sluice_writer_abort(w);
	if (tf)
		fclose(tf);
	free(lens);
	return rc;
}

/* Starts the reader threads of pk (0: the CPUs, up to 8); the count started, 0 if none. */
static unsigned readers_start(struct pack *pk, pthread_t *tid, unsigned want)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned nt = want ? want : cpus > 8 ? 8 : cpus < 1 ? 1 : (unsigned)cpus;

	pk->window = 16 * (size_t)nt;
	pk->reads = calloc(pk->window, sizeof(*pk->reads));
	pthread_mutex_init(&pk->lock, NULL);
	pthread_cond_init(&pk->ready, NULL);
	pthread_cond_init(&pk->room, NULL);
	pk->main_waits = SIZE_MAX;
	for (unsigned t = 0; t < nt && pk->reads; t++)
		if (pthread_create(&tid[t], NULL, reader, pk) != 0)
			return t; /* run with the threads that did start */
	return pk->reads ? nt : 0;
}

static void readers_stop(struct pack *pk, pthread_t *tid, unsigned nt)
{
	pthread_mutex_lock(&pk->lock);
	pk->stop = 1;
	pthread_cond_broadcast(&pk->room);
	pthread_mutex_unlock(&pk->lock);
	for (unsigned t = 0; t < nt; t++)
		pthread_join(tid[t], NULL);
	for (size_t k = 0; pk->reads && k < pk->window; k++)
		free(pk->reads[k].data);
	free(pk->reads);
	pthread_mutex_destroy(&pk->lock);
	pthread_cond_destroy(&pk->ready);
	pthread_cond_destroy(&pk->room);
}

/* Item i from the readers' window, written as a record, its entry given back; 0 or an error. */
static int write_item(struct pack *pk, struct sluice_writer *w, size_t i, struct job *j)
{
	struct file_read *s = &pk->reads[i % pk->window];
	const struct item *it = &pk->items->v[i];
	int rc;

	pthread_mutex_lock(&pk->lock);
	while (!s->ready) {
		pk->main_waits = i;
		pthread_cond_wait(&pk->ready, &pk->lock);
	}
	pk->main_waits = SIZE_MAX;
	pthread_mutex_unlock(&pk->lock);
	if (s->err) {
		rc = sl__err(-s->err, "%s/%s: %s", pk->root, it->rel, strerror(s->err));
	} else {
		const void *vals[3] = { s->data, it->rel, &it->label };
		size_t lens[3] = { s->len, strlen(it->rel), 8 };

		rc = sluice_writer_add(w, vals, lens);
		j->rep->bytes += s->len;
	}
	free(s->data);
	pthread_mutex_lock(&pk->lock);
	s->data = NULL;
	s->ready = 0;
	pk->written = i + 1;
	pk->stop |= rc != 0;
	if (pk->readers_waiting || pk->stop)
		pthread_cond_broadcast(&pk->room);
	pthread_mutex_unlock(&pk->lock);
	return rc;
}

/* An ImageFolder tree, its files read by several threads and written in the walk's order. */
static int pack_dir(struct job *j)
{
	static const struct sluice_field fields[3] = {
		{ "data", SLUICE_DTYPE_BYTES, 0, { 0 } },
		{ "key", SLUICE_DTYPE_BYTES, 0, { 0 } },
		{ "label", SLUICE_DTYPE_I64, 0, { 0 } },
	};
	struct walker wk = { .root = j->opt->from, .all_files = j->opt->all_files, .follow = j->opt->follow_symlinks };
	struct sluice_writer_options opt = j->opt->writer;
	struct list items = { 0 };
	struct sluice_writer *w = NULL;
	struct pack pk = { .root = j->opt->from, .items = &items };
	pthread_t tid[64];
	unsigned nt = 0;
	char *meta = NULL;
	int labelled = 0, rc = walk_imagefolder(&wk, &items, &labelled, &meta);

	opt.metadata = meta;
	if (!rc && !items.n)
		rc = sl__err(SLUICE_EFORMAT, "%s: no files to pack", j->opt->from);
	if (!rc)
		rc = open_writer(j, &w, fields, labelled ? 3 : 2, &opt);
	if (!rc && !(nt = readers_start(&pk, tid, j->opt->threads > 64 ? 64 : j->opt->threads)))
		rc = sl__err(-EAGAIN, "cannot start reader threads (out of memory or threads)");
	for (size_t i = 0; i < items.n && !rc; i++) {
		rc = write_item(&pk, w, i, j);
		if (i % 1000 == 999 || i + 1 == items.n)
			progress(j, i + 1, items.n);
	}
	if (nt)
		readers_stop(&pk, tid, nt);
	if (!rc) {
		rc = sluice_writer_close(w);
		w = NULL;
	}
	sluice_writer_abort(w);
	j->rep->records = items.n;
	j->rep->labelled = labelled;
	snprintf(j->rep->from_format, sizeof(j->rep->from_format), "dir");
	for (size_t i = 0; i < items.n; i++)
		free(items.v[i].rel);
	free(items.v);
	free(meta);
	return rc;
}

/* By enum sluice_pack_source. */
static int (*const importers[])(struct job *j) = { NULL, pack_dataset, pack_dir, pack_jsonl, pack_tokens };

int sluice_pack(const char *out, const struct sluice_pack_options *opt, struct sluice_pack_report *rep)
{
	struct sluice_pack_report mine = SLUICE_PACK_REPORT_INIT;
	struct sluice_pack_options o;
	struct job j = { out, &o, rep ? rep : &mine };
	uint64_t t0 = sl__now_ns();
	int rc;

	sl__err_clear();
	if ((rc = SL_REPORT_IN(rep, pack_report)) || (rc = SL_SIZED_IN(&o, opt, pack_options)))
		return rc;
	if (!opt || !opt->from || !out || !*out)
		return sl__err(-EINVAL, "sluice_pack: options, a source and OUT (not empty) are needed");
	opt = &o;
	if (opt->source < SLUICE_PACK_DATASET || opt->source > SLUICE_PACK_TOKENS)
		return sl__err(SLUICE_EINVAL_CONFIG, "sluice_pack: source %d is none of dataset, dir, jsonl, tokens",
			       opt->source);
	/* Refused before any work: the options of one importer given to another. */
	if ((opt->pack_context || opt->greedy) && opt->source != SLUICE_PACK_TOKENS)
		return sl__err(SLUICE_EINVAL_CONFIG, "pack_context and greedy are for token arrays");
	rc = importers[opt->source](&j);
	j.rep->seconds = (double)(sl__now_ns() - t0) / 1e9;
	return rc;
}
