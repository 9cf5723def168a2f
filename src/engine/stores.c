/*
 * The registry of stores (store/store.h): a new kind of storage is one
 * file of its own and one line here.  A store's id is its index.
 */
#include <errno.h>

#include "engine/pipeline.h"
#include "remote/remote.h"

const struct sl__store *const sl__stores[SL_STORES] = {
	&sl__store_uring,
	&sl__store_psync,
	&sl__store_gds,
	&sl__store_s3,
	&sl__store_http,
};

int sl__store_for(struct sluice_engine *eng, const char *path, const struct sl__store **out)
{
	for (int i = 0; i < SL_STORES; i++) {
		const struct sl__store *st = sl__stores[i];

		if (!st || !st->match || !st->match(path))
			continue;
		if (!(eng->stores & (1u << i)))
			return sl__err(SLUICE_EBACKEND, "%s: the %s store is unusable here (sluice doctor says why)", path,
				       st->name);
		*out = st;
		return 0;
	}
	*out = eng->gds ? eng->gds : eng->local;
	return 0;
}

static void sl_lock(void *eng)
{
	pthread_mutex_lock(&((struct sluice_engine *)eng)->lock);
}

static void sl_unlock(void *eng)
{
	pthread_mutex_unlock(&((struct sluice_engine *)eng)->lock);
}

void sl__open_env(struct sluice_engine *eng, const struct sl__store *st, void *arg, struct sl__open_env *env)
{
	env->cfg = &eng->cfg;
	env->shared = &eng->store_shared[st->id];
	env->lock = sl_lock;
	env->unlock = sl_unlock;
	env->lock_arg = eng;
	env->arg = arg;
}
