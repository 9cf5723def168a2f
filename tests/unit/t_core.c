/* core: error names, size parsing, configuration from setters and environment, histogram. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "t_util.h"

static void t_errors(void)
{
	T_CHECK(!strcmp(sluice_strerror(0), "success"));
	T_CHECK(!strcmp(sluice_strerror(-ENOENT), strerror(ENOENT)));
	for (int c = SLUICE_EINVAL_CONFIG; c > SLUICE_ELAST; c--)
		T_CHECK(strcmp(sluice_strerror(c), "unknown sluice error") != 0);
	T_CHECK(!strcmp(sluice_strerror(SLUICE_ELAST), "unknown error"));
	/* Every own code has a name, and the name is its enum's. */
	for (int c = SLUICE_EBASE; c > SLUICE_ELAST; c--)
		T_CHECK(!strncmp(sluice_error_name(c), "SLUICE_E", 8));
	T_CHECK(!strcmp(sluice_error_name(SLUICE_ERESOLVE), "SLUICE_ERESOLVE"));
	T_CHECK(!strcmp(sluice_error_name(SLUICE_ECRC), "SLUICE_ECRC"));
	T_CHECK(!strcmp(sluice_error_name(-ENOENT), "ENOENT"));
	T_CHECK(!strcmp(sluice_error_name(SLUICE_ELAST), ""));
	T_CHECK(!strcmp(sluice_error_name(0), ""));
	T_CHECK(!strcmp(sluice_error_name(-4095), ""));
	T_CHECK(sl__err(SLUICE_ERANGE, "file %s", "x.bin") == SLUICE_ERANGE);
	T_CHECK(!strcmp(sluice_last_error_detail(), "file x.bin"));
	/* Wrapping the current detail in a new one. */
	sl__err(SLUICE_ERANGE, "outer: %s", sluice_last_error_detail());
	T_CHECK(!strcmp(sluice_last_error_detail(), "outer: file x.bin"));
	/* A name of control bytes (an index's, a server's) shows escaped, and stays so wrapped again; UTF-8 stays. */
	sl__err(SLUICE_EFORMAT, "'%s'", "\x1b]0;pwned\x07/\x7f\xc3\xa9");
	T_CHECK(!strcmp(sluice_last_error_detail(), "'\\x1b]0;pwned\\x07/\\x7f\xc3\xa9'"));
	sl__err(SLUICE_EFORMAT, "again: %s", sluice_last_error_detail());
	T_CHECK(!strcmp(sluice_last_error_detail(), "again: '\\x1b]0;pwned\\x07/\\x7f\xc3\xa9'"));
}

/*
 * Every error detail names a URL as sluice_url_redact() does, whichever
 * message put it there: no password of the userinfo, no query.
 */
static void t_details_hide_credentials(void)
{
	const char *url = "http://alice:PASSW0RD@h:8080/d/x?X-Amz-Signature=SIGSECRET";
	struct sluice_copy_report rep = SLUICE_COPY_REPORT_INIT;
	const char *d;

	sl__err(-ENOENT, "%s/index.sli: cannot open, and s3://b/k?sig=SIGSECRET, (https://u:PASSW0RD@x/y)", url);
	d = sluice_last_error_detail();
	T_CHECK(!strstr(d, "PASSW0RD") && !strstr(d, "SIGSECRET"));
	T_CHECK(!strcmp(d, "http://alice:***@h:8080/d/x?...: cannot open, and s3://b/k?..., (https://u:***@x/y)"));
	/* A path's '?' is its own; a message without a URL is as formatted. */
	sl__err(-ENOENT, "/tmp/a?b: no");
	T_CHECK(!strcmp(sluice_last_error_detail(), "/tmp/a?b: no"));
	T_CHECK(sluice_copy(url, "/tmp/t_core-never", 0, &rep) < 0);
	d = sluice_last_error_detail();
	T_CHECK(*d && !strstr(d, "PASSW0RD") && !strstr(d, "SIGSECRET") && strstr(d, "alice:***@h:8080"));
}

