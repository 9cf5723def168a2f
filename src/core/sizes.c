/* sluice_sizeof (sluice.h): the public structs sizes, for bindings. */
#include <string.h>

#include "sluice.h"

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
		SL_SIZE(sluice_batch_field),
		SL_SIZE(sluice_batch),
		SL_SIZE(sluice_packer_options),
		SL_SIZE(sluice_packed_row),
		SL_SIZE(sluice_checkpoint_report),
		SL_SIZE(sluice_check),
		SL_SIZE(sluice_loader_figures),
		SL_SIZE(sluice_gpu_sample),
	};
#undef SL_SIZE

	for (size_t i = 0; name && i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (!strcmp(name, sizes[i].name))
			return sizes[i].size;
	return 0;
}
