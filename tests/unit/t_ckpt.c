/*
 * sluice_ckpt_*: safetensors files written here byte by byte (one file, a
 * sharded directory with and without its index, sluice.dcp's layout), their
 * tables and every loaded byte checked; an unaligned tensor placed aligned;
 * a file replaced after the open still loads its old bytes, one cut short
 * fails; and hostile headers, indexes and metadata each refused naming the
 * file; one file's header read through an open file (sluice_st_header_*); a
 * caller's list of files or index bytes (sluice_ckpt_open_files).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLUICE_EXPERIMENTAL /* sluice_st_header_*: the header reader the Python package calls */
#include "t_util.h"

static const char *dir;

/* Writes a safetensors file: the header JSON, padded with spaces to a multiple of 8, then data; returns where the
 * data starts. */
static int st_write(const char *path, const char *json, const void *data, size_t n)
{
	size_t hl = strlen(json), pad = (8 - hl % 8) % 8;
	uint64_t len = hl + pad;
	FILE *f = fopen(path, "wb");

	T_CHECK(f != NULL);
	if (!f)
		return 0;
	fwrite(&len, 8, 1, f);
	fwrite(json, 1, hl, f);
	for (size_t i = 0; i < pad; i++)
		fputc(' ', f);
	if (n)
		fwrite(data, 1, n, f);
	fclose(f);
	return (int)(8 + len);
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");

	T_CHECK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static const char *at(const char *name)
{
	static char p[4][1024];
	static int k;

	k = (k + 1) % 4;
	snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
	return p[k];
}

static const struct sluice_ckpt_tensor *find(struct sluice_ckpt *ck, const char *name)
{
	for (size_t i = 0; i < sluice_ckpt_count(ck); i++)
		if (!strcmp(sluice_ckpt_tensor(ck, i)->name, name))
			return sluice_ckpt_tensor(ck, i);
	return NULL;
}

/* Loads ck into host memory; returns the buffer (caller frees) or NULL on error (rc set). */
static char *load(struct sluice_ckpt *ck, int *rc)
{
	size_t n = sluice_ckpt_load_size(ck) + 1;
	char *buf = malloc(n);

	memset(buf, 0xEE, n);
	*rc = sluice_ckpt_load(ck, buf, n, NULL);
	if (*rc) {
		free(buf);
		return NULL;
	}
	return buf;
}

static void one_file(struct sluice_engine *eng)
{
	/* u8 "a" of 3 bytes, then f32 "b" of 4 elements at data offset 3: b cannot land where it lies. */
	unsigned char data[3 + 16 + 8];
	struct sluice_ckpt *ck;
	const struct sluice_ckpt_tensor *a, *b, *c;
	char *buf;
	int rc;

	t_fill(data, sizeof(data), 7);
	st_write(at("one.safetensors"),
		 "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[3,19]},"
		 "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
		 "\"c\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[19,27]}}",
		 data, sizeof(data));
	T_CHECK(sluice_ckpt_open(&ck, eng, at("one.safetensors")) == 0);
	if (!ck)
		return;
	T_CHECK(!strcmp(sluice_ckpt_format(ck), "safetensors"));
	T_CHECK(sluice_ckpt_count(ck) == 3 && sluice_ckpt_files(ck) == 1 && sluice_ckpt_bytes(ck) == sizeof(data));
	a = find(ck, "a"), b = find(ck, "b"), c = find(ck, "c");
	T_CHECK(a && b && c);
	if (!a || !b || !c)
		return;
	T_CHECK(b->ndim == 2 && b->shape[0] == 2 && b->shape[1] == 2 && !strcmp(b->dtype, "F32") &&
		!strcmp(b->torch_dtype, "float32") && b->bytes == 16 && b->chunk == NULL);
	T_CHECK(b->at % 4 == 0 && c->at % 2 == 0);
	/* c follows b in the file and stays aligned: the same run. */
	T_CHECK(c->at == b->at + 16);
	buf = load(ck, &rc);
	T_CHECK(rc == 0);
	if (buf) {
		T_CHECK(!memcmp(buf + a->at, data, 3) && !memcmp(buf + b->at, data + 3, 16) &&
			!memcmp(buf + c->at, data + 19, 8));
		free(buf);
	}
	/* A buffer too small is refused before any read. */
	T_CHECK(sluice_ckpt_load(ck, &rc, 1, NULL) == -EINVAL);
	sluice_ckpt_close(ck);
}

/* The file replaced after the open loads its old bytes; cut short after the open, the load fails. */
static void changed(struct sluice_engine *eng)
{
	unsigned char d1[64], d2[64];
	const char *json = "{\"w\":{\"dtype\":\"I64\",\"shape\":[8],\"data_offsets\":[0,64]}}";
	struct sluice_ckpt *ck;
	char *buf;
	int rc;

	t_fill(d1, sizeof(d1), 1);
	t_fill(d2, sizeof(d2), 2);
	st_write(at("swap.safetensors"), json, d1, sizeof(d1));
	T_CHECK(sluice_ckpt_open(&ck, eng, at("swap.safetensors")) == 0);
	st_write(at("swap.new"), json, d2, sizeof(d2));
	T_CHECK(rename(at("swap.new"), at("swap.safetensors")) == 0);
	buf = ck ? load(ck, &rc) : NULL;
	T_CHECK(buf && !memcmp(buf + find(ck, "w")->at, d1, 64));
	free(buf);
	sluice_ckpt_close(ck);

	/* Rewritten in place (the same inode), the same size: the header no longer says where the bytes are. */
	T_CHECK(sluice_ckpt_open(&ck, eng, at("swap.safetensors")) == 0);
	usleep(20000);
	{
		FILE *f = fopen(at("swap.safetensors"), "r+b");

		T_CHECK(f && fseek(f, -8, SEEK_END) == 0 && fwrite("XXXXXXXX", 1, 8, f) == 8);
		if (f)
			fclose(f);
	}
	buf = ck ? load(ck, &rc) : NULL;
	T_CHECK(buf == NULL && rc == -ESTALE);
	free(buf);
	sluice_ckpt_close(ck);

	T_CHECK(sluice_ckpt_open(&ck, eng, at("swap.safetensors")) == 0);
	T_CHECK(truncate(at("swap.safetensors"), 40) == 0);
	buf = ck ? load(ck, &rc) : NULL;
	T_CHECK(buf == NULL && rc != 0);
	free(buf);
	sluice_ckpt_close(ck);
}

static void sharded(struct sluice_engine *eng)
{
	unsigned char d[3][32];
	char sub[1024];
	struct sluice_ckpt *ck;
	char *buf;
	int rc;

	snprintf(sub, sizeof(sub), "%s/sharded", dir);
	mkdir(sub, 0755);
	for (int i = 0; i < 3; i++) {
		char name[64], json[256];

		t_fill(d[i], 32, 10 + (uint64_t)i);
		snprintf(name, sizeof(name), "sharded/model-%05d-of-00003.safetensors", i + 1);
		snprintf(json, sizeof(json), "{\"t%d\":{\"dtype\":\"F16\",\"shape\":[16],\"data_offsets\":[0,32]}}", i);
		st_write(at(name), json, d[i], 32);
	}
	/* Without an index: all three shards. */
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == 0);
	T_CHECK(ck && sluice_ckpt_count(ck) == 3 && sluice_ckpt_files(ck) == 3);
	buf = ck ? load(ck, &rc) : NULL;
	for (int i = 0; buf && i < 3; i++) {
		char name[8];

		snprintf(name, sizeof(name), "t%d", i);
		T_CHECK(!memcmp(buf + find(ck, name)->at, d[i], 32));
	}
	free(buf);
	sluice_ckpt_close(ck);
	/* A shard gone: an unfinished save, not a checkpoint. */
	T_CHECK(rename(at("sharded/model-00002-of-00003.safetensors"), at("sharded/gone")) == 0);
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT && ck == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), "unfinished save") != NULL);
	T_CHECK(rename(at("sharded/gone"), at("sharded/model-00002-of-00003.safetensors")) == 0);
	/* Shard 2 twice under another save's name, and shard 3 gone: counted, not a checkpoint. */
	T_CHECK(rename(at("sharded/model-00003-of-00003.safetensors"), at("sharded/gone")) == 0);
	st_write(at("sharded/other-00002-of-00003.safetensors"),
		 "{\"t1\":{\"dtype\":\"F16\",\"shape\":[16],\"data_offsets\":[0,32]}}", d[1], 32);
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT && ck == NULL);
	T_CHECK(unlink(at("sharded/other-00002-of-00003.safetensors")) == 0);
	T_CHECK(rename(at("sharded/gone"), at("sharded/model-00003-of-00003.safetensors")) == 0);
	/* With an index: exactly what it names, from the file it names. */
	put(at("sharded/model.safetensors.index.json"),
	    "{\"metadata\":{},\"weight_map\":{\"t0\":\"model-00001-of-00003.safetensors\","
	    "\"t2\":\"model-00003-of-00003.safetensors\"}}");
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == 0);
	T_CHECK(ck && sluice_ckpt_count(ck) == 2 && sluice_ckpt_files(ck) == 2 && find(ck, "t1") == NULL);
	buf = ck ? load(ck, &rc) : NULL;
	T_CHECK(buf && !memcmp(buf + find(ck, "t2")->at, d[2], 32));
	free(buf);
	sluice_ckpt_close(ck);
	/* An index naming a tensor its file lacks, or a file outside its directory. */
	put(at("sharded/model.safetensors.index.json"),
	    "{\"weight_map\":{\"t0\":\"model-00002-of-00003.safetensors\"}}");
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "'t0'") != NULL);
	put(at("sharded/model.safetensors.index.json"), "{\"weight_map\":{\"t0\":\"../one.safetensors\"}}");
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
	put(at("sharded/model.safetensors.index.json"), "{\"weight_map\":{\"t0\":\"a\",\"t0\":\"b\"}}");
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
	put(at("sharded/model.safetensors.index.fp16.json"), "{}");
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "indexes") != NULL);
}