static void t_sizes(void)
{
	uint64_t v;

	T_CHECK(sluice_parse_size("0", &v) == 0 && v == 0);
	T_CHECK(sluice_parse_size("4096", &v) == 0 && v == 4096);
	T_CHECK(sluice_parse_size("16M", &v) == 0 && v == 16u << 20);
	T_CHECK(sluice_parse_size("16MiB", &v) == 0 && v == 16u << 20);
	T_CHECK(sluice_parse_size("2g", &v) == 0 && v == 2ull << 30);
	T_CHECK(sluice_parse_size("1T", &v) == 0 && v == 1ull << 40);
	T_CHECK(sluice_parse_size("", &v) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_parse_size("-1", &v) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_parse_size("12X", &v) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_parse_size("1M2", &v) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_parse_size("99999999999999999999", &v) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_parse_size("17179869184T", &v) == SLUICE_EINVAL_CONFIG);
}

static void t_config(void)
{
	struct sluice_config *cfg;

	unsetenv("SLUICE_THREADS");
	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(cfg->threads >= 1 && cfg->threads <= 16); /* the CPUs, at most 16 */
	T_CHECK(sluice_config_set_threads(cfg, 0) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_config_set_threads(cfg, 3) == 0 && cfg->threads == 3);
	T_CHECK(sluice_config_set_max_transfer_size(cfg, 1000) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_config_set_max_transfer_size(cfg, 1u << 20) == 0);
	T_CHECK(sluice_config_set_queue_depth(cfg, 257) == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_config_set_backend(cfg, (enum sluice_backend)9) == SLUICE_EINVAL_CONFIG);
	sluice_config_free(cfg);
	sluice_config_free(NULL);

	setenv("SLUICE_THREADS", "5", 1);
	setenv("SLUICE_MAX_TRANSFER_SIZE", "2M", 1);
	setenv("SLUICE_BACKEND", "psync", 1);
	setenv("SLUICE_DIRECT", "never", 1);
	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(cfg->threads == 5 && cfg->max_transfer_size == 2u << 20);
	T_CHECK(cfg->backend == SLUICE_BACKEND_PSYNC && cfg->direct == SLUICE_DIRECT_NEVER);
	sluice_config_free(cfg);

	setenv("SLUICE_THREADS", "lots", 1);
	T_CHECK(sluice_config_new(&cfg) == SLUICE_EINVAL_CONFIG && cfg == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), "SLUICE_THREADS") != NULL);
	setenv("SLUICE_THREADS", "0", 1);
	T_CHECK(sluice_config_new(&cfg) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "SLUICE_THREADS") != NULL);
	unsetenv("SLUICE_THREADS");
	setenv("SLUICE_BACKEND", "nvme", 1);
	T_CHECK(sluice_config_new(&cfg) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "SLUICE_BACKEND") != NULL);
	unsetenv("SLUICE_BACKEND");
	setenv("SLUICE_MAX_TRANSFER_SIZE", "5000", 1);
	T_CHECK(sluice_config_new(&cfg) == SLUICE_EINVAL_CONFIG);
	unsetenv("SLUICE_MAX_TRANSFER_SIZE");
	unsetenv("SLUICE_DIRECT");

	/* The settings read where they are used are named at the first config too, never taken silently. */
	{
		static const char *const bad[][2] = {
			{ "SLUICE_BUFFER_POOL_SIZE", "1P" }, { "SLUICE_LOG", "bogus" },  { "SLUICE_TRACE", "/nonexistent/x" },
			{ "SLUICE_METRICS_PORT", "22" },     { "SLUICE_STATS", "soon" }, { "SLUICE_DECODE", "fast" },
			{ "SLUICE_CACHE_LIMIT", "lots" },    { "SLUICE_RUN_DIR", "rel" }, { "SLUICE_METRICS_PORT", "99999" },
			/* a space before an ordinal, a period that rounds to 0 ns, directories that cannot be */
			{ "SLUICE_DEVICE_IDS", " 8" },       { "SLUICE_DEVICE_IDS", "0, 1" }, { "SLUICE_STATS", "1e-300" },
			{ "SLUICE_STATS", "nan" },           { "SLUICE_CACHE_DIR", "/dev/null/x" },
			{ "SLUICE_RUN_DIR", "/dev/null/x" }, { "SLUICE_RUN_DIR", "/dev/null" },
		};
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			setenv(bad[i][0], bad[i][1], 1);
			T_CHECK(sluice_config_new(&cfg) == SLUICE_EINVAL_CONFIG && strstr(sluice_last_error_detail(), bad[i][0]));
			unsetenv(bad[i][0]);
		}
		setenv("SLUICE_METRICS_PORT", "9464", 1);
		setenv("SLUICE_LOG", "warn", 1);
		T_CHECK(sluice_config_new(&cfg) == 0);
		sluice_config_free(cfg);
		unsetenv("SLUICE_METRICS_PORT");
		unsetenv("SLUICE_LOG");
	}
}

