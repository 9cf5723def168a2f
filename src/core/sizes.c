/* The public structs' sizes: sluice_sizeof (sluice.h) for bindings, and the checks of a caller's size (core.h). */
#include <errno.h>
#include <string.h>

#include "core.h"

static int sl_size_ok(size_t size, size_t v1, const char *name)
{
	if (size < v1)
		return sl__err(SLUICE_EINVAL_CONFIG,
			       "struct %s: size %zu, at least %zu needed (set it with its SLUICE_*_INIT or sizeof)",
			       name, size, v1);
	return 0;
}

int sl__sized_in(void *mine, size_t full, const void *theirs, size_t v1, const char *name)
{
	size_t size;
	int rc;

	memset(mine, 0, full);
	*(size_t *)mine = full;
	if (!theirs)
		return 0;
	size = *(const size_t *)theirs;
	if ((rc = sl_size_ok(size, v1, name)))
		return rc;
	/* A newer caller's fields this library does not know: only 0, their "not used", can be honoured. */
	for (size_t i = full; i < size; i++)
		if (((const unsigned char *)theirs)[i])
			return sl__err(-E2BIG, "struct %s: a field past the %zu bytes this sluice knows is set (a newer "
					       "sluice's option)", name, full);
	memcpy((char *)mine + sizeof(size_t), (const char *)theirs + sizeof(size_t),
	       (size < full ? size : full) - sizeof(size_t));
	return 0;
}

int sl__report_in(void *rep, size_t full, size_t v1, const char *name)
{
	size_t size;
	int rc;

	if (!rep)
		return 0;
	size = *(size_t *)rep;
	if ((rc = sl_size_ok(size, v1, name)))
		return rc;
	sl__report_clear(rep, full);
	return 0;
}

static size_t sl_covered(const void *rep, size_t full)
{
	size_t size = *(const size_t *)rep;

	return (size < full ? size : full) - sizeof(size_t);
}

void sl__report_clear(void *rep, size_t full)
{
	if (rep)
		memset((char *)rep + sizeof(size_t), 0, sl_covered(rep, full));
}

void sl__report_copy(void *theirs, const void *mine, size_t full)
{
	if (theirs)
		memcpy((char *)theirs + sizeof(size_t), (const char *)mine + sizeof(size_t), sl_covered(theirs, full));
}

size_t sluice_sizeof(const char *name)
{
#define SL_SIZE(s) { #s, sizeof(struct s) }
	static const struct {
		const char *name;
		size_t size;
	} sizes[] = {
		SL_SIZE(sluice_setting),
		SL_SIZE(sluice_engine_info),
		SL_SIZE(sluice_xfer_report),
		SL_SIZE(sluice_range),
		SL_SIZE(sluice_s3_object),
		SL_SIZE(sluice_copy_report),
		SL_SIZE(sluice_stats),
		SL_SIZE(sluice_field),
		SL_SIZE(sluice_writer_options),
		SL_SIZE(sluice_pack_options),
		SL_SIZE(sluice_pack_report),
		SL_SIZE(sluice_record_loc),
		SL_SIZE(sluice_record),
		SL_SIZE(sluice_shard_report),
		SL_SIZE(sluice_bad),
		SL_SIZE(sluice_loader_options),
		SL_SIZE(sluice_loader_segment),
		SL_SIZE(sluice_image_options),
		SL_SIZE(sluice_image_box),
		SL_SIZE(sluice_batch_field),
		SL_SIZE(sluice_batch),
		SL_SIZE(sluice_packer_options),
		SL_SIZE(sluice_packed_row),
		SL_SIZE(sluice_checkpoint_report),
		SL_SIZE(sluice_ckpt_tensor),
		SL_SIZE(sluice_check),
		SL_SIZE(sluice_loader_figures),
		SL_SIZE(sluice_gpu_sample),
		SL_SIZE(sluice_machine_sample),
		SL_SIZE(sluice_cpu_times),
		SL_SIZE(sluice_disk_counters),
		SL_SIZE(sluice_nic_counters),
		SL_SIZE(sluice_proc_counters),
	};
#undef SL_SIZE

	for (size_t i = 0; name && i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (!strcmp(name, sizes[i].name))
			return sizes[i].size;
	return 0;
}