/* A name in two files of a directory; two variants in one directory: which to load is not the reader's guess. */
static void ambiguous(struct sluice_engine *eng)
{
	unsigned char d[2][32];
	struct sluice_ckpt *ck;
	char one[1024];

	t_fill(d, sizeof(d), 3);
	snprintf(one, sizeof(one), "%s/dup", dir);
	mkdir(one, 0755);
	st_write(at("dup/a.safetensors"), "{\"w\":{\"dtype\":\"F16\",\"shape\":[16],\"data_offsets\":[0,32]}}",
		 d[0], 32);
	st_write(at("dup/b.safetensors"), "{\"w\":{\"dtype\":\"F16\",\"shape\":[16],\"data_offsets\":[0,32]}}",
		 d[1], 32);
	T_CHECK(sluice_ckpt_open(&ck, eng, one) == SLUICE_EFORMAT && ck == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), "twice") != NULL);
	T_CHECK(rename(at("dup/a.safetensors"), at("dup/model.safetensors")) == 0);
	T_CHECK(rename(at("dup/b.safetensors"), at("dup/model.fp16.safetensors")) == 0);
	T_CHECK(sluice_ckpt_open(&ck, eng, one) == SLUICE_EFORMAT && ck == NULL);
	T_CHECK(strstr(sluice_last_error_detail(), "variants") != NULL);
}