/*
 * The registry: every default is a value its own checks take; the generic
 * setter reaches the same fields and refusals as the typed ones; the
 * settings file is written through the reader's checks and read back.
 */
static void t_registry(void)
{
	struct sluice_config *cfg;
	struct sluice_setting st;
	char dir[] = "/tmp/t_core.XXXXXX", path[64], text[512] = "";
	const char *names[] = { "threads", "SLUICE_MAX_TRANSFER_SIZE" }, *vals[] = { "7", "8M" }, *bad[] = { "0" };
	unsigned n = 0;
	FILE *f;

	for (const struct sl__setting_def *d = sl__settings; d->name; d++, n++) {
		uint64_t u;

		T_CHECK(!strncmp(d->name, "SLUICE_", 7) && d->help && *d->help);
		T_CHECK((d->scope == SL_SCOPE_ENGINE) == !!d->apply);
		T_CHECK(sl__setting_def(d->name + 7) == d); /* the file's key names it too */
		if (*d->def && d->type != SL_SET_PATH)
			T_CHECK(sl__setting_parse(d, d->def, "the default", &u) == 0);
		T_CHECK(sluice_setting_get(n, &st) == 0 && !strcmp(st.name, d->name));
	}
	T_CHECK(n >= 25 && sluice_setting_get(n, &st) == -ENOENT);
	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(sluice_config_set(cfg, "threads", "9") == 0 && cfg->threads == 9);
	T_CHECK(sluice_config_set(cfg, "SLUICE_BACKEND", "psync") == 0 && cfg->backend == SLUICE_BACKEND_PSYNC);
	T_CHECK(sluice_config_set(cfg, "device_ids", "1,0") == 0 && cfg->ndevices == 2 && cfg->devices[0] == 1);
	T_CHECK(sluice_config_set(cfg, "device_ids", "1,1") == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_config_set(cfg, "max_transfer_size", "4097") == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "SLUICE_MAX_TRANSFER_SIZE") && strstr(sluice_last_error_detail(), "4K"));
	T_CHECK(sluice_config_set(cfg, "s3_retries", "3") == SLUICE_EINVAL_CONFIG); /* a process setting */
	T_CHECK(sluice_config_set(cfg, "no_such", "3") == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "no_such"));
	sluice_config_free(cfg);

	/* The writer: values checked first, other lines kept, old values of the same keys replaced. */
	T_CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/s.conf", dir);
	setenv("SLUICE_CONFIG", path, 1);
	f = fopen(path, "w");
	fputs("# mine\n[other]\nthreads = 99\n[sluice]\nthreads = 2\nqueue_depth = 8\n", f);
	fclose(f);
	T_CHECK(sluice_settings_write(NULL, names, bad, 1, "sluice tune x") == SLUICE_EINVAL_CONFIG);
	T_CHECK(sluice_settings_write(NULL, names, vals, 2, "sluice tune x") == 0);
	T_CHECK(sluice_settings_write(NULL, names, vals, 2, "sluice tune y") == 0); /* the old note goes */
	f = fopen(path, "r");
	T_CHECK(f && fread(text, 1, sizeof(text) - 1, f) > 0);
	fclose(f);
	T_CHECK(!strcmp(text, "# mine\n[other]\nthreads = 99\n[sluice]\n# sluice tune y\nthreads = 7\n"
			      "max_transfer_size = 8M\nqueue_depth = 8\n"));
	unsetenv("SLUICE_CONFIG");
	unlink(path);
	rmdir(dir);
}

