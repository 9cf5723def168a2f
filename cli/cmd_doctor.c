/* sluice doctor: what on this machine stands between storage and the GPU, and the fixes. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

struct cli_dr {
	int json, n[3];
};

static const char *const cli_verdict[] = { "ok", "warn", "fail" };

static int cli_dr_one(const struct sluice_check *c, void *arg)
{
	struct cli_dr *d = arg;

	if (d->json) {
		printf("%s{\"name\":", d->n[0] + d->n[1] + d->n[2] ? "," : "");
		cli_json_str(c->name);
		printf(",\"verdict\":\"%s\",\"value\":", cli_verdict[c->verdict]);
		cli_json_str(c->value);
		printf(",\"why\":");
		cli_json_str(c->why);
		printf(",\"fix\":");
		cli_json_str(c->fix);
		printf("}");
	} else {
		printf("%-4s  %-15s %s\n", cli_verdict[c->verdict], c->name, c->value);
		if (c->verdict != SLUICE_CHECK_OK)
			printf("      %-15s why: %s\n      %-15s fix: %s\n", "", c->why, "", c->fix);
	}
	d->n[c->verdict]++;
	return 0;
}

int cmd_doctor(int argc, char **argv)
{
	struct cli_dr d = { 0, { 0, 0, 0 } };
	const char *path = NULL;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			d.json = 1;
		else if (!strcmp(argv[i], "--help")) {
			printf("usage: sluice doctor [--json] [PATH]\n\n"
			       "Checks what stands between the data under PATH (default: the current directory;\n"
			       "s3://... for objects) and the GPU: one line per check, ok / warn / fail, the\n"
			       "measured value, and for each warning why it matters and the command that fixes it.\n"
			       "For an s3:// or http(s):// PATH, its endpoint is asked for PATH once (check\n"
			       "storage): a host name that does not resolve, nothing listening, no answer in time\n"
			       "or credentials refused is a fail, named as curl names it.\n"
			       "Exit status 1 when a check fails.  SLUICE_SYSROOT reads /proc and /sys from\n"
			       "another root (a container with the host's mounted there).  --json: one object;\n"
			       "where the checks cannot run, it holds \"error\".\n");
			return 0;
		} else if (argv[i][0] == '-' && argv[i][1])
			return cli_fail("doctor", "unknown option '%s'", argv[i]);
		else if (path)
			return cli_fail("doctor", "one PATH at most ('%s' and '%s')", path, argv[i]);
		else
			path = argv[i];
	}
	if (d.json) {
		/* Named as every message names it: a presigned URL's query is a credential. */
		printf("{\"path\":");
		cli_json_str(cli_shown(path ? path : "."));
		printf(",\"checks\":[");
		cli_json_open("]");
	}
	rc = sluice_doctor(path, cli_dr_one, &d);
	if (rc)
		return cli_error("doctor", "cannot run the checks", rc);
	if (d.json) {
		printf("],\"ok\":%d,\"warn\":%d,\"fail\":%d", d.n[0], d.n[1], d.n[2]);
		cli_json_open("");
		cli_json_close();
	} else
		printf("\n%d ok, %d warn, %d fail\n", d.n[0], d.n[1], d.n[2]);
	return d.n[SLUICE_CHECK_FAIL] ? 1 : 0;
}