#define DCP_MAGIC "cthis is a checkpoint of sluice (a test's notice)\nStorageReader\n"
/* What the writer says of every tensor beside its dtype, size and chunks. */
#define DCP_PROPS "\"requires_grad\":false,\"layout\":\"strided\",\"memory_format\":\"contiguous_format\",\"pin_memory\":false,"

static void dcp(struct sluice_engine *eng)
{
	unsigned char d[64];
	char sub[1024], meta[2048], good[2048];
	const char *rank = "__0_0123456789ab.safetensors";
	struct sluice_ckpt *ck;
	const struct sluice_ckpt_tensor *t;
	char *buf;
	int rc, ds;

	snprintf(sub, sizeof(sub), "%s/dcp", dir);
	mkdir(sub, 0755);
	t_fill(d, sizeof(d), 5);
	ds = st_write(at("dcp/__0_0123456789ab.safetensors"),
		 "{\"w@2,0\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},"
		 "\"b@0\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[32,48]},"
		 "\"c@0\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[48,64]}}", d, sizeof(d));
	snprintf(meta, sizeof(meta),
		 DCP_MAGIC "{\"format\":\"sluice-dcp\",\"version\":1,\"bytes\":[\"step\"],"
		 "\"tensors\":{\"w\":{\"dtype\":\"float32\",\"size\":[4,4]," DCP_PROPS "\"chunks\":[{\"offsets\":[2,0],\"sizes\":[2,4]}]},"
		 "\"b\":{\"dtype\":\"float32\",\"size\":[4]," DCP_PROPS "\"chunks\":[{\"offsets\":[0],\"sizes\":[4]}]},"
		 "\"c\":{\"dtype\":\"float32\",\"size\":[4]," DCP_PROPS "\"chunks\":[{\"offsets\":[0],\"sizes\":[4]}]}},"
		 "\"items\":[{\"fqn\":\"w\",\"offset\":[2,0],\"index\":0,\"file\":\"%s\",\"name\":\"w@2,0\",\"at\":%d,\"length\":32},"
		 "{\"fqn\":\"b\",\"offset\":[0],\"index\":0,\"file\":\"%s\",\"name\":\"b@0\",\"at\":%d,\"length\":16},"
		 "{\"fqn\":\"c\",\"offset\":[0],\"index\":0,\"file\":\"%s\",\"name\":\"c@0\",\"at\":%d,\"length\":16},"
		 "{\"fqn\":\"step\",\"offset\":null,\"index\":null,\"file\":\"%s\",\"name\":\"step\",\"at\":0,\"length\":0}]}",
		 rank, ds, rank, ds + 32, rank, ds + 48, rank);
	put(at("dcp/.metadata"), meta);
	snprintf(good, sizeof(good), "%s", meta);
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == 0);
	if (!ck)
		return;
	T_CHECK(!strcmp(sluice_ckpt_format(ck), "sluice-dcp") && sluice_ckpt_count(ck) == 3);
	t = find(ck, "w");
	T_CHECK(t && t->chunk && t->chunk[0] == 2 && t->chunk[1] == 0 && t->shape[0] == 2);
	buf = load(ck, &rc);
	T_CHECK(buf && !memcmp(buf + t->at, d, 32) && !memcmp(buf + find(ck, "b")->at, d + 32, 16) &&
		!memcmp(buf + find(ck, "c")->at, d + 48, 16));
	free(buf);
	sluice_ckpt_close(ck);
	/* Damaged: an item that is not the tensor it names (its bytes are b's), and a pickle. */
	{
		char *w = strstr(meta, "\"name\":\"w@2,0\",\"at\":");

		snprintf(w, sizeof(meta) - (size_t)(w - meta), "\"name\":\"w@2,0\",\"at\":%d,\"length\":32}]}", ds + 32);
	}
	put(at("dcp/.metadata"), meta);
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
	T_CHECK(strstr(sluice_last_error_detail(), "damaged metadata") != NULL);
	/*
	 * Tensors b and c (one shape, one dtype) swapped in the metadata, each item then stored under the other's
	 * name and place, and an item in a file of another save: refused, never the other's bytes.
	 */
	{
		char bad[2048], *b, *c;

		snprintf(bad, sizeof(bad), "%s", good);
		b = strstr(bad, "{\"fqn\":\"b\"");
		c = strstr(bad, "{\"fqn\":\"c\"");
		b[8] = 'c';
		c[8] = 'b';
		put(at("dcp/.metadata"), bad);
		T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
		T_CHECK(strstr(sluice_last_error_detail(), "item 'c@0' is stored as 'b@0'") != NULL);
		c = strrchr(good, '_');
		snprintf(bad, sizeof(bad), "%.*s_fedcba987654%s", (int)(c - good), good, c + 13);
		put(at("dcp/.metadata"), bad);
		T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
		T_CHECK(strstr(sluice_last_error_detail(), "files of 2 saves") != NULL);
	}
	/* A chunk outside its tensor's size; a chunk no item stores (half of w unread). */
	{
		char bad[2048];
		const char *k = strstr(good, "\"size\":[4,4]"), *c = strstr(good, "\"sizes\":[2,4]}]");

		snprintf(bad, sizeof(bad), "%.*s\"size\":[3,4]%s", (int)(k - good), good, k + strlen("\"size\":[4,4]"));
		put(at("dcp/.metadata"), bad);
		T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
		snprintf(bad, sizeof(bad), "%.*s\"sizes\":[2,4]},{\"offsets\":[0,0],\"sizes\":[2,4]}]%s",
			 (int)(c - good), good, c + strlen("\"sizes\":[2,4]}]"));
		put(at("dcp/.metadata"), bad);
		T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
		T_CHECK(strstr(sluice_last_error_detail(), "no item stores 'w'") != NULL);
	}
	put(at("dcp/.metadata"), "\x80\x04\x95 a pickle");
	T_CHECK(sluice_ckpt_open(&ck, eng, sub) == SLUICE_EFORMAT);
}

