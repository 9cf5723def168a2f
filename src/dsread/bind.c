/*
 * A dataset's files bound to an engine once, not opened and closed by
 * every batch: each engine keeps (sl__eng_attach) the engine's handles of
 * the data files that datasets read through it, by the dataset's id and
 * the shard, at most SL_BOUND of them (the least recently used one that no
 * call holds goes first), closed when the engine closes.  A call holds the
 * handles it uses (refs) until it ends, so one is never closed under a
 * read.  A dataset's id is never reused, and a closing dataset's handles
 * no call holds are closed in every engine's binder then (sl_forget), so
 * its files are not kept open, nor the space of deleted ones.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "dsread/dsread.h"

enum { SL_BOUND = 256 };

struct sl_bound {
	uint64_t ds;         /* the dataset's id; 0: a free slot */
	unsigned shard;
	struct sluice_file *f;
	unsigned refs;       /* calls holding it */
	uint64_t used;       /* the binder's clock at its last use */
};

struct sl_binder {
	pthread_mutex_t lock;
	uint64_t clock, opens;
	struct sl_bound e[SL_BOUND];
	/*
	 * Every engine's binder is on one list, under sl_binders_lock, taken
	 * before a binder's lock (which is taken before the engine's, when a
	 * file closes): listed by sl_binder, never under the engine's lock.
	 */
	struct sl_binder *next;
	_Atomic int listed;
};

static pthread_mutex_t sl_binders_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sl_binder *sl_binders;

/* sluice_dataset_close(): the handles of dataset id no call holds, closed in every engine. */
static void sl_forget(uint64_t id)
{
	pthread_mutex_lock(&sl_binders_lock);
	for (struct sl_binder *b = sl_binders; b; b = b->next) {
		pthread_mutex_lock(&b->lock);
		for (unsigned i = 0; i < SL_BOUND; i++)
			if (b->e[i].ds == id && b->e[i].f && !b->e[i].refs) {
				sluice_file_close(b->e[i].f);
				b->e[i] = (struct sl_bound){ 0 };
			}
		pthread_mutex_unlock(&b->lock);
	}
	pthread_mutex_unlock(&sl_binders_lock);
}

static void *sl_binder_make(struct sluice_engine *eng, int *err)
{
	struct sl_binder *b = calloc(1, sizeof(*b));

	(void)eng;
	if (!b) {
		*err = -ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&b->lock, NULL);
	return b;
}

static void sl_binder_drop(struct sluice_engine *eng, void *state)
{
	struct sl_binder *b = state;

	(void)eng;
	pthread_mutex_lock(&sl_binders_lock);
	for (struct sl_binder **p = &sl_binders; *p; p = &(*p)->next)
		if (*p == b) {
			*p = b->next;
			break;
		}
	pthread_mutex_unlock(&sl_binders_lock);
	for (unsigned i = 0; i < SL_BOUND; i++)
		sluice_file_close(b->e[i].f);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

/* eng's binder, made on first use (under the engine's lock) and then listed (not under it). */
static struct sl_binder *sl_binder(struct sluice_engine *eng, int *rc)
{
	struct sl_binder *b = sl__eng_attach(eng, SL_ATTACH_DSFILES, sl_binder_make, sl_binder_drop, rc);

	if (b && !atomic_load(&b->listed)) {
		pthread_mutex_lock(&sl_binders_lock);
		if (!atomic_load(&b->listed)) {
			b->next = sl_binders;
			sl_binders = b;
			atomic_store(&b->listed, 1);
		}
		pthread_mutex_unlock(&sl_binders_lock);
		sl__ds_on_close(sl_forget);
	}
	return b;
}

/* The slot of (ds, shard), or else a free one, or else the least recently used one no call holds; NULL: all held. */
static struct sl_bound *sl_slot(struct sl_binder *b, uint64_t ds, unsigned shard)
{
	struct sl_bound *free_one = NULL, *old = NULL;

	for (unsigned i = 0; i < SL_BOUND; i++) {
		struct sl_bound *e = &b->e[i];

		if (e->ds == ds && e->shard == shard && e->f)
			return e;
		if (!e->f)
			free_one = free_one ? free_one : e;
		else if (!e->refs && (!old || e->used < old->used))
			old = e;
	}
	return free_one ? free_one : old;
}

int sl__bind_file(struct sluice_engine *eng, struct sluice_dataset *ds, unsigned shard, struct sluice_file **out)
{
	int rc = 0;
	struct sl_binder *b = sl_binder(eng, &rc);
	struct sl_bound *e;
	char path[4096];

	*out = NULL;
	if (!b)
		return rc;
	pthread_mutex_lock(&b->lock);
	e = sl_slot(b, ds->id, shard);
	if (e && e->f && e->ds == ds->id && e->shard == shard) {
		e->refs++;
		e->used = ++b->clock;
		*out = e->f;
		pthread_mutex_unlock(&b->lock);
		return 0;
	}
	pthread_mutex_unlock(&b->lock);
	/*
	 * Opened outside the lock (a remote shard's copy may be downloaded
	 * first), then placed.  A copy the cache lets go between sl__ds_path's
	 * look and the open (a fetch of another process made room) is fetched
	 * again, a few times; a local file's absence is the error at once.
	 */
	for (int tries = 0;; tries++) {
		if ((rc = sl__ds_path(ds, shard, path, sizeof(path))))
			return rc;
		rc = sluice_file_open(out, eng, path, SLUICE_RDONLY);
		if (rc != -ENOENT || tries == 3 || sl__fs_is_local(ds->files[shard]))
			break;
	}
	if (rc)
		return rc;
	pthread_mutex_lock(&b->lock);
	b->opens++;
	e = sl_slot(b, ds->id, shard);
	if (e && e->f && e->ds == ds->id && e->shard == shard) {
		/* Another call bound it meanwhile: theirs is the one. */
		sluice_file_close(*out);
		*out = e->f;
	} else if (e) {
		sluice_file_close(e->f);
		*e = (struct sl_bound){ ds->id, shard, *out, 0, 0 };
	} else {
		/* Every slot is held by a call: this one's handle is its own, closed at release. */
		pthread_mutex_unlock(&b->lock);
		return 0;
	}
	e->refs++;
	e->used = ++b->clock;
	pthread_mutex_unlock(&b->lock);
	return 0;
}

void sl__bind_release(struct sluice_engine *eng, struct sluice_file *f)
{
	int rc = 0;
	struct sl_binder *b = f ? sl_binder(eng, &rc) : NULL;
	unsigned i = 0;

	if (!b)
		return;
	pthread_mutex_lock(&b->lock);
	while (i < SL_BOUND && b->e[i].f != f)
		i++;
	if (i < SL_BOUND)
		b->e[i].refs--;
	pthread_mutex_unlock(&b->lock);
	if (i == SL_BOUND)
		sluice_file_close(f); /* one of its own (every slot was held) */
}

uint64_t sl__bind_opens(struct sluice_engine *eng)
{
	int rc = 0;
	struct sl_binder *b = sl_binder(eng, &rc);
	uint64_t n = 0;

	if (b) {
		pthread_mutex_lock(&b->lock);
		n = b->opens;
		pthread_mutex_unlock(&b->lock);
	}
	return n;
}
