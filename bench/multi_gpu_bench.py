"""Several GPUs of one host (issue #15, part 1).

1. Read once, deliver to every GPU: sluice.read_broadcast of a SIZE file into a tensor on each GPU, against
   reading it from storage once per GPU (sluice.read into each GPU's tensor in turn), cold (page cache
   dropped) and warm; GB/s delivered (GPUs x SIZE / seconds), medians of REPS interleaved passes.
2. The loader under torchrun, one rank per GPU (bench/ddp_loader.py), against one rank: batches per rank
   (equal) and combined records/s, cold.

    python3 bench/multi_gpu_bench.py --size 4G --reps 3 --dir /tmp/mg
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results, drop_caches, make_file, pack_tokens, parse_size, ratio, side_by_side, timed, warm  # noqa: E402

import sluice  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="4G")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/sluice-mg")
    ap.add_argument("--tokens", default="1G", help="the loader's dataset: bytes of uint32 tokens")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    ngpu = torch.cuda.device_count()
    size = parse_size(a.size)
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "blob")
    make_file(path, size)
    res = Results(a.out, bench="multi_gpu", gpus=ngpu, size=size)
    outs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{d}") for d in range(ngpu)]

    def sync():
        for d in range(ngpu):
            torch.cuda.synchronize(d)

    def bcast():
        return timed(lambda: (sluice.read_broadcast(path, outs), sync()), ngpu * size)

    def each():
        def one():
            for o in outs:
                sluice.read(path, o)
            sync()
        return timed(one, ngpu * size)

    import numpy as np
    step = max(1, size // 4096)
    want = torch.from_numpy(np.array(np.memmap(path, np.uint8, mode="r")[::step]))
    sluice.read_broadcast(path, outs)
    res["same_bytes"] = all(torch.equal(o[::step].cpu(), want) for o in outs)
    for temp, before in (("cold", drop_caches), ("warm", lambda: warm(path))):
        r = side_by_side({"broadcast": bcast, "per_gpu": each}, a.reps, before=before)
        res[temp] = r
        res[f"{temp}_broadcast_over_per_gpu"] = ratio(r.get("broadcast"), r.get("per_gpu"))
        for k, v in r.items():
            print(f"[mg] {temp} {k}: {v.get('gb_s', 0):.2f} GB/s delivered to {ngpu} GPUs, "
                  f"{v.get('cpu_s_per_gb', 0):.3f} CPU s/GB {v.get('error', '')}", flush=True)
    outs.clear()
    torch.cuda.empty_cache()

    # device_ids: the file (warm) into every GPU at once, one engine serving the first GPU only against one
    # serving them all (each GPU's workers copy over its own link); each a process of its own.
    def lanes(ids):
        def one():
            r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lanes_read.py"), path, "3"],
                               capture_output=True, text=True, env=dict(os.environ, SLUICE_DEVICE_IDS=ids))
            if r.returncode:
                raise RuntimeError(r.stderr[-2000:])
            return json.loads(r.stdout.strip().splitlines()[-1])
        return one
    every = ",".join(str(d) for d in range(ngpu))
    r = side_by_side({"device_ids_all": lanes(every), "device_ids_0": lanes("0")}, a.reps, before=lambda: warm(path))
    res["warm_into_every_gpu"] = r
    res["device_ids_gain"] = ratio(r.get("device_ids_all"), r.get("device_ids_0"))
    for k, v in r.items():
        print(f"[mg] warm into every GPU, {k}: {v.get('gb_s', 0):.2f} GB/s {v.get('error', '')}", flush=True)

    # The loader: one rank per GPU against one rank, each pass cold, in processes of their own.
    ds = os.path.join(a.dir, "tokens")
    pack_tokens(SLUICE, a.dir, parse_size(a.tokens), {"tokens": []})

    def ddp(n):
        def one():
            r = subprocess.run(["torchrun", "--standalone", f"--nproc_per_node={n}",
                                os.path.join(ROOT, "bench", "ddp_loader.py"), ds], capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr[-2000:])
            return json.loads(r.stdout.strip().splitlines()[-1])
        return one
    r = side_by_side({f"ranks_{ngpu}": ddp(ngpu), "ranks_1": ddp(1)}, a.reps, before=drop_caches, key="records_s")
    res["loader_cold"] = r
    res["loader_scaling"] = ratio(r.get(f"ranks_{ngpu}"), r.get("ranks_1"), key="records_s")
    for k, v in r.items():
        print(f"[mg] loader cold {k}: {v.get('records_s', 0):.0f} records/s combined, batches per rank "
              f"{v.get('batches_per_rank')} {v.get('error', '')}", flush=True)
    print(f"[mg] broadcast / per GPU: cold {res['cold_broadcast_over_per_gpu']}, warm "
          f"{res['warm_broadcast_over_per_gpu']}; device_ids all / 0: {res['device_ids_gain']}; "
          f"loader {ngpu} ranks / 1: {res['loader_scaling']}", flush=True)


if __name__ == "__main__":
    main()