static void hostile(struct sluice_engine *eng)
{
	static const struct {
		const char *json;
		size_t data;
	} bad[] = {
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9 },  /* trailing byte */
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12 }, /* a gap */
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8 },  /* overlap */
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4 },   /* past the end */
		{ "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8 },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8 },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8 },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8 },
		{ "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2 },   /* half a byte */
		{ "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8 },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8 }, /* a name twice */
		{ "{\"__metadata__\":{\"k\":1}}", 0 },
		{ "[1,2]", 0 },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8 },
		{ "{\"a\":", 8 },
	};
	unsigned char data[16] = { 0 };
	struct sluice_ckpt *ck;
	FILE *f;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		st_write(at("bad.safetensors"), bad[i].json, data, bad[i].data);
		T_CHECK(sluice_ckpt_open(&ck, eng, at("bad.safetensors")) == SLUICE_EFORMAT && ck == NULL);
		T_CHECK(strstr(sluice_last_error_detail(), "bad.safetensors") != NULL);
		if (ck)
			fprintf(stderr, "accepted: %s\n", bad[i].json);
	}
	/* A header length past the file, and a file of 3 bytes. */
	f = fopen(at("bad.safetensors"), "wb");
	fwrite("\xff\xff\xff\x00\x00\x00\x00\x00{}", 1, 10, f);
	fclose(f);
	T_CHECK(sluice_ckpt_open(&ck, eng, at("bad.safetensors")) == SLUICE_EFORMAT);
	put(at("bad.safetensors"), "abc");
	T_CHECK(sluice_ckpt_open(&ck, eng, at("bad.safetensors")) == SLUICE_EFORMAT);
	T_CHECK(sluice_ckpt_open(&ck, eng, at("absent.safetensors")) == -ENOENT);
}

