#!/usr/bin/env python3
"""Issue #3 benchmarks that need no GPU (as root, for drop_caches):

    python3 bench/datasets_bench.py --build build [--dir /var/tmp/sluice-dsbench] [--fio fio] [--reps 3]

1. Packing 100 classes x 1000 files of 16 KiB (in the page cache): `sluice pack --from-dir` (durable: it
   fsyncs) against `tar -cf` of the same tree, timed alone and with the `sync` that makes it durable too.
2. Opening an index of 10^8 records cold (`sluice_ds_bench open`), and the resident index per record touched
   (`sluice_ds_bench resident`).
3. Random records, cold, at queue depth --qd: sluice (batches of 256 random records through the engine,
   O_DIRECT, CRCs checked) against fio randread (io_uring, O_DIRECT) on the same shard files.  A 4 KiB record
   is stored as 4104 bytes, so O_DIRECT reads an 8 KiB aligned span for it: fio at bs=8k reads the same
   bytes (bs=4k shown for reference); 16 KiB records: 20k and 16k.
Passes interleaved, medians of --reps; JSON to --out.
"""
import argparse
import json
import os
import shutil
import subprocess
import time

from benchlib import Results, drop_caches, ratio, side_by_side


def run_json(cmd):
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def make_tree(tree, classes, per):
    if os.path.isdir(tree):
        return
    r = os.urandom(16384 * 64)
    for c in range(classes):
        d = f"{tree}/class{c:03d}"
        os.makedirs(d)
        for i in range(per):
            k = (c * per + i) % 63
            with open(f"{d}/img{i:04d}.jpg", "wb") as f:
                f.write(r[k * 16384:(k + 1) * 16384])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/sluice-dsbench")
    ap.add_argument("--fio", default="fio")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--files", type=int, default=1000, help="files per class")
    ap.add_argument("--index-records", type=int, default=100_000_000)
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--reads", type=int, default=100_000)
    ap.add_argument("--skip", default="", help="comma list of: pack,index,randread")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/datasets_bench.json")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    W, S, DB = a.dir, f"{a.build}/sluice", f"{a.build}/sluice_ds_bench"
    os.makedirs(W, exist_ok=True)
    res = Results(a.out, reps=a.reps)

    if "pack" not in skip:
        nfiles = a.classes * a.files
        make_tree(f"{W}/tree", a.classes, a.files)
        subprocess.run(["tar", "-cf", "/dev/null", "-C", W, "tree"], check=True)  # the tree in the page cache

        def tar():
            if os.path.exists(f"{W}/t.tar"):
                os.unlink(f"{W}/t.tar")
            t0 = time.perf_counter()
            subprocess.run(["tar", "-cf", f"{W}/t.tar", "-C", W, "tree"], check=True)
            t1 = time.perf_counter()
            os.sync()
            t2 = time.perf_counter()
            return {"files_s": nfiles / (t1 - t0), "files_s_with_sync": nfiles / (t2 - t0)}

        def pack():
            shutil.rmtree(f"{W}/packed", ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run([S, "pack", "--quiet", "--from-dir", f"{W}/tree", f"{W}/packed"], check=True,
                           stdout=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            os.sync()
            return {"files_s": nfiles / dt}

        got = res["pack"] = side_by_side({"tar": tar, "sluice_pack": pack}, a.reps, key="files_s")
        got["ratio_vs_tar"] = ratio(got["sluice_pack"], got["tar"], "files_s")
        got["ratio_vs_tar_with_sync"] = (got["sluice_pack"]["files_s"] / got["tar"]["files_s_with_sync"])
        print(f"pack {nfiles} files x 16 KiB, files/s: tar {got['tar']['files_s']:,.0f} "
              f"(+sync {got['tar']['files_s_with_sync']:,.0f}), sluice pack (durable) "
              f"{got['sluice_pack']['files_s']:,.0f}; ratio {got['ratio_vs_tar']:.3f}, "
              f"with sync {got['ratio_vs_tar_with_sync']:.3f}", flush=True)

    if "index" not in skip:
        big, n = f"{W}/big{a.index_records}", a.index_records
        if not os.path.exists(f"{big}/index.sli"):
            shutil.rmtree(big, ignore_errors=True)
            subprocess.run([DB, "make", big, str(n)], check=True, stdout=subprocess.DEVNULL)
        res["index"] = {"open": run_json([DB, "open", big, "11"]),
                        "resident_1m": run_json([DB, "resident", big, str(min(n, 1_000_000))]),
                        "resident_all": run_json([DB, "resident", big, str(n)])}
        print(f"index of {n} records: open {res['index']['open']['open_ms_median']:.2f} ms (median of 11, cold), "
              f"{res['index']['resident_all']['bytes_per_record']:.2f} B resident per record touched", flush=True)

    if "randread" not in skip:
        for name, count, size, same, ref in (("r4k", 1_000_000, 4096, "8k", "4k"),
                                            ("r16k", 250_000, 16384, "20k", "16k")):
            d = f"{W}/{name}"
            if not os.path.isdir(d):
                subprocess.run([DB, "makeblob", d, str(count), str(size)], check=True, stdout=subprocess.DEVNULL)
            files = ":".join(sorted(f"{d}/{f}" for f in os.listdir(d) if f.endswith(".sls")))

            def fio(bs):
                out = subprocess.run([a.fio, "--name=rr", f"--filename={files}", "--rw=randread", f"--bs={bs}",
                                      f"--iodepth={a.qd}", "--ioengine=io_uring", "--direct=1", "--fixedbufs",
                                      "--registerfiles", f"--number_ios={a.reads}", "--norandommap",
                                      "--output-format=json"], capture_output=True, text=True, check=True).stdout
                return json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"]

            got = side_by_side({"sluice": lambda: run_json([DB, "randread", d, str(a.qd), str(a.reads)])["records_per_s"],
                                f"fio_bs{same}": lambda: fio(same), f"fio_bs{ref}": lambda: fio(ref)},
                               a.reps, before=drop_caches, key="records_s")
            got["ratio_same_bytes"] = ratio(got["sluice"], got[f"fio_bs{same}"], "records_s")
            got["ratio_record_size"] = ratio(got["sluice"], got[f"fio_bs{ref}"], "records_s")
            res[f"randread_{name}"] = got
            print(f"random {size} B records, qd {a.qd}, cold: sluice {got['sluice']['records_s']:,.0f}/s, fio bs={same} "
                  f"{got[f'fio_bs{same}'].get('records_s', 0):,.0f}/s (ratio {got['ratio_same_bytes'] or 0:.2f}), "
                  f"fio bs={ref} {got[f'fio_bs{ref}'].get('records_s', 0):,.0f}/s "
                  f"(ratio {got['ratio_record_size'] or 0:.2f})", flush=True)


if __name__ == "__main__":
    main()
