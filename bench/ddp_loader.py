"""One rank of the loader under torchrun (bench/multi_gpu_bench.py): an epoch of GPU batches of the dataset
on this rank's GPU (LOCAL_RANK); rank 0 prints, as JSON, every rank's batch count and the combined
records/s (all ranks' records over the slowest rank's time)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import sluice


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    ds = sluice.Dataset(sys.argv[1])
    ld = sluice.Loader(ds, batch_size=256, device="cuda", shuffle=True, seed=1, drop_last=True)
    dist.barrier()
    t0 = time.perf_counter()
    batches = records = 0
    for b in ld:
        batches += 1
        records += 256
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    got = torch.tensor([batches, records, secs], dtype=torch.float64, device="cuda")
    every = [torch.zeros_like(got) for _ in range(world)]
    dist.all_gather(every, got)
    if rank == 0:
        every = [e.tolist() for e in every]
        print(json.dumps({"ranks": world, "batches_per_rank": [int(e[0]) for e in every],
                          "records": int(sum(e[1] for e in every)), "seconds": max(e[2] for e in every),
                          "records_s": sum(e[1] for e in every) / max(e[2] for e in every)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