/* sluice_st_header_read: the header's JSON and where the data starts, or the same refusal as sluice_ckpt_open. */
static void st_header(struct sluice_engine *eng)
{
	const char *json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	struct sluice_st_header *sh = (struct sluice_st_header *)1;
	struct sluice_file *f = NULL;
	const char *p = at("sth.safetensors");
	int start = st_write(p, json, "xyz", 3);
	size_t n = 0;

	T_CHECK(sluice_file_open(&f, eng, p, 0) == 0);
	T_CHECK(sluice_st_header_read(&sh, f, p) == 0 && sh);
	if (sh) {
		const char *j = sluice_st_header_json(sh, &n);

		T_CHECK(n == (size_t)start - 8 && !strncmp(j, json, strlen(json)) &&
			sluice_st_header_data_start(sh) == (uint64_t)start);
	}
	sluice_st_header_free(sh);
	sluice_file_close(f);
	/* A name twice in one header: jansson's duplicate check, as for every file sluice_ckpt_open reads. */
	st_write(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1);
	T_CHECK(sluice_file_open(&f, eng, p, 0) == 0);
	sh = (struct sluice_st_header *)1;
	T_CHECK(sluice_st_header_read(&sh, f, p) == SLUICE_EFORMAT && !sh &&
		strstr(sluice_last_error_detail(), "duplicate") && strstr(sluice_last_error_detail(), "sth.safetensors"));
	sluice_file_close(f);
	T_CHECK(sluice_st_header_read(&sh, NULL, p) == SLUICE_EINVAL_CONFIG && !sh);
	sluice_st_header_free(NULL);
}

