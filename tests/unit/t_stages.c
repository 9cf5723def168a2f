/*
 * The loader's table of stages (state.h's struct sl__stage_ops) with stages
 * of the test's own: a field stage on each of two fields, each with a state
 * of its own, run in the table's order; what a stage makes is what the batch
 * holds, the fields no stage makes are collated as stored; a record a stage
 * refuses fails its batch (naming it) or, under skip_corrupt, is left out of
 * every field; and tables that cannot be set up are refused, naming the
 * stage and field, with every stage set up before closed once.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "format/format.h"
#include "loader/state.h"
#include "t_util.h"

static const struct sluice_field fields[] = {
	{ "x", SLUICE_DTYPE_I64, 0, { 0 } },
	{ "v", SLUICE_DTYPE_BYTES, 0, { 0 } },
	{ "w", SLUICE_DTYPE_I64, 0, { 0 } },
};

static size_t v_len(uint64_t i)
{
	return 1 + (size_t)(i * 37) % 300;
}

static struct sluice_dataset *write_dataset(const char *path, uint64_t n)
{
	struct sluice_writer *w;
	struct sluice_dataset *ds = NULL;
	struct sluice_writer_options wo = { .size = sizeof(wo), .shard_size = 32 << 10 };
	char v[400];

	T_CHECK(sluice_writer_open(&w, path, fields, 3, &wo) == 0);
	for (uint64_t i = 0; i < n; i++) {
		int64_t x = (int64_t)i, y = -(int64_t)i;
		size_t l[3] = { 8, v_len(i), 8 };
		const void *vals[3] = { &x, v, &y };

		for (size_t k = 0; k < v_len(i); k++)
			v[k] = (char)(i + k);
		T_CHECK(sluice_writer_add(w, vals, l) == 0);
	}
	T_CHECK(sluice_writer_close(w) == 0);
	T_CHECK(sluice_dataset_open(&ds, path) == 0);
	return ds;
}

/* A stage's state: which field it makes, what it counts, and how often it was set up and closed. */
struct t_state {
	const char *field;
	uint64_t refuse_mod;        /* records with id % refuse_mod == 3 are refused (0: none) */
	_Atomic uint64_t records;
};
static struct t_state s_len = { .field = "v", .refuse_mod = 7 }, s_twice = { .field = "x" };
static int setups, closes, fail_setup;

static int t_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st,
		   struct t_state *ts)
{
	(void)opt;
	setups++;
	st->state = ts;
	for (unsigned f = 0; f < ld->nf; f++)
		if (!strcmp(ld->ds->fields[ld->fidx[f]].name, ts->field))
			st->field = (int)f;
	return 1;
}

static int t_len_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	return t_setup(ld, opt, st, &s_len);
}

static int t_twice_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	return t_setup(ld, opt, st, &s_twice);
}

static int t_none_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	(void)ld, (void)opt, (void)st;
	setups++;
	return 0; /* not needed: never closed */
}

static int t_fail_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	(void)ld, (void)opt, (void)st;
	fail_setup++;
	return sl__err(SLUICE_EINVAL_CONFIG, "t_stages: this stage does not set up");
}

static int t_nofield_setup(struct sluice_loader *ld, const struct sluice_loader_options *opt, struct sl__stage *st)
{
	(void)ld, (void)opt;
	setups++;
	st->state = &s_len;
	return 1; /* st->field stays -1 */
}

static void t_close(struct sl__stage *st)
{
	T_CHECK(st->state == &s_len || st->state == &s_twice);
	closes++;
}

static uint64_t t_bound(const struct sl__stage *st, uint64_t m)
{
	(void)st;
	return 16 * m;
}

static int t_on_gpu(const struct sl__stage *st, unsigned p)
{
	(void)st, (void)p;
	return 0;
}

/* Per record two int64: the field's length and the sum of its bytes (x: its value and twice it). */
static int t_run(struct sl__stage *st, struct sl__producer *p, struct sl__batch_buf *s, struct sluice_record *rec,
		 uint32_t *m, uint64_t at)
{
	struct t_state *ts = st->state;
	struct sluice_loader *ld = st->ld;
	const unsigned fi = ld->fidx[st->field];
	int64_t *out = (int64_t *)(void *)(s->host + at);
	uint32_t k = 0, nbad = 0;
	uint64_t bad_id = 0;

	(void)p;
	for (uint32_t j = 0; j < *m; j++) {
		const unsigned char *d = rec[j].data[fi];
		int64_t sum = 0, x;

		if (ts->refuse_mod && s->ids[j] % ts->refuse_mod == 3) {
			bad_id = nbad++ ? bad_id : s->ids[j];
			continue;
		}
		if (ts == &s_len) {
			for (uint32_t b = 0; b < rec[j].len[fi]; b++)
				sum += d[b];
			out[2 * k] = rec[j].len[fi];
			out[2 * k + 1] = sum;
		} else {
			memcpy(&x, d, 8);
			out[2 * k] = x;
			out[2 * k + 1] = 2 * x;
		}
		rec[k] = rec[j];
		s->ids[k++] = s->ids[j];
	}
	if (nbad && !st->skip_bad)
		return sl__err(SLUICE_EFORMAT, "%s: record %llu: refused by stage %s", ld->ds->path,
			       (unsigned long long)bad_id, st->ops->name);
	atomic_fetch_add(&ld->skipped, nbad);
	atomic_fetch_add(&ts->records, k);
	*m = k;
	return 0;
}

