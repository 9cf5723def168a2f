#!/usr/bin/env python3
"""Sums up a loader's SLUICE_TRACE file: each stage's spans, how much of them the thread spent on a CPU,
and what the loader's threads were doing while the consumer waited longest.

    python3 bench/trace_report.py trace.json [--top 5] [--bin-ms 50]

A span's CPU share far below 1 means its thread was off the CPU: waiting, or preempted by other threads.
"""
import argparse
import json
import statistics


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--bin-ms", type=float, default=50.0)
    a = ap.parse_args()
    ev = json.load(open(a.trace))["traceEvents"]
    by = {}
    for e in ev:
        by.setdefault(e["name"], []).append(e)
    print("stage          count   p50 us   p99 us   max us  CPU share p50  off-CPU ms in all")
    for name, es in sorted(by.items()):
        d = [e["dur"] for e in es]
        share = [e["args"]["cpu_us"] / e["dur"] for e in es if e["dur"] > 0]
        off = sum(max(0.0, e["dur"] - e["args"]["cpu_us"]) for e in es) / 1e3
        print(f"{name:13s} {len(es):6d} {pct(d, 50):8.1f} {pct(d, 99):8.1f} {max(d):8.1f} "
              f"{statistics.median(share) if share else 0:14.2f} {off:18.1f}")
    nexts = [e for e in by.get("next", []) if e["args"]["n"] > 0]  # an epoch's first batch is its fill
    if not nexts:
        return
    # Time bins: the consumer's wait in each, and what the producers and readers did in it.
    t_end = max(e["ts"] + e["dur"] for e in ev)
    nb = int(t_end / (a.bin_ms * 1e3)) + 1

    def spread(es):
        busy, cpu = [0.0] * nb, [0.0] * nb
        for e in es:
            t, end, share = e["ts"], e["ts"] + e["dur"], e["args"]["cpu_us"] / e["dur"] if e["dur"] > 0 else 0
            while t < end:
                b = int(t / (a.bin_ms * 1e3))
                step = min(end, (b + 1) * a.bin_ms * 1e3) - t
                busy[b] += step
                cpu[b] += step * share
                t += step
        return busy, cpu

    wait, _ = spread(nexts)
    col, col_cpu = spread(by.get("collate", []))
    rd, rd_cpu = spread(by.get("read window", []))
    bw = a.bin_ms * 1e3
    print(f"\n{a.bin_ms:.0f}-ms bins where the consumer waited over 5%: wait %, producers collating "
          "(threads busy, their CPU share), readers reading (threads busy)")
    for b in range(nb):
        if wait[b] > 0.05 * bw:
            print(f"  at {b * a.bin_ms:7.0f} ms: wait {100 * wait[b] / bw:5.1f}%  collate {col[b] / bw:4.2f} "
                  f"({col_cpu[b] / col[b] if col[b] else 0:.2f})  read {rd[b] / bw:4.2f}")
    calm = [b for b in range(nb) if wait[b] <= 0.02 * bw and col[b] > 0]
    if calm:
        print(f"  calm bins ({len(calm)}): collate {statistics.mean(col[b] for b in calm) / bw:4.2f} "
              f"({statistics.mean(col_cpu[b] / col[b] for b in calm):.2f})  "
              f"read {statistics.mean(rd[b] for b in calm) / bw:4.2f}")
    print(f"\nlongest waits: the batch waited for, and its own spans (start relative to the wait's start)")
    for w in sorted(nexts, key=lambda e: -e["dur"])[: a.top]:
        n, t0, end = w["args"]["n"], w["ts"], w["ts"] + w["dur"]
        own = []  # per stage, the batch's latest span that began before the wait ended
        for name in ("slot wait", "storage wait", "collate", "h2d"):
            es = [e for e in by.get(name, []) if e["args"]["n"] == n and e["ts"] < end]
            if es:
                own.append(max(es, key=lambda e: e["ts"]))
        parts = ", ".join(f"{e['name']} {e['ts'] - t0:+.0f} us for {e['dur']:.0f} (CPU {e['args']['cpu_us']:.0f})"
                          for e in sorted(own, key=lambda e: e["ts"]))
        print(f"  {w['dur']:8.0f} us at {t0 / 1e3:8.1f} ms, batch {n}: {parts}")


if __name__ == "__main__":
    main()