static void t_hist(void)
{
	static struct sl__hist h;

	for (uint64_t v = 1; v <= 10000; v++)
		sl__hist_add(&h, v * 1000);
	uint64_t p50 = sl__hist_percentile(&h, 50), p99 = sl__hist_percentile(&h, 99);

	/* Sub-bucket resolution is 1/16 of the power of two. */
	T_CHECK(p50 > 5000000 * 15 / 16 && p50 < 5000000 * 17 / 16);
	T_CHECK(p99 > 9900000 * 15 / 16 && p99 <= 10000000);
	T_CHECK(sl__hist_percentile(&h, 100) <= 10000000);
	sl__hist_reset(&h);
	T_CHECK(sl__hist_percentile(&h, 50) == 0);
	sl__hist_add(&h, 3);
	T_CHECK(sl__hist_percentile(&h, 50) == 3);
}

static void t_crc_combine(void)
{
	char buf[5000];

	t_fill(buf, sizeof(buf), 3);
	for (size_t cut = 0; cut <= sizeof(buf); cut += 997) {
		uint32_t a = sluice_crc32c(0, buf, cut), b = sluice_crc32c(0, buf + cut, sizeof(buf) - cut);

		T_CHECK(sl__crc32c_combine(a, b, sizeof(buf) - cut) == sluice_crc32c(0, buf, sizeof(buf)));
		a = sl__crc(SL_CRC32, 0, buf, cut);
		b = sl__crc(SL_CRC32, 0, buf + cut, sizeof(buf) - cut);
		T_CHECK(sl__crc_combine(SL_CRC32, a, b, sizeof(buf) - cut) == sl__crc(SL_CRC32, 0, buf, sizeof(buf)));
		T_CHECK(sl__crc(SL_CRC32, a, buf + cut, sizeof(buf) - cut) == sl__crc(SL_CRC32, 0, buf, sizeof(buf)));
	}
	/* The check values of both: "123456789" (zlib's crc32 and iSCSI's CRC32C). */
	T_CHECK(sl__crc(SL_CRC32, 0, "123456789", 9) == 0xCBF43926u);
	T_CHECK(sl__crc(SL_CRC32C, 0, "123456789", 9) == 0xE3069283u);
}

/*
 * CRC-64/NVME pieces fold into the whole's CRC as the 32-bit kinds' do
 * (an object's CRC64NVME from its pieces' CRCs, in file order): random
 * splits into up to 8 pieces, empty pieces among them, and every kind.
 */
static void t_crc64_combine(void)
{
	static const int kinds[] = { SL_CRC64NVME, SL_CRC32C, SL_CRC32 };
	unsigned char buf[70000];
	unsigned seed = 37;

	t_fill((char *)buf, sizeof(buf), 5);
	/* The check value (RevEng's catalogue), and one split by hand. */
	T_CHECK(sl__crc(SL_CRC64NVME, 0, "123456789", 9) == 0xae8b14860a799888ull);
	T_CHECK(sl__crc_combine(SL_CRC64NVME, sl__crc(SL_CRC64NVME, 0, "1234", 4), sl__crc(SL_CRC64NVME, 0, "56789", 5),
				5) == 0xae8b14860a799888ull);
	for (int round = 0; round < 60; round++) {
		const int kind = kinds[round % 3];
		size_t n = (size_t)rand_r(&seed) % (sizeof(buf) + 1), off = 0;
		uint64_t whole = sl__crc(kind, 0, buf, n), folded = 0;

		for (int piece = 0; piece < 8 && (off < n || piece == 0); piece++) {
			/* Zero-length pieces: every fourth, and the whole of an empty read. */
			size_t len = piece == 7 ? n - off : rand_r(&seed) % 4 == 0 ? 0 : (size_t)rand_r(&seed) % (n - off + 1);
			uint64_t c = sl__crc(kind, 0, buf + off, len);

			folded = piece == 0 ? c : sl__crc_combine(kind, folded, c, len);
			off += len;
		}
		T_CHECK(folded == whole);
		/* A flipped bit anywhere gives another CRC. */
		if (n) {
			buf[n / 2] ^= 0x10;
			T_CHECK(sl__crc(kind, 0, buf, n) != whole);
			buf[n / 2] ^= 0x10;
		}
	}
	T_CHECK(sl__crc_combine(SL_CRC64NVME, 0x1234, 0, 0) == 0x1234);
}

