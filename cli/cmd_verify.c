/* sluice verify: check every CRC and every bound; list each bad record. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define CMD "verify"

struct ctx {
	int json;
	int64_t n;
};

static void on_bad(const struct sluice_bad *b, void *user)
{
	struct ctx *c = user;

	if (c->json) {
		printf("%s{\"record\":", c->n ? "," : "");
		if (b->record == UINT64_MAX)
			printf("null");
		else
			printf("%llu", (unsigned long long)b->record);
		printf(",\"shard\":%u,\"offset\":%llu,\"error\":\"%s\",\"what\":", b->shard, (unsigned long long)b->offset,
		       sluice_strerror(b->code));
		cli_json_str(b->what);
		printf("}");
	} else if (b->record == UINT64_MAX) {
		printf("BAD shard %u: %s\n", b->shard, b->what);
	} else {
		printf("BAD record %llu (shard %u, offset %llu): %s\n", (unsigned long long)b->record, b->shard,
		       (unsigned long long)b->offset, b->what);
	}
	c->n++;
}

int cmd_verify(int argc, char **argv)
{
	struct sluice_dataset *ds;
	struct ctx c = { 0, 0 };
	const char *path = NULL;
	int64_t r;
	int rc;

	rc = cli_open_dataset(CMD, argc, argv,
			      "usage: sluice verify [--json] DATASET\n  exit 0: all good; 1: problems (listed); 2: bad usage\n",
			      NULL, NULL, &c.json, &path, &ds);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (c.json) {
		printf("{\"path\":");
		cli_json_str(cli_shown(path));
		printf(",\"records\":%llu,\"bad\":[", (unsigned long long)sluice_dataset_count(ds));
		cli_json_open("]");
	}
	r = sluice_dataset_verify(ds, on_bad, &c);
	if (c.json) {
		/* A verify that could not finish says so in the object: its "error" (cli_error below). */
		printf("],\"problems\":%lld,\"ok\":%s", (long long)(r < 0 ? c.n : r), r == 0 ? "true" : "false");
		cli_json_open("");
		if (r >= 0)
			cli_json_close();
	} else if (r == 0)
		printf("%s: %llu records, %s\n", cli_shown(path), (unsigned long long)sluice_dataset_count(ds),
		       sluice_dataset_has_crc(ds) ? "every CRC and bound checks out"
						  : "every bound checks out (the format has no CRCs to check)");
	else if (r > 0)
		printf("%s: %lld problem(s) in %llu records\n", cli_shown(path), (long long)r, (unsigned long long)sluice_dataset_count(ds));
	sluice_dataset_close(ds);
	if (r < 0)
		return cli_error(CMD, path, (long)r);
	return r == 0 ? 0 : 1;
}