/* sluice_ckpt_open_files: a caller's list of files, an index's bytes as the caller read them; the handles the
 * headers were read through; a name the index places in one file and another file holds too. */
static void open_files(struct sluice_engine *eng)
{
	unsigned char d[20][16];
	const char *files[20];
	char names[20][1024], raw[512];
	struct sluice_ckpt *ck = NULL;
	char *buf;
	int rc;

	mkdir(at("many"), 0755);
	for (int i = 0; i < 20; i++) {
		char json[128];

		t_fill(d[i], 16, 40 + (uint64_t)i);
		snprintf(names[i], sizeof(names[i]), "%s/many/f%02d.safetensors", dir, i);
		snprintf(json, sizeof(json), "{\"w%d\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}", i);
		st_write(names[i], json, d[i], 16);
		files[i] = names[i];
	}
	/* Twenty files, more than the threads that open them: each in its place, its bytes the file's. */
	T_CHECK(sluice_ckpt_open_files(&ck, eng, files, 20, NULL, NULL, 0) == 0 && ck);
	T_CHECK(ck && sluice_ckpt_files(ck) == 20 && sluice_ckpt_count(ck) == 20);
	for (unsigned i = 0; ck && i < 20; i++)
		T_CHECK(!strcmp(sluice_ckpt_file(ck, i), names[i]) && sluice_ckpt_handle(ck, i) != NULL);
	T_CHECK(ck && sluice_ckpt_handle(ck, 20) == NULL && sluice_ckpt_check(ck) == 0);
	buf = ck ? load(ck, &rc) : NULL;
	for (int i = 0; buf && i < 20; i++) {
		char name[8];

		snprintf(name, sizeof(name), "w%d", i);
		T_CHECK(find(ck, name) && find(ck, name)->file == (unsigned)i && !memcmp(buf + find(ck, name)->at, d[i], 16));
	}
	free(buf);
	sluice_ckpt_close(ck);
	/* One of them is not a safetensors file: named, whichever thread read it. */
	put(names[13], "not a checkpoint");
	T_CHECK(sluice_ckpt_open_files(&ck, eng, files, 20, NULL, NULL, 0) == SLUICE_EFORMAT && !ck);
	T_CHECK(strstr(sluice_last_error_detail(), "f13.safetensors") != NULL);
	/* A name in two of the files given. */
	st_write(names[13], "{\"w3\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}", d[13], 16);
	T_CHECK(sluice_ckpt_open_files(&ck, eng, files, 20, NULL, NULL, 0) == SLUICE_EFORMAT && !ck);
	T_CHECK(strstr(sluice_last_error_detail(), "'w3'") && strstr(sluice_last_error_detail(), "f03.safetensors") &&
		strstr(sluice_last_error_detail(), "f13.safetensors"));
	/* An index's bytes (the file on disk says something else: the bytes given are what counts). */
	put(at("many/model.safetensors.index.json"), "{}");
	snprintf(raw, sizeof(raw), "{\"weight_map\":{\"w1\":\"f01.safetensors\",\"w2\":\"f02.safetensors\"}}");
	T_CHECK(sluice_ckpt_open_files(&ck, eng, NULL, 0, at("many/model.safetensors.index.json"), raw, strlen(raw)) == 0);
	T_CHECK(ck && sluice_ckpt_files(ck) == 2 && sluice_ckpt_count(ck) == 2 && find(ck, "w2") &&
		find(ck, "w2")->file == 1);
	sluice_ckpt_close(ck);
	/* w3 placed in f13, which holds one, while f03 holds one too: which copy is meant? */
	snprintf(raw, sizeof(raw), "{\"weight_map\":{\"w3\":\"f13.safetensors\",\"w4\":\"f03.safetensors\"}}");
	st_write(names[3], "{\"w3\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
			   "\"w4\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]}}", d[3], 16);
	T_CHECK(sluice_ckpt_open_files(&ck, eng, NULL, 0, at("many/model.safetensors.index.json"), raw, strlen(raw)) ==
		SLUICE_EFORMAT && !ck);
	T_CHECK(strstr(sluice_last_error_detail(), "which copy is meant") && strstr(sluice_last_error_detail(), "'w3'"));
	/* Not JSON; no files and no index; an index with files too. */
	T_CHECK(sluice_ckpt_open_files(&ck, eng, NULL, 0, at("many/model.safetensors.index.json"), "{", 1) ==
			SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "not JSON"));
	T_CHECK(sluice_ckpt_open_files(&ck, eng, NULL, 0, NULL, NULL, 0) == -EINVAL && !ck);
	T_CHECK(sluice_ckpt_open_files(&ck, eng, files, 1, "x.json", "{}", 2) == -EINVAL && !ck);
	T_CHECK(sluice_ckpt_open_files(&ck, eng, files, 0, NULL, NULL, 0) == -ENOENT && !ck);
}