static void t_describe(const struct sl__stage *st, uint64_t m, struct sluice_batch_field *bf)
{
	(void)st;
	bf->dtype = SLUICE_DTYPE_I64;
	bf->offsets = NULL;
	bf->host_offsets = NULL;
	bf->item_bytes = 16;
	bf->ndim = 2;
	bf->shape[0] = (int64_t)m;
	bf->shape[1] = 2;
	bf->strides[0] = 2;
	bf->strides[1] = 1;
}

#define T_FIELD_STAGE(nm, setup_fn)                                                                          \
	{ .name = nm, .setup = setup_fn, .close = t_close, .bound = t_bound, .on_gpu = t_on_gpu, .run = t_run, \
	  .describe = t_describe }

static const struct sl__stage_ops two[] = { T_FIELD_STAGE("len", t_len_setup), T_FIELD_STAGE("none", t_none_setup),
					    T_FIELD_STAGE("twice", t_twice_setup) };

static struct sluice_loader_options options(int skip)
{
	return (struct sluice_loader_options){ .size = sizeof(struct sluice_loader_options), .batch_size = 16,
					       .seed = 3, .shuffle = 1, .skip_corrupt = skip, .window_bytes = 20 << 10 };
}

/* Every row of b is a kept record's, each field made of that record; returns how many rows. */
static uint64_t check_rows(const struct sluice_batch *b)
{
	const int64_t *x = b->field[0].data, *v = b->field[1].data, *w = b->field[2].data;

	for (uint32_t j = 0; j < b->size; j++) {
		uint64_t id = b->ids[j];

		T_CHECK(id % 7 != 3);
		T_CHECK(x[2 * j] == (int64_t)id && x[2 * j + 1] == 2 * (int64_t)id);
		T_CHECK(v[2 * j] == (int64_t)v_len(id));
		T_CHECK(w[j] == -(int64_t)id);
	}
	return b->size;
}

/* How many of records 0..n-1 the "len" stage refuses (every seventh, from 3). */
static uint64_t refused_of(uint64_t n)
{
	uint64_t k = 0;

	for (uint64_t i = 0; i < n; i++)
		k += i % 7 == 3;
	return k;
}

/* Both stages make their fields, w is collated as stored; refused records are gone from every field. */
static void test_stages_make_their_fields_and_skip_what_they_refuse(struct sluice_engine *eng,
								    struct sluice_dataset *ds, uint64_t n)
{
	struct sluice_loader_options o = options(1);
	struct sluice_loader *ld = NULL;
	struct sluice_batch b = SLUICE_BATCH_INIT;
	uint64_t seen = 0, skipped = 0;
	int rc;

	setups = closes = 0;
	T_CHECK(sl__loader_open_staged(&ld, eng, ds, &o, two, 3) == 0);
	T_CHECK(setups == 3 && ld->nstage == 2 && ld->fstage[0] && ld->fstage[1] && !ld->fstage[2] && !ld->wstage);
	T_CHECK(!strcmp(ld->fstage[1]->ops->name, "len") && !strcmp(ld->fstage[0]->ops->name, "twice"));
	while ((rc = sluice_loader_next(ld, &b, NULL)) == 1) {
		const int64_t *v = b.field[1].data;

		T_CHECK(b.nfields == 3 && b.field[0].item_bytes == 16 && b.field[1].item_bytes == 16 &&
			b.field[1].ndim == 2 && b.field[1].shape[0] == (int64_t)b.size && !b.field[1].offsets &&
			b.field[2].item_bytes == 8);
		seen += check_rows(&b);
		for (uint32_t j = 0; j < b.size; j++) {
			int64_t sum = 0;

			for (size_t k = 0; k < v_len(b.ids[j]); k++)
				sum += (unsigned char)(b.ids[j] + k);
			T_CHECK(v[2 * j + 1] == sum);
		}
	}
	T_CHECK(rc == 0);
	skipped = refused_of(n);
	T_CHECK(seen == n - skipped);
	T_CHECK(atomic_load(&ld->skipped) == skipped);
	/* "len" runs first (the table's order) and closes the refused records up before "twice" sees them. */
	T_CHECK(atomic_load(&s_len.records) == n - skipped && atomic_load(&s_twice.records) == n - skipped);
	sluice_loader_close(ld);
	T_CHECK(closes == 2);
}

