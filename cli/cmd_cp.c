/* sluice cp: files between any two stores: local paths, s3://, http(s):// (sluice_copy). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CMD "cp"

static const char usage[] =
	"usage: sluice cp [--json] [--progress|--quiet] [-r|--recursive [--links|-P] [-L|--dereference]] SRC DST\n"
	"  SRC and DST are local paths, s3://BUCKET/KEY or http(s):// URLs (a web server that lists\n"
	"  directories to read a tree, one with WebDAV's PUT to write).  DST may be a directory\n"
	"  (local, existing; remote, ending in '/') that receives SRC under its own name; a local\n"
	"  DST's directory must exist (-r makes DST itself, not the directories above it).\n"
	"  -r: SRC is a directory or prefix; every file below it goes to DST/RELATIVE-NAME.  A local\n"
	"  tree's symbolic links: one inside the tree is copied as the file it leads to; one that leads\n"
	"  out of it (or to nothing, or round a loop) is skipped and named on stderr.\n"
	"  --links, -P: links inside the tree stay links (relative ones), into a local DST only\n"
	"  -L, --dereference: links out of the tree are copied too, as the files they lead to\n"
	"  --progress: bytes, rate and time left on stderr (the default on a terminal, not with --json)\n"
	"  --quiet, -q: no progress and no summary (errors and skipped links are still said)\n"
	"  Parts of SLUICE_S3_PART_SIZE go SLUICE_S3_CONCURRENCY at a time, several files at once;\n"
	"  credentials and endpoint as the AWS CLI takes them (AWS_*, ~/.aws).\n";

struct cli_progress {
	int tty;        /* stderr is a terminal: one line, rewritten */
	double t0, last; /* seconds: the start, the last line */
	uint64_t bytes, files_done; /* the last line's, where printed */
	int printed;
	int shown;      /* a line is on the terminal, to end with a newline */
};

static double cli_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* n bytes as "123.4 MB" into out. */
static const char *cli_mb(uint64_t n, char out[32])
{
	if (n >= 10000000000ull)
		snprintf(out, 32, "%.2f GB", (double)n / 1e9);
	else
		snprintf(out, 32, "%.1f MB", (double)n / 1e6);
	return out;
}

/*
 * The progress line: on a terminal rewritten in place at most 4 times a
 * second (the copy tells that often); elsewhere (--progress into a log)
 * a line every 5 seconds.  The end (every file done) always shows, but
 * never the same line twice.
 */
static void cli_show_progress(uint64_t bytes, uint64_t total, uint64_t files_done, uint64_t files, void *arg)
{
	struct cli_progress *p = arg;
	double now = cli_now(), secs = now - p->t0, rate = secs > 0 ? (double)bytes / secs : 0;
	char a[32], b[32], eta[32] = "";
	const int last = files_done == files;

	if ((!last && now - p->last < (p->tty ? 0.2 : 5.0)) || (p->printed && bytes == p->bytes &&
								    files_done == p->files_done))
		return;
	p->printed = 1;
	p->last = now;
	p->bytes = bytes;
	p->files_done = files_done;
	if (total && rate > 0 && !last) {
		double left = (double)(total - bytes) / rate;

		snprintf(eta, sizeof(eta), ", %dm%02ds left", (int)(left / 60), (int)left % 60);
	}
	fprintf(stderr, "%ssluice cp: %s", p->tty ? "\r" : "", cli_mb(bytes, a));
	if (total)
		fprintf(stderr, " of %s (%.0f%%)", cli_mb(total, b), 100.0 * (double)bytes / (double)total);
	fprintf(stderr, ", %.1f MB/s%s, %llu of %llu file%s%s", rate / 1e6, eta, (unsigned long long)files_done,
		(unsigned long long)files, files == 1 ? "" : "s", p->tty ? "\033[K" : "\n");
	p->shown = p->tty;
	fflush(stderr);
}