/* The structs that grow (sluice.h's conventions): older and newer callers' sizes, and a size left unset. */
struct t_v2 {
	size_t size;
	int a;
	int b; /* "added in a later release" */
	uint64_t guard;
};

static void t_growing_structs(void)
{
	const size_t v1 = offsetof(struct t_v2, b);
	struct t_v2 mine, theirs = { offsetof(struct t_v2, b), 7, 9, 0 };
	unsigned char newer[sizeof(struct t_v2) + 8] = { 0 };
	struct sluice_packer_options po = SLUICE_PACKER_OPTIONS_INIT;
	struct sluice_packer *p = NULL;
	struct sluice_copy_report cr = SLUICE_COPY_REPORT_INIT;

	/* An older caller's options: the field it lacks reads 0, whatever lies past its size. */
	T_CHECK(sl__sized_in(&mine, sizeof(mine), &theirs, v1, "t_v2") == 0);
	T_CHECK(mine.size == sizeof(mine) && mine.a == 7 && mine.b == 0);
	/* A newer caller's: unknown fields 0 are fine, one set is refused. */
	*(size_t *)newer = sizeof(newer);
	T_CHECK(sl__sized_in(&mine, sizeof(mine), newer, v1, "t_v2") == 0);
	newer[sizeof(newer) - 1] = 1;
	T_CHECK(sl__sized_in(&mine, sizeof(mine), newer, v1, "t_v2") == -E2BIG);
	theirs.size = 0;
	T_CHECK(sl__sized_in(&mine, sizeof(mine), &theirs, v1, "t_v2") == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "struct t_v2: size 0") != NULL);
	/* An older caller's report: only what its size covers is written. */
	theirs = (struct t_v2){ v1, 1, 2, 3 };
	mine = (struct t_v2){ sizeof(mine), 10, 20, 30 };
	T_CHECK(sl__report_in(&theirs, sizeof(theirs), v1, "t_v2") == 0 && theirs.a == 0 && theirs.b == 2);
	sl__report_copy(&theirs, &mine, sizeof(mine));
	T_CHECK(theirs.size == v1 && theirs.a == 10 && theirs.b == 2 && theirs.guard == 3);
	/* Through the public calls: a size left 0 is refused before any work, naming the struct. */
	po.context = 16;
	T_CHECK(sluice_packer_new(&p, &po) == 0);
	sluice_packer_free(p);
	po.size = 0;
	T_CHECK(sluice_packer_new(&p, &po) == SLUICE_EINVAL_CONFIG && !p);
	T_CHECK(strstr(sluice_last_error_detail(), "sluice_packer_options") != NULL);
	cr.size = 0;
	T_CHECK(sluice_copy("/nonexistent-src", "/nonexistent-dst", 0, &cr) == SLUICE_EINVAL_CONFIG);
	T_CHECK(strstr(sluice_last_error_detail(), "sluice_copy_report") != NULL);
}

/*
 * Paths from outside that are not regular files: a FIFO with no writer
 * must not hold an open (or a settings file's read) forever, and /dev/zero
 * must not stream forever: both refused, naming the path; a block device or
 * a regular file is taken.
 */
