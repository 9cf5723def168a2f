/*
 * sluice tune: measures this machine with short trials and picks the
 * settings sluice reads with.  For a file (or a directory, where it writes
 * a scratch file): threads, I/O size and queue depth, by cold reads
 * (O_DIRECT, the page cache dropped when root), one knob at a time from
 * the defaults; then the defaults and the pick side by side, cold and
 * warm.  For an s3:// object: the part size and the parts in flight of
 * downloads (the cache of s3:// datasets, sluice cp).  Each trial is a
 * child `sluice bench` or `sluice cp`, so nothing of one trial (pinned
 * slots, connections, the settings file) carries into the next.  The pick
 * goes into the settings file (sluice_settings_path), keeping its other
 * lines.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Scratch files .sluice-tune.PID in dir whose tune was killed (its process gone) are removed. */
static void reclaim_scratch(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	while (d && (e = readdir(d))) {
		char *end, p[PATH_MAX + 300];
		long pid;

		if (strncmp(e->d_name, ".sluice-tune.", 13) || (pid = strtol(e->d_name + 13, &end, 10)) <= 0 || *end ||
		    !(kill((pid_t)pid, 0) < 0 && errno == ESRCH))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (unlink(p) == 0)
			fprintf(stderr, "sluice tune: removed %s, the scratch file of a tune that was killed\n", p);
	}
	if (d)
		closedir(d);
}

#define CMD "tune"

extern char **environ;

static const char usage[] =
	"usage: sluice tune [--json] [--dry-run] [--size N] PATH\n"
	"  PATH: a file to read, a directory (a scratch file of --size is written there and removed),\n"
	"  or s3://BUCKET/KEY.  Short trials pick threads, I/O size and queue depth (files) or part\n"
	"  size and parts in flight (objects); the pick and the defaults are then measured side by\n"
	"  side (medians of 3, cold and warm for files) and the pick is written to the settings\n"
	"  file (SLUICE_CONFIG, default ~/.config/sluice/sluice.conf), unless --dry-run.\n"
	"  --size N: bytes per trial (default: the file's size up to 1G; 1G scratch file).\n";

struct cli_knobs {
	unsigned a, b;      /* files: threads, queue depth; objects: concurrency, unused */
	uint64_t size;      /* files: I/O size; objects: part size */
};

struct cli_tune {
	const char *exe, *path, *file;
	int s3, json;
	uint64_t size;
	char tmpdir[PATH_MAX];
	unsigned trials;
	char trial_json[65536];
	size_t tj;
};

