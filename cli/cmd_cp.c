/* sluice cp: files between any two stores: local paths, s3://, http(s):// (sluice_copy). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define CMD "cp"

static const char usage[] =
	"usage: sluice cp [--json] [-r|--recursive] SRC DST\n"
	"  SRC and DST are local paths, s3://BUCKET/KEY or http(s):// URLs (a web server that lists\n"
	"  directories to read a tree, one with WebDAV's PUT to write).  DST may be a directory\n"
	"  (local, existing; remote, ending in '/') that receives SRC under its own name.\n"
	"  -r: SRC is a directory or prefix; every file below it goes to DST/RELATIVE-NAME.\n"
	"  Parts of SLUICE_S3_PART_SIZE go SLUICE_S3_CONCURRENCY at a time, several files at once;\n"
	"  credentials and endpoint as the AWS CLI takes them (AWS_*, ~/.aws).\n";

int cmd_cp(int argc, char **argv)
{
	const char *src = NULL, *dst = NULL;
	struct sluice_copy_report rep = SLUICE_COPY_REPORT_INIT;
	unsigned flags = 0, kind = 0;
	int json = 0, rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "-r") || !strcmp(argv[i], "--recursive")) {
			flags |= SLUICE_COPY_RECURSIVE;
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
	rc = sluice_copy(src, dst, flags, &rep);
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
		printf("}\n");
	} else {
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
	}
	return 0;
}
