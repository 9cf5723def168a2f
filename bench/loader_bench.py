#!/usr/bin/env python3
"""Issue #4 benchmark: sluice's loader against PyTorch's DataLoader, same records, same machine, one run.

    python3 bench/loader_bench.py --sluice build/sluice --ds-bench build/sluice_ds_bench [--dir /var/tmp/sluice-lb]

For each record size (4 KiB and 16 KiB; --records of each, default 800 MB of them) the script writes the same random records three
ways: one file per record (a directory of small files), one flat shard file (records back to back, with an
offsets array), and a sluice dataset (`sluice pack --from-dir`). It then reads one shuffled epoch into GPU
memory, cold (page cache dropped before the pass) and warm:
  - PyTorch DataLoader over the small files and over the flat shard (a map-style Dataset reading each record
    with one pread), batch --batch, shuffle=True, pin_memory=True, persistent_workers=True, num_workers in
    --workers; each batch is moved with .cuda(non_blocking=True) and the epoch ends with a synchronize. Each
    num_workers runs one epoch (which pays for starting its workers); the best of them then runs --reps more
    epochs with its persistent workers already up, interleaved with sluice's epochs, and their median counts;
  - sluice: `sluice_ds_bench loader DIR gpu BATCH 0 cold|warm` (one epoch, batches land in GPU memory; warm
    reads the dataset's files through the page cache first), median of --reps passes.
Prints samples/s and the ratio sluice / best DataLoader; JSON to --out. Without a GPU (a smoke test) both
deliver to host memory.
"""
import argparse
import json
import os
import subprocess
import time

import numpy as np
from benchlib import Results, drop_caches, side_by_side, warm


def make_sets(root, n, size, sluice):
    files, flat, ds = (f"{root}/{k}-{size}x{n}" for k in ("files", "flat", "sluice"))
    if not os.path.exists(ds):
        rng = np.random.default_rng(size)
        os.makedirs(f"{files}/c", exist_ok=True)
        with open(flat, "wb") as fl:
            for i in range(n):
                b = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
                with open(f"{files}/c/{i:08d}.bin", "wb") as f:
                    f.write(b)
                fl.write(b)
        subprocess.run([sluice, "pack", "--from-dir", files, "--all-files", "--quiet", ds], check=True)
    return files, flat, ds


def torch_loader(kind, path, n, size, batch, workers):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Files(Dataset):
        def __init__(self):
            self.names = sorted(os.listdir(f"{path}/c"))

        def __len__(self):
            return len(self.names)

        def __getitem__(self, i):
            with open(f"{path}/c/{self.names[i]}", "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)

    class Flat(Dataset):
        fd = None

        def __len__(self):
            return n

        def __getitem__(self, i):
            if self.fd is None:
                self.fd = os.open(path, os.O_RDONLY)
            return torch.frombuffer(bytearray(os.pread(self.fd, size, i * size)), dtype=torch.uint8)

    ds = Files() if kind == "files" else Flat()
    return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=torch.cuda.is_available(),
                      persistent_workers=workers > 0, drop_last=True)


def torch_epoch(dl, path, cold):
    import torch
    gpu = torch.cuda.is_available()
    if cold:
        drop_caches()
    else:
        warm(path)
    c0, t0, got = cpu_seconds(), time.perf_counter(), 0
    for b in dl:
        if gpu:
            b = b.cuda(non_blocking=True)
        got += b.shape[0]
    if gpu:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"samples_per_s": got / dt, "cpu_s_per_gb": (cpu_seconds() - c0) / (got * b.shape[1] / 1e9)}


def cpu_seconds():
    """CPU seconds of this process and its live children (the DataLoader's workers), user + system."""
    import psutil
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me] + me.children(recursive=True))


def sluice_epoch(ds_bench, ds, batch, cold, target):
    out = subprocess.run([ds_bench, "loader", ds, target, str(batch), "0", "cold" if cold else "warm"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--ds-bench", default="build/sluice_ds_bench")
    ap.add_argument("--dir", default="/var/tmp/sluice-lb")
    ap.add_argument("--records", type=int, default=0, help="records of each size (default: 800 MB of them)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", default="0,4,8,16")
    ap.add_argument("--sizes", default="4096,16384")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/loader_bench.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    res = Results(a.out, records=a.records, batch=a.batch)
    try:
        import torch
        target = "gpu" if torch.cuda.is_available() else "host"
    except ImportError:
        target = "host"

    for size in map(int, a.sizes.split(",")):
        n = a.records or 800_000_000 // size
        res[f"{size}_records"] = n
        files, flat, ds = make_sets(a.dir, n, size, a.sluice)
        for temp in ("cold", "warm"):
            cold = temp == "cold"
            row, contenders = {}, {}
            for kind, path in (("files", files), ("flat", flat)):
                # One epoch for each num_workers (the first pays for starting the workers); the best then
                # runs beside sluice, its workers already up.
                best = None
                for w in map(int, a.workers.split(",")):
                    dl = torch_loader(kind, path, n, size, a.batch, w)
                    r = row[f"torch_{kind}_{w}w_first"] = torch_epoch(dl, path, cold)["samples_per_s"]
                    print(f"{size} B {temp}: DataLoader {kind} {w} workers {r:,.0f} samples/s (first epoch)", flush=True)
                    if best is None or r > best[1]:
                        best = (w, r, dl)
                    del dl
                w, _, dl = best
                contenders[f"torch_{kind}_{w}w"] = lambda dl=dl, path=path: torch_epoch(dl, path, cold)
                del best, dl
            contenders["sluice"] = lambda: sluice_epoch(a.ds_bench, ds, a.batch, cold, target)
            # DataLoaders and sluice epoch for epoch (interleaved), --reps times; medians.
            got = side_by_side(contenders, a.reps, key="samples_per_s")
            for name, r in got.items():
                if "error" in r:
                    raise SystemExit(f"{size} B {temp}: {name}: {r['error']}")
                row[name] = r["samples_per_s"]
                row[f"{name}_cpu_s_per_gb"] = r["cpu_s_per_gb"]
                row[f"{name}_passes"] = r["passes"]
            row["sluice_detail"] = got["sluice"]
            best = max((k for k in row if k.startswith("torch_") and k.endswith("w")), key=lambda k: row[k])
            row["best_torch"] = best
            row["ratio_vs_best_torch"] = row["sluice"] / row[best]
            res[f"{size}_{temp}"] = row
            print(f"{size} B {temp}: sluice {row['sluice']:,.0f} samples/s ({row['sluice_cpu_s_per_gb']:.2f} CPU s/GB), "
                  f"best DataLoader {best} {row[best]:,.0f} ({row[best + '_cpu_s_per_gb']:.2f} CPU s/GB): "
                  f"ratio {row['ratio_vs_best_torch']:.2f}", flush=True)

if __name__ == "__main__":
    main()