static void t_special_files(void)
{
	char fifo[512], conf[600];
	struct sluice_engine *eng;
	struct sluice_config *cfg;
	struct sluice_file *f = NULL;
	int fd;

	snprintf(fifo, sizeof(fifo), "%s/fifo", t_dir("special"));
	T_CHECK(mkfifo(fifo, 0600) == 0);
	alarm(20); /* a regression blocks: SIGALRM fails the test rather than hanging CTest */
	fd = sl__open_file(fifo, O_RDONLY, 0);
	T_CHECK(fd == -EINVAL && strstr(sluice_last_error_detail(), "FIFO") && strstr(sluice_last_error_detail(), fifo));
	T_CHECK(sl__open_file("/dev/zero", O_RDONLY, 0) == -EINVAL &&
		strstr(sluice_last_error_detail(), "character device"));
	T_CHECK(sl__open_file("/", O_RDONLY, 0) == -EISDIR);
	T_CHECK((fd = sl__open_file("/proc/self/exe", O_RDONLY, 0)) >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK));
	if (fd >= 0)
		close(fd);
	/* The store of local files refuses them too (every sluice_file_open of a path). */
	T_CHECK(sluice_config_new(&cfg) == 0);
	T_CHECK(sluice_config_set_gpu(cfg, 0) == 0);
	T_CHECK(sluice_engine_open(&eng, cfg) == 0);
	T_CHECK(sluice_file_open(&f, eng, fifo, 0) == -EINVAL && !f);
	T_CHECK(sluice_file_open(&f, eng, "/dev/zero", 0) == -EINVAL && !f);
	sluice_engine_close(eng);
	/* A pool smaller than one bounce slot is refused, not silently grown. */
	T_CHECK(sluice_config_set_buffer_pool_size(cfg, 4096) == 0);
	T_CHECK(sluice_engine_open(&eng, cfg) == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "SLUICE_BUFFER_POOL_SIZE"));
	sluice_config_free(cfg);
	/* The settings file, written by `sluice tune`, as a FIFO. */
	snprintf(conf, sizeof(conf), "%s", fifo);
	T_CHECK(sl__ini_file(conf, NULL, NULL) == -EINVAL && strstr(sluice_last_error_detail(), fifo));
	T_CHECK(sluice_settings_write(conf, (const char *[]){ "threads" }, (const char *[]){ "4" }, 1, "t") == -EINVAL);
	alarm(0);
	/* mkdir -p of an empty path is an error, not a read before it. */
	T_CHECK(sl__mkdirs((char[]){ "" }) == -ENOENT);
}

/*
 * Every number of the settings table is decimal as its type says: strtod took SLUICE_STATS=0x10 as 16 s, and
 * exponents, "inf", signs and white space; none is a number any setting documents.
 */
static void t_numbers_are_decimal(void)
{
	static const char *const refused[] = { "0x10", "0X10", "1e2", "1E2", " 5", "5 ", "+5", "-5", "inf", "nan",
					       "0x1p4", ".", "1.2.3", "", "5s", "\xef\xbc\x95" /* a fullwidth 5 */ };
	static const char *const names[] = { "SLUICE_STATS", "SLUICE_THREADS", "SLUICE_MAX_TRANSFER_SIZE", "SLUICE_GPU",
					     "SLUICE_HTTP_STALL_TIME" };
	uint64_t u;

	for (size_t n = 0; n < sizeof(names) / sizeof(names[0]); n++)
		for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
			const struct sl__setting_def *d = sl__setting_def(names[n]);

			if (sl__setting_parse(d, refused[i], "t", &u) != SLUICE_EINVAL_CONFIG) {
				printf("  %s=\"%s\" was taken (%llu)\n", names[n], refused[i], (unsigned long long)u);
				T_CHECK(0);
			}
		}
	T_CHECK(sl__setting_parse(sl__setting_def("SLUICE_STATS"), "0.5", "t", &u) == 0 && u == 500000000);
	T_CHECK(sl__setting_parse(sl__setting_def("SLUICE_STATS"), ".25", "t", &u) == 0 && u == 250000000);
	T_CHECK(sl__setting_parse(sl__setting_def("SLUICE_STATS"), "16", "t", &u) == 0 && u == 16000000000ull);
	T_CHECK(sl__setting_parse(sl__setting_def("SLUICE_THREADS"), "010", "t", &u) == 0 && u == 10); /* not octal */
	T_CHECK(sl__setting_parse(sl__setting_def("SLUICE_STATS"), "0x10", "the environment", &u) == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "SLUICE_STATS=\"0x10\" (the environment): want decimal seconds"));
	setenv("SLUICE_STATS", "0x10", 1);
	T_CHECK(sluice_config_new(&(struct sluice_config *){ NULL }) == SLUICE_EINVAL_CONFIG);
	unsetenv("SLUICE_STATS");
}

