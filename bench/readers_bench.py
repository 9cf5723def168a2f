#!/usr/bin/env python3
"""Issue #3: sluice's readers of foreign formats against the reference Python readers, same files, cold.

    python3 bench/readers_bench.py --ds-bench build/sluice_ds_bench [--dir /var/tmp/sluice-readers]

Megatron: a PREFIX.bin/.idx of --sequences u16 token sequences, written in Megatron-LM's layout. The
reference reader is Megatron's own logic (numpy memmap of both files; each sequence is
np.frombuffer(bin, dtype, count=length, offset=pointer)); it copies every sequence out with np.array, as
sluice copies into its buffer. WebDataset: --shards tars of --samples samples each (a 16 KiB .jpg and a .cls),
written with tarfile. The reference is the webdataset package iterating raw samples. sluice reads every record
in order through sluice_dataset_read_batch (`sluice_ds_bench recs`). The page cache is dropped before every
pass; medians of --reps. Prints records/s and the ratio; JSON goes to --out.
"""
import argparse
import io
import json
import os
import struct
import subprocess
import tarfile
import time

import numpy as np
from benchlib import Results, drop_caches, side_by_side


def make_megatron(prefix, n, seed=1):
    if os.path.exists(prefix + ".idx"):
        return
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 500, size=n, dtype=np.int32)
    pointers = np.zeros(n, dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * 2)
    with open(prefix + ".bin", "wb") as f:
        for start in range(0, n, 100000):
            chunk = lengths[start:start + 100000]
            f.write(rng.integers(0, 65535, size=int(chunk.sum()), dtype=np.uint16).tobytes())
    docs = np.arange(0, n + 1, 4, dtype=np.int64)
    docs[-1] = n
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", n) + struct.pack("<Q", len(docs)))
        f.write(lengths.tobytes() + pointers.tobytes() + docs.tobytes())


def megatron_reference(prefix):
    """Megatron-LM's _IndexReader / MMapIndexedDataset.get logic, every sequence copied out."""
    idx = np.memmap(prefix + ".idx", mode="r", order="C")
    buf = memoryview(idx)
    n = struct.unpack("<Q", bytes(buf[18:26]))[0]
    offset = 34
    lengths = np.frombuffer(buf, dtype=np.int32, count=n, offset=offset)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=offset + lengths.nbytes)
    bin_buf = memoryview(np.memmap(prefix + ".bin", mode="r", order="C"))
    total = 0
    for i in range(n):
        a = np.array(np.frombuffer(bin_buf, dtype=np.uint16, count=int(lengths[i]), offset=int(pointers[i])))
        total += a.size
    return n


def make_wds(d, shards, samples, seed=2):
    os.makedirs(d, exist_ok=True)
    if os.path.exists(f"{d}/shard-{shards - 1:06d}.tar"):
        return
    rng = np.random.default_rng(seed)
    blob = rng.integers(0, 255, size=16384 * 64, dtype=np.uint8).tobytes()
    for s in range(shards):
        with tarfile.open(f"{d}/shard-{s:06d}.tar", "w") as t:
            for j in range(samples):
                k = (s * samples + j) % 63
                for ext, data in (("jpg", blob[k * 16384:(k + 1) * 16384]), ("cls", str(j % 1000).encode())):
                    ti = tarfile.TarInfo(f"s{s:04d}_{j:06d}.{ext}")
                    ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))


def wds_reference(d, shards):
    import webdataset as wds

    urls = [f"{d}/shard-{s:06d}.tar" for s in range(shards)]
    n = 0
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        n += 1
    return n


def sluice_recs(ds_bench, path):
    """One cold pass of sluice reading every record in order; records/s."""
    out = subprocess.run([ds_bench, "recs", path, "x"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, DS_BENCH_REPS="1")).stdout
    return json.loads(out)["records_per_s"]


def compare(reference, sluice_pass, reps):
    """The reference reader and sluice, pass for pass, cold; records/s medians and the ratio."""
    got = side_by_side({"reference": reference, "sluice": sluice_pass}, reps, before=drop_caches,
                       key="records_s")
    ref, sl = got["reference"], got["sluice"]
    return {"reference_records_s": ref.get("records_s"), "reference_passes": ref.get("passes", ref.get("error")),
            "sluice_records_s": sl.get("records_s"), "sluice_passes": sl.get("passes", sl.get("error")),
            "ratio": sl["records_s"] / ref["records_s"] if ref.get("records_s") and sl.get("records_s") else None}


def rate(fn):
    """fn() returns a count; its count per second."""
    t0 = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ds-bench", default="build/sluice_ds_bench")
    ap.add_argument("--dir", default="/var/tmp/sluice-readers")
    ap.add_argument("--sequences", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/readers_bench.json")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    res = Results(a.out)

    prefix = f"{a.dir}/megatron_text_document"
    make_megatron(prefix, a.sequences)
    m = res["megatron"] = compare(lambda: rate(lambda: megatron_reference(prefix)),
                                  lambda: sluice_recs(a.ds_bench, prefix), a.reps)
    print(f"Megatron, {a.sequences} sequences: reference {m['reference_records_s']:,.0f} rec/s, "
          f"sluice {m['sluice_records_s']:,.0f} rec/s, ratio {m['ratio']:.2f}", flush=True)

    wd = f"{a.dir}/wds"
    make_wds(wd, a.shards, a.samples)
    sluice_recs(a.ds_bench, wd)  # builds the sidecar indexes once (cached); not timed
    w = res["webdataset"] = compare(lambda: rate(lambda: wds_reference(wd, a.shards)),
                                    lambda: sluice_recs(a.ds_bench, wd), a.reps)
    print(f"WebDataset, {a.shards} x {a.samples} samples: reference {w['reference_records_s'] or 0:,.0f} samples/s, "
          f"sluice {w['sluice_records_s']:,.0f} samples/s"
          + (f", ratio {w['ratio']:.2f}" if w["ratio"] else f" (reference: {w['reference_passes']})"), flush=True)

if __name__ == "__main__":
    main()