/* sluice_st_index_files: the files an index names, checked as an open checks them, none opened. */
static void index_files(void)
{
	const char *ok = "{\"metadata\":null,\"weight_map\":{\"b\":\"s2.safetensors\",\"a\":\"s1.safetensors\","
			 "\"c\":\"s2.safetensors\"}}";
	const char *bad[] = { "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}", "{\"weight_map\":{\"a\":\"d/s1\"}}",
			      "{\"weight_map\":{\"a\":\"%2e%2e\"}}", "{\"weight_map\":{}}", "{\"weight_map\":[]}", "[" };
	char **files = NULL;
	unsigned n = 9;

	T_CHECK(sluice_st_index_files("gone/model.safetensors.index.json", ok, strlen(ok), &files, &n) == 0);
	T_CHECK(n == 2 && files && !strcmp(files[0], "s1.safetensors") && !strcmp(files[1], "s2.safetensors"));
	sluice_list_free(files, n);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		files = (char **)bad;
		n = 9;
		T_CHECK(sluice_st_index_files("ix.json", bad[i], strlen(bad[i]), &files, &n) == SLUICE_EFORMAT &&
			!files && n == 0 && strstr(sluice_last_error_detail(), "ix.json"));
	}
	T_CHECK(sluice_st_index_files(NULL, ok, strlen(ok), &files, &n) == -EINVAL && !files && n == 0);
	T_CHECK(sluice_st_index_files("ix.json", ok, strlen(ok), NULL, &n) == -EINVAL);
}

int main(void)
{
	struct sluice_engine *eng = t_engine();

	dir = t_dir("ckpt");
	one_file(eng);
	changed(eng);
	sharded(eng);
	ambiguous(eng);
	dcp(eng);
	hostile(eng);
	st_header(eng);
	open_files(eng);
	index_files();
	sluice_engine_close(eng);
	return t_done("t_ckpt");
}
