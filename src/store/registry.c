/*
 * The registry of stores (store.h): every store by id, the order a local
 * path's store is preferred in, and which store a path is.
 */
#include <stddef.h>

#include "store/store.h"

const struct sl__store *const sl__stores[SL_STORES] = {
#define SL_STORE_ENTRY(n) [SL_STORE_ID_##n] = &sl__store_##n,
	SL_STORE_LIST(SL_STORE_ENTRY)
#undef SL_STORE_ENTRY
};

const struct sl__store *const sl__local_order[] = { &sl__store_gds, &sl__store_uring, &sl__store_psync, NULL };

const struct sl__store *sl__store_match(const char *path)
{
	for (int i = 0; i < SL_STORES; i++)
		if (sl__stores[i]->match && sl__stores[i]->match(path))
			return sl__stores[i];
	return NULL;
}

const struct sl__store *sl__store_of(const char *path)
{
	const struct sl__store *st = sl__store_match(path);

	return st ? st : &sl__store_psync; /* every store of local files names files alike (local.c's name ops) */
}