/* A literal's bytes, NULs and all, through the INI reader into kv. */
#define T_INI(lit) sl__ini_parse(lit, sizeof(lit) - 1, "s.conf", t_kv_take, &kv)

struct t_kv {
	char key[64], value[64];
	unsigned n;
};

static int t_kv_take(const char *section, const char *key, const char *value, void *ctx)
{
	struct t_kv *kv = ctx;

	(void)section;
	snprintf(kv->key, sizeof(kv->key), "%s", key);
	snprintf(kv->value, sizeof(kv->value), "%s", value);
	kv->n++;
	return 0;
}

/*
 * A settings file's bytes: a UTF-8 byte-order mark (Notepad writes one) is skipped, as editors and Python's
 * utf-8-sig take it; other bytes that are not UTF-8 are named with file, line and column, a UTF-16 file as such;
 * an update keeps the mark and replaces the key in its section (it added a second [sluice] before).
 */
static void t_settings_file_bytes(void)
{
	static const char bom[] = "\xef\xbb\xbf[sluice]\nthreads = 3\n";
	char dir[] = "/tmp/t_core_bom.XXXXXX", path[64], text[256] = "";
	struct t_kv kv = { "", "", 0 };
	FILE *f;

	T_CHECK(sl__ini_parse(bom, sizeof(bom) - 1, "s.conf", t_kv_take, &kv) == 0 && kv.n == 1 &&
		!strcmp(kv.key, "threads") && !strcmp(kv.value, "3"));
	/* UTF-8 beyond ASCII is text: a comment and a value. */
	kv.n = 0;
	T_CHECK(T_INI("[sluice]\n# caf\xc3\xa9\npython = /opt/\xe6\x97\xa5/python3\n") == 0 && kv.n == 1 &&
		!strcmp(kv.value, "/opt/\xe6\x97\xa5/python3"));
	T_CHECK(T_INI("[sluice]\n# caf\xe9\nthreads = 3\n") == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "s.conf:2: byte 0xe9 at column 6 is not UTF-8"));
	T_CHECK(T_INI("[sluice]\nthreads = \xc0\xb3\n") == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "s.conf:2: byte 0xc0 at column 11")); /* an overlong '3' */
	T_CHECK(T_INI("\xef\xbb[sluice]\n") == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "s.conf:1: byte 0xef at column 1")); /* a mark cut short */
	T_CHECK(T_INI("\xff\xfe[\0s\0") == SLUICE_EINVAL_CONFIG &&
		strstr(sluice_last_error_detail(), "s.conf:1: the file is UTF-16"));
	/* A mark only at the start: inside the text it is a character of the key (which no setting has). */
	T_CHECK(T_INI("[sluice]\n\xef\xbb\xbfthreads = 3\n") == 0 && strcmp(kv.key, "threads"));

	T_CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/s.conf", dir);
	f = fopen(path, "w");
	fputs(bom, f);
	fclose(f);
	T_CHECK(sluice_settings_write(path, (const char *[]){ "threads" }, (const char *[]){ "5" }, 1, "sluice tune t") == 0);
	f = fopen(path, "r");
	T_CHECK(f && fread(text, 1, sizeof(text) - 1, f) > 0);
	fclose(f);
	T_CHECK(!strcmp(text, "\xef\xbb\xbf[sluice]\n# sluice tune t\nthreads = 5\n"));
	if (strcmp(text, "\xef\xbb\xbf[sluice]\n# sluice tune t\nthreads = 5\n"))
		printf("  the update wrote: %s\n", text);
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	t_special_files();
	t_growing_structs();
	t_registry();
	t_errors();
	t_details_hide_credentials();
	t_crc_combine();
	t_crc64_combine();
	t_sizes();
	t_config();
	t_hist();
	t_numbers_are_decimal();
	t_settings_file_bytes();
	return t_done("t_core");
}