/* Without skip_corrupt, the first batch with a refused record fails, naming it and the stage; none is skipped. */
static void test_a_refused_record_fails_its_batch(struct sluice_engine *eng, struct sluice_dataset *ds)
{
	struct sluice_loader_options o = options(0);
	struct sluice_loader *ld = NULL;
	struct sluice_batch b = SLUICE_BATCH_INIT;
	int rc;

	o.shuffle = 0;
	T_CHECK(sl__loader_open_staged(&ld, eng, ds, &o, two, 3) == 0);
	rc = sluice_loader_next(ld, &b, NULL); /* records 0-15: 3 and 10 refused, 3 named */
	T_CHECK(rc == SLUICE_EFORMAT && strstr(sluice_last_error_detail(), "record 3: refused by stage len"));
	T_CHECK(atomic_load(&ld->skipped) == 0);
	sluice_loader_close(ld);
}

/*
 * A stage that refuses records after another made its field: the earlier
 * field holds the kept records' rows alone, in their order (it once kept
 * the rows of the refused ones, every row after them another record's).
 */
static void test_a_later_refusal_closes_up_the_fields_made_before_it(struct sluice_engine *eng,
								    struct sluice_dataset *ds, uint64_t n)
{
	const struct sl__stage_ops later[] = { T_FIELD_STAGE("twice", t_twice_setup), T_FIELD_STAGE("len", t_len_setup) };
	struct sluice_loader_options o = options(1);
	struct sluice_loader *ld = NULL;
	struct sluice_batch b = SLUICE_BATCH_INIT;
	uint64_t seen = 0, skipped = 0;
	int rc;

	setups = closes = 0;
	T_CHECK(sl__loader_open_staged(&ld, eng, ds, &o, later, 2) == 0);
	while ((rc = sluice_loader_next(ld, &b, NULL)) == 1) {
		T_CHECK(b.field[0].shape[0] == (int64_t)b.size && b.field[1].shape[0] == (int64_t)b.size);
		seen += check_rows(&b);
	}
	T_CHECK(rc == 0);
	skipped = refused_of(n);
	T_CHECK(seen == n - skipped && atomic_load(&ld->skipped) == skipped);
	sluice_loader_close(ld);
	T_CHECK(setups == 2 && closes == 2);
}

/* Tables that cannot be set up: refused, naming what is wrong; every stage set up before it closed once. */
static void test_bad_tables_are_refused_and_closed(struct sluice_engine *eng, struct sluice_dataset *ds)
{
	const struct sl__stage_ops same[] = { T_FIELD_STAGE("len", t_len_setup), T_FIELD_STAGE("len2", t_len_setup) };
	const struct sl__stage_ops nofield[] = { T_FIELD_STAGE("twice", t_twice_setup),
						 T_FIELD_STAGE("lost", t_nofield_setup) };
	const struct sl__stage_ops failing[] = { T_FIELD_STAGE("len", t_len_setup), T_FIELD_STAGE("bad", t_fail_setup),
						 T_FIELD_STAGE("twice", t_twice_setup) };
	struct sluice_loader_options o = options(1);
	struct sluice_loader *ld = NULL;

	setups = closes = 0;
	T_CHECK(sl__loader_open_staged(&ld, eng, ds, &o, same, 2) == SLUICE_EINVAL_CONFIG && !ld);
	T_CHECK(strstr(sluice_last_error_detail(), "field 'v': stages len and len2 both make it"));
	T_CHECK(setups == 2 && closes == 2);

	setups = closes = 0;
	T_CHECK(sl__loader_open_staged(&ld, eng, ds, &o, nofield, 2) == SLUICE_EINVAL_CONFIG && !ld);
	T_CHECK(strstr(sluice_last_error_detail(), "stage lost names no loaded field"));
	T_CHECK(setups == 2 && closes == 2);

	setups = closes = fail_setup = 0;
	T_CHECK(sl__loader_open_staged(&ld, eng, ds, &o, failing, 3) == SLUICE_EINVAL_CONFIG && !ld);
	T_CHECK(strstr(sluice_last_error_detail(), "this stage does not set up"));
	T_CHECK(setups == 1 && fail_setup == 1 && closes == 1); /* "twice" never set up */
}

int main(void)
{
	const char *dir = t_dir("t_stages");
	const uint64_t n = 300;
	char path[4096];
	struct sluice_dataset *ds;
	struct sluice_engine *eng;

	snprintf(path, sizeof(path), "%s/ds", dir);
	ds = write_dataset(path, n);
	eng = t_engine();
	test_stages_make_their_fields_and_skip_what_they_refuse(eng, ds, n);
	test_a_refused_record_fails_its_batch(eng, ds);
	test_a_later_refusal_closes_up_the_fields_made_before_it(eng, ds, n);
	test_bad_tables_are_refused_and_closed(eng, ds);
	sluice_engine_close(eng);
	sluice_dataset_close(ds);
	return t_done("t_stages");
}