/* Runs argv with stdout and stderr into out; returns the exit status, or -errno. */
static int cli_spawn(char *const argv[], char *const env[], char *out, size_t cap)
{
	posix_spawn_file_actions_t fa;
	int p[2], st = 0, rc;
	size_t n = 0;
	ssize_t got;
	pid_t pid;

	if (pipe(p))
		return -errno;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawn_file_actions_adddup2(&fa, p[1], 2);
	posix_spawn_file_actions_addclose(&fa, p[0]);
	rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	close(p[1]);
	if (rc) {
		close(p[0]);
		return -rc;
	}
	while ((got = read(p[0], out + n, cap - 1 - n)) > 0 || (got < 0 && errno == EINTR))
		if (got > 0 && (n += (size_t)got) == cap - 1)
			break;
	out[n] = 0;
	close(p[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The number after "key": in a JSON text; -1 if absent. */
static double cli_num(const char *json, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(json, k);
	return p ? strtod(p + strlen(k), NULL) : -1;
}

/* One trial: GB/s, or a negative value after printing why. */
static double cli_trial(struct cli_tune *t, const struct cli_knobs *k, int cold, unsigned repeat)
{
	char out[16384], a[32], b[32], s[32], sz[32], rep[16], dst[PATH_MAX + 8], pe[64], ce[64];
	char *env[512];
	unsigned ne = 0;
	double gbs;
	int rc;

	for (char **e = environ; *e && ne < 500; e++)
		if (strncmp(*e, "SLUICE_S3_PART_SIZE=", 20) && strncmp(*e, "SLUICE_S3_CONCURRENCY=", 22))
			env[ne++] = *e;
	snprintf(a, sizeof(a), "%u", k->a);
	snprintf(b, sizeof(b), "%u", k->b);
	snprintf(s, sizeof(s), "%llu", (unsigned long long)k->size);
	snprintf(sz, sizeof(sz), "%llu", (unsigned long long)t->size);
	snprintf(rep, sizeof(rep), "%u", repeat);
	if (t->s3) {
		char *argv[] = { (char *)t->exe, "cp", "--json", (char *)t->path, dst, NULL };

		snprintf(dst, sizeof(dst), "%s/obj", t->tmpdir);
		snprintf(pe, sizeof(pe), "SLUICE_S3_PART_SIZE=%s", s);
		snprintf(ce, sizeof(ce), "SLUICE_S3_CONCURRENCY=%s", a);
		env[ne++] = pe;
		env[ne++] = ce;
		env[ne] = NULL;
		rc = cli_spawn(argv, env, out, sizeof(out));
		unlink(dst);
		gbs = cli_num(out, "gbps");
	} else {
		char *argv[] = { (char *)t->exe, "bench", "--json", "--rw", "read", "--size", sz, "--io-size", s,
				 "--threads", a, "--queue-depth", b, "--repeat", rep, cold ? "--cold" : (char *)t->file,
				 cold ? (char *)t->file : NULL, NULL };

		env[ne] = NULL;
		rc = cli_spawn(argv, env, out, sizeof(out));
		gbs = cli_num(out, "gb_s");
	}
	if (rc || gbs <= 0) {
		if (*out && out[strlen(out) - 1] == '\n')
			out[strlen(out) - 1] = 0;
		cli_failed(CMD, 1, -EIO, "a trial failed (%s %s, %s): %s", t->s3 ? "cp" : "bench", cli_shown(t->path),
			   rc ? "its exit status" : "no result", out);
		return -1;
	}
	t->trials++;
	if (t->tj >= sizeof(t->trial_json))
		return gbs;
	if (t->s3)
		t->tj += (size_t)snprintf(t->trial_json + t->tj, sizeof(t->trial_json) - t->tj,
					  "%s{\"s3_concurrency\":%u,\"s3_part_size\":%llu,\"gb_s\":%.4f}", t->tj ? "," : "",
					  k->a, (unsigned long long)k->size, gbs);
	else
		t->tj += (size_t)snprintf(t->trial_json + t->tj, sizeof(t->trial_json) - t->tj,
					  "%s{\"threads\":%u,\"queue_depth\":%u,\"max_transfer_size\":%llu,\"cold\":%s,"
					  "\"gb_s\":%.4f}",
					  t->tj ? "," : "", k->a, k->b, (unsigned long long)k->size, cold ? "true" : "false", gbs);
	return gbs;
}

static int cli_dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/*
 * One setting's figure: the median of 3 passes (a file: bench --repeat 3, each pass cold when cold is
 * set; an object: 3 downloads).  A negative value after printing why.
 */
static double cli_measure(struct cli_tune *t, const struct cli_knobs *k, int cold)
{
	double g[3];

	if (!t->s3)
		return cli_trial(t, k, cold, 3);
	for (int i = 0; i < 3; i++)
		if ((g[i] = cli_trial(t, k, cold, 1)) < 0)
			return -1;
	qsort(g, 3, sizeof(double), cli_dcmp);
	return g[1];
}

/*
 * Tries each value of one knob from the current pick; keeps a value only when it beats the pick by
 * 5%, more than the noise of a median of 3, so that a flat curve leaves the default.
 */
static int cli_sweep(struct cli_tune *t, struct cli_knobs *pick, double *best, int which, const uint64_t *vals)
{
	for (unsigned i = 0; vals[i]; i++) {
		struct cli_knobs k = *pick;
		double g;

		if (which == 0)
			k.a = (unsigned)vals[i];
		else if (which == 1)
			k.b = (unsigned)vals[i];
		else
			k.size = vals[i];
		if (!memcmp(&k, pick, sizeof(k)))
			continue;
		if ((g = cli_measure(t, &k, 1)) < 0)
			return -1;
		if (!t->json && t->s3)
			fprintf(stderr, "  %u parts in flight of %llu bytes: %.2f GB/s\n", k.a, (unsigned long long)k.size, g);
		else if (!t->json)
			fprintf(stderr, "  %u threads x %u in flight of %llu bytes: %.2f GB/s\n", k.a, k.b,
				(unsigned long long)k.size, g);
		if (g > *best * 1.05) {
			*best = g;
			*pick = k;
		}
	}
	return 0;
}

/*
 * The defaults and the sweep's winner side by side, alternated 3 times, each a median of 3: the
 * medians of those into *gd and *gc.  The defaults alone when they won the sweep.
 */
static int cli_compare(struct cli_tune *t, const struct cli_knobs *def, const struct cli_knobs *cand, int cold,
		       double *gd, double *gc)
{
	int same = !memcmp(def, cand, sizeof(*def));
	double d[3], c[3];

	for (int r = 0; r < 3; r++) {
		if ((d[r] = cli_measure(t, def, cold)) < 0 || (c[r] = same ? d[r] : cli_measure(t, cand, cold)) < 0)
			return -1;
	}
	qsort(d, 3, sizeof(double), cli_dcmp);
	qsort(c, 3, sizeof(double), cli_dcmp);
	*gd = d[1];
	*gc = c[1];
	return 0;
}

/* Reads path through the page cache once, so that the warm passes find it there. */
static void cli_warm_cache(const char *path)
{
	static char buf[1 << 20];
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	close(fd);
}

/* The picked values into the settings file, through the library's writer (the reader's own checks). */
static int cli_write(const char *conf, const char *const *keys, char vals[][32], unsigned n, const char *note)
{
	const char *v[4];

	for (unsigned i = 0; i < n && i < 4; i++)
		v[i] = vals[i];
	return sluice_settings_write(conf, keys, v, n, note);
}

/* What the trials found: the defaults, the best trial, the pick, and each one's rate (cold; warm for files). */
struct cli_found {
	struct cli_knobs def, cand, pick;
	double cd, cc, cp, wd, wc, wp;
	int kept; /* the best trial lost to the defaults side by side */
};

/* A scratch file of random bytes in directory t->path, written through the page cache and synced. */
static int cli_scratch(struct cli_tune *t, uint64_t size, char *scratch, size_t cap)
{
	static char buf[1 << 20];
	FILE *r = fopen("/dev/urandom", "re");
	int fd, e;

	reclaim_scratch(t->path);
	snprintf(scratch, cap, "%s/.sluice-tune.%d", t->path, (int)getpid());
	fd = open(scratch, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || !r || fread(buf, 1, sizeof(buf), r) != sizeof(buf)) {
		e = errno;
		if (r)
			fclose(r);
		if (fd >= 0)
			close(fd), unlink(scratch);
		scratch[0] = 0;
		return cli_fail(CMD, "%s/.sluice-tune.%d: cannot write a scratch file: %s", t->path, (int)getpid(), strerror(e));
	}
	fclose(r);
	for (uint64_t off = 0; off < size; off += sizeof(buf)) {
		size_t w = size - off < sizeof(buf) ? (size_t)(size - off) : sizeof(buf);

		buf[0] ^= (char)off; /* no two MiB alike: nothing below can deduplicate them */
		if (write(fd, buf, w) != (ssize_t)w) {
			e = errno;
			close(fd);
			return cli_fail(CMD, "%s: %s", scratch, strerror(e ? e : ENOSPC));
		}
	}
	fsync(fd);
	close(fd);
	t->file = scratch;
	return 0;
}

/* The knobs the trials start from: the engine's defaults (files), or the settings' part size and parts in flight (objects). */
static int cli_defaults(struct cli_tune *t, uint64_t size, char *scratch, size_t cap, struct cli_knobs *def)
{
	struct sluice_engine *eng;
	struct sluice_engine_info in = SLUICE_ENGINE_INFO_INIT;
	struct stat st;
	int rc;

	if (t->s3) {
		const char *c = sluice_setting("SLUICE_S3_CONCURRENCY"), *p = sluice_setting("SLUICE_S3_PART_SIZE"), *tmp;
		uint64_t v;

		*def = (struct cli_knobs){ 8, 0, 8 << 20 };
		if (c && *c && !sluice_parse_size(c, &v) && v >= 1 && v <= 256)
			def->a = (unsigned)v;
		if (p && *p && !sluice_parse_size(p, &v))
			def->size = v;
		tmp = getenv("TMPDIR");
		snprintf(t->tmpdir, sizeof(t->tmpdir), "%s/sluice-tune.XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(t->tmpdir)) {
			rc = cli_failed(CMD, 2, -errno, "%s: %s", t->tmpdir, strerror(errno));
			t->tmpdir[0] = 0;
			return rc;
		}
		t->size = size;
		return 0;
	}
	if (stat(t->path, &st))
		return cli_failed(CMD, 2, -errno, "%s: %s", t->path, strerror(errno));
	if (S_ISDIR(st.st_mode) && (rc = cli_scratch(t, size = size ? size : 1ull << 30, scratch, cap)))
		return rc;
	if (!S_ISDIR(st.st_mode)) {
		t->file = t->path;
		if (!size || size > (uint64_t)st.st_size)
			size = (uint64_t)st.st_size < (1ull << 30) ? (uint64_t)st.st_size : 1ull << 30;
	}
	t->size = size;
	if ((rc = sluice_engine_open(&eng, NULL)))
		return cli_error(CMD, "cannot open the engine", rc);
	rc = sluice_engine_get_info(eng, &in);
	sluice_engine_close(eng);
	if (rc)
		return cli_error(CMD, "engine", rc);
	*def = (struct cli_knobs){ in.threads, in.queue_depth, in.max_transfer_size };
	return 0;
}

/* The sweeps from the defaults, then the best trial against them side by side; the pick. */
static int cli_trials(struct cli_tune *t, struct cli_found *f)
{
	static const uint64_t threads[] = { 1, 2, 4, 8, 16, 32, 64, 0 }, qds[] = { 1, 2, 4, 8, 16, 32, 0 };
	static const uint64_t ios[] = { 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 0 };
	static const uint64_t conc[] = { 2, 4, 8, 16, 32, 64, 0 };
	static const uint64_t parts[] = { 8 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20, 0 };
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t th[8];
	unsigned m = 0;
	double best;

	f->cand = f->def;
	if (!t->json)
		fprintf(stderr, "sluice tune %s: trials (%s)\n", cli_shown(t->path), t->s3 ? "downloads" : "cold reads");
	if ((best = cli_measure(t, &f->def, 1)) < 0)
		return 1;
	if (!t->json)
		fprintf(stderr, "  the defaults: %.2f GB/s\n", best);
	/* Thread counts up to twice the CPUs (at least 4): more only contend. */
	for (unsigned i = 0; threads[i]; i++)
		if (threads[i] <= (uint64_t)(cpus * 2 > 4 ? cpus * 2 : 4))
			th[m++] = threads[i];
	th[m] = 0;
	if (t->s3 ? cli_sweep(t, &f->cand, &best, 0, conc) || cli_sweep(t, &f->cand, &best, 2, parts)
		  : cli_sweep(t, &f->cand, &best, 0, th) || cli_sweep(t, &f->cand, &best, 2, ios) ||
			    cli_sweep(t, &f->cand, &best, 1, qds))
		return 1;
	if (cli_compare(t, &f->def, &f->cand, 1, &f->cd, &f->cc))
		return 1;
	if (!t->s3) {
		cli_warm_cache(t->file);
		if (cli_compare(t, &f->def, &f->cand, 0, &f->wd, &f->wc))
			return 1;
	}
	/* The winner must hold up against the defaults where it counts (cold, or the objects' downloads). */
	f->pick = f->cc >= f->cd ? f->cand : f->def;
	f->kept = memcmp(&f->pick, &f->cand, sizeof(f->pick)) != 0;
	f->cp = f->kept ? f->cd : f->cc;
	f->wp = f->kept ? f->wd : f->wc;
	return 0;
}

/* The report as JSON, its closing brace left to the caller (cli_json_close, or an error in it). */
static void cli_print_json(const struct cli_tune *t, const struct cli_found *f, const char *conf, int written)
{
	printf("{\"path\":");
	cli_json_str(cli_shown(t->path));
	if (t->s3)
		printf(",\"kind\":\"object\",\"defaults\":{\"s3_concurrency\":%u,\"s3_part_size\":%llu,\"gb_s\":%.4f},"
		       "\"candidate\":{\"s3_concurrency\":%u,\"s3_part_size\":%llu,\"gb_s\":%.4f},"
		       "\"picked\":{\"s3_concurrency\":%u,\"s3_part_size\":%llu,\"gb_s\":%.4f},\"gain\":%.4f",
		       f->def.a, (unsigned long long)f->def.size, f->cd, f->cand.a, (unsigned long long)f->cand.size, f->cc,
		       f->pick.a, (unsigned long long)f->pick.size, f->cp, f->cp / f->cd);
	else
		printf(",\"kind\":\"file\",\"bytes\":%llu,\"defaults\":{\"threads\":%u,\"queue_depth\":%u,"
		       "\"max_transfer_size\":%llu,\"cold_gb_s\":%.4f,\"warm_gb_s\":%.4f},\"candidate\":{\"threads\":%u,"
		       "\"queue_depth\":%u,\"max_transfer_size\":%llu,\"cold_gb_s\":%.4f,\"warm_gb_s\":%.4f},"
		       "\"picked\":{\"threads\":%u,\"queue_depth\":%u,\"max_transfer_size\":%llu,\"cold_gb_s\":%.4f,"
		       "\"warm_gb_s\":%.4f},\"gain_cold\":%.4f,\"gain_warm\":%.4f",
		       (unsigned long long)t->size, f->def.a, f->def.b, (unsigned long long)f->def.size, f->cd, f->wd,
		       f->cand.a, f->cand.b, (unsigned long long)f->cand.size, f->cc, f->wc, f->pick.a, f->pick.b,
		       (unsigned long long)f->pick.size, f->cp, f->wp, f->cp / f->cd, f->wp / f->wd);
	printf(",\"trials\":[%s],\"settings_file\":", t->trial_json);
	cli_json_str(conf ? conf : "");
	printf(",\"unchanged\":%s,\"written\":%s", memcmp(&f->def, &f->pick, sizeof(f->def)) ? "false" : "true",
	       written ? "true" : "false");
}

static void cli_print_table(const struct cli_tune *t, const struct cli_found *f)
{
	if (t->s3)
		printf("%-22s %12s %12s\n%-22s %12u %12u\n%-22s %12llu %12llu\n%-22s %12.2f %12.2f  (%.2fx)\n", "",
		       "defaults", "best trial", "s3_concurrency", f->def.a, f->cand.a, "s3_part_size",
		       (unsigned long long)f->def.size, (unsigned long long)f->cand.size, "GB/s (median of 3x3)", f->cd,
		       f->cc, f->cc / f->cd);
	else
		printf("%-22s %12s %12s\n%-22s %12u %12u\n%-22s %12llu %12llu\n%-22s %12u %12u\n"
		       "%-22s %12.2f %12.2f  (%.2fx)\n%-22s %12.2f %12.2f  (%.2fx)\n",
		       "", "defaults", "best trial", "threads", f->def.a, f->cand.a, "max_transfer_size",
		       (unsigned long long)f->def.size, (unsigned long long)f->cand.size, "queue_depth", f->def.b,
		       f->cand.b, "cold GB/s (median 3x3)", f->cd, f->cc, f->cc / f->cd, "warm GB/s (median 3x3)", f->wd,
		       f->wc, f->wc / f->wd);
	if (!memcmp(&f->def, &f->cand, sizeof(f->def)))
		printf("the defaults were the best of %u trials on this machine: they stay\n", t->trials);
	else if (f->kept)
		printf("the best trial did not beat the defaults side by side: the defaults stay\n");
}

/* The pick into the settings file at conf (NULL: none; dry: not), then the report; the exit code. */
static int cli_keep(const struct cli_tune *t, const struct cli_found *f, const char *conf, int dry)
{
	static const char *const fkeys[] = { "threads", "queue_depth", "max_transfer_size" };
	static const char *const okeys[] = { "s3_concurrency", "s3_part_size" };
	char vals[3][32], note[PATH_MAX + 256], day[32];
	time_t now = time(NULL);
	int wrc = 0;

	strftime(day, sizeof(day), "%Y-%m-%d", localtime(&now));
	snprintf(vals[0], sizeof(vals[0]), "%u", f->pick.a);
	snprintf(vals[1], sizeof(vals[1]), "%llu", (unsigned long long)(t->s3 ? f->pick.size : f->pick.b));
	snprintf(vals[2], sizeof(vals[2]), "%llu", (unsigned long long)f->pick.size);
	snprintf(note, sizeof(note), "sluice tune %s, %s: %.2f GB/s with these against %.2f with the defaults%s", cli_shown(t->path),
		 day, f->cp, f->cd, t->s3 ? "" : " (cold)");
	if (!dry && conf)
		wrc = cli_write(conf, t->s3 ? okeys : fkeys, vals, t->s3 ? 2 : 3, note);
	if (t->json) {
		/* A settings file that could not be written is the object's "error" (cli_error below). */
		cli_print_json(t, f, conf, !dry && conf && !wrc);
		cli_json_open("");
		if (!wrc)
			cli_json_close();
	} else {
		cli_print_table(t, f);
		if (dry)
			printf("not written (--dry-run)\n");
		else if (!conf)
			printf("not written: no settings file (SLUICE_CONFIG is empty, or no HOME)\n");
		else if (!wrc)
			printf("written to %s\n", conf);
	}
	return wrc ? cli_error(CMD, conf, wrc) : 0;
}

int cmd_tune(int argc, char **argv)
{
	struct cli_tune t = { 0 };
	struct cli_found f = { 0 };
	char exe[PATH_MAX], scratch[PATH_MAX + 32] = "", conf[PATH_MAX] = "";
	int dry = 0, rc, conf_rc;
	uint64_t size = 0;
	ssize_t n;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--json")) {
			t.json = 1;
		} else if (!strcmp(argv[i], "--dry-run")) {
			dry = 1;
		} else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
			if (cli_size(CMD, "--size", argv[++i], &size))
				return 2;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			return cli_fail(CMD, "unknown option '%s'\n%s", argv[i], usage);
		} else if (t.path) {
			return cli_fail(CMD, "one PATH, not '%s' too\n%s", argv[i], usage);
		} else {
			t.path = argv[i];
		}
	}
	if (!t.path)
		return cli_fail(CMD, "a PATH is needed\n%s", usage);
	if ((n = readlink("/proc/self/exe", exe, sizeof(exe) - 1)) <= 0)
		return cli_fail(CMD, "cannot find its own program (/proc/self/exe): %s", strerror(errno));
	exe[n] = 0;
	t.exe = exe;
	/* Where the pick goes; then no settings file for this process and the trials: they measure defaults. */
	conf_rc = sluice_settings_path(conf, sizeof(conf));
	setenv("SLUICE_CONFIG", "", 1);
	t.s3 = !strcmp(sluice_path_store(t.path, NULL), "s3"); /* its store's settings are the S3 ones */
	rc = cli_defaults(&t, size, scratch, sizeof(scratch), &f.def);
	if (!rc)
		rc = cli_trials(&t, &f);
	if (!rc)
		rc = cli_keep(&t, &f, conf_rc ? NULL : conf, dry);
	if (scratch[0])
		unlink(scratch);
	if (t.tmpdir[0])
		rmdir(t.tmpdir);
	return rc;
}