int cmd_cp(int argc, char **argv)
{
	const char *src = NULL, *dst = NULL;
	struct sluice_copy_report rep = SLUICE_COPY_REPORT_INIT;
	struct cli_progress prog = { .tty = isatty(2) };
	unsigned flags = 0, kind = 0;
	int json = 0, rc, progress = 0, quiet = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "-r") || !strcmp(argv[i], "--recursive")) {
			flags |= SLUICE_COPY_RECURSIVE;
		} else if (!strcmp(argv[i], "--links") || !strcmp(argv[i], "-P")) {
			flags |= SLUICE_COPY_LINKS;
		} else if (!strcmp(argv[i], "-L") || !strcmp(argv[i], "--dereference")) {
			flags |= SLUICE_COPY_FOLLOW;
		} else if (!strcmp(argv[i], "--progress")) {
			progress = 1;
		} else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q")) {
			quiet = 1;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			return cli_fail(CMD, "unknown option '%s'\n%s", argv[i], usage);
		} else if (!src) {
			src = argv[i];
		} else if (!dst) {
			dst = argv[i];
		} else {
			return cli_fail(CMD, "one SRC and one DST, not '%s' too\n%s", argv[i], usage);
		}
	}
	if (!dst)
		return cli_fail(CMD, "a SRC and a DST are needed\n%s", usage);
	if (progress && quiet)
		return cli_fail(CMD, "--progress and --quiet together: which one?");
	if ((flags & (SLUICE_COPY_LINKS | SLUICE_COPY_FOLLOW)) && !(flags & SLUICE_COPY_RECURSIVE))
		return cli_fail(CMD, "--links and -L are about the links inside a tree: they go with -r");
	/* Shown on a terminal unless asked not to; elsewhere (a log, a pipe) only when asked. */
	progress = !quiet && (progress || (prog.tty && !json));
	prog.t0 = prog.last = cli_now();
	rc = sluice_copy_with_progress(src, dst, flags, &rep, progress ? cli_show_progress : NULL, &prog);
	if (prog.shown)
		fputc('\n', stderr);
	if (rc)
		return cli_error(CMD, src, rc);
	/* Named as every message of sluice names them: a URL's query or password is a credential. */
	if (json) {
		printf("{\"src\":");
		cli_json_str(cli_shown(src));
		printf(",\"dst\":");
		cli_json_str(cli_shown(dst));
		printf(",\"files\":%llu,\"bytes\":%llu,\"seconds\":%.6f,\"gbps\":%.4f,\"files_verified\":%llu,\"checksum\":",
		       (unsigned long long)rep.files, (unsigned long long)rep.bytes, rep.seconds,
		       rep.seconds > 0 ? (double)rep.bytes / rep.seconds / 1e9 : 0.0, (unsigned long long)rep.files_verified);
		cli_json_str(rep.checksum);
		printf(",\"skipped\":%llu}\n", (unsigned long long)rep.skipped);
	} else if (!quiet) {
		printf("copied %llu file%s, %.1f MB, %s -> %s in %.2f s (%.2f GB/s)\n", (unsigned long long)rep.files,
		       rep.files == 1 ? "" : "s", (double)rep.bytes / 1e6, cli_shown(src), cli_shown(dst), rep.seconds,
		       rep.seconds > 0 ? (double)rep.bytes / rep.seconds / 1e9 : 0.0);
		/* Into a local destination each file is checked here where its source has a checksum; else the far end's. */
		if (sluice_path_store(dst, &kind), kind & SLUICE_STORE_LOCAL)
			printf("checksum: %llu of %llu file%s checked against the source's checksum: %s\n",
			       (unsigned long long)rep.files_verified, (unsigned long long)rep.files, rep.files == 1 ? "" : "s",
			       rep.checksum);
		else
			printf("checksum: %s\n", rep.checksum);
		if (rep.skipped)
			printf("skipped: %llu link%s or special file%s of the tree, each named above\n",
			       (unsigned long long)rep.skipped, rep.skipped == 1 ? "" : "s", rep.skipped == 1 ? "" : "s");
	}
	return 0;
}
