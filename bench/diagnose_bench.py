"""sluice diagnose on a user's ImageFolder training script (bench/imagefolder_train.py, unchanged): the verdict
of a run with few workers, then --sweep-workers: each count's measured batches a second against what the first
run predicted (issue #39's target: within 15%).  Data: bench/e2e_images.py's ImageFolder (made there).

    python3 bench/diagnose_bench.py --folder /var/tmp/sluice-e2e/imgs --workers 2 --sweep 2,4,8 --out d.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", default="/var/tmp/sluice-e2e/imgs")
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", os.path.join(HERE, "..", "build", "sluice")))
    ap.add_argument("--workers", type=int, default=2, help="the first run's DataLoader workers")
    ap.add_argument("--sweep", default="2,4,8")
    ap.add_argument("--steps", type=int, default=40, help="batches of the first run and of each sweep run")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    res = Results(a.out, bench="diagnose", folder=a.folder, workers=a.workers, sweep=a.sweep, steps=a.steps)
    d = tempfile.mkdtemp()
    r = subprocess.run([a.sluice, "diagnose", "--json", f"{d}/r.json", "--html", f"{d}/r.html", "--sweep-workers",
                        a.sweep, "--steps", str(a.steps), "--", sys.executable, os.path.join(HERE, "imagefolder_train.py"),
                        a.folder, str(a.workers), str(a.steps)], capture_output=True, text=True,
                       env=dict(os.environ, SLUICE_PYTHON=sys.executable))
    print(r.stderr[-3000:], flush=True)
    rep = json.load(open(f"{d}/r.json"))
    main_r = max(rep["loaders"], key=lambda x: x["batches"])
    res["verdict"], res["evidence"], res["fix"] = main_r["verdict"], main_r["evidence"], main_r["fix"]
    res["sweep_result"] = rep.get("sweep")
    for s in rep.get("sweep") or []:
        p, m = s.get("predicted_batches_s"), s.get("batches_s")
        s["predicted_over_measured"] = p / m if p and m else None
        print(f"[diagnose] {s['workers']} workers: measured {m or 0:.2f} batches/s, predicted "
              f"{p or 0:.2f}: {s['predicted_over_measured'] or 0:.2f}x", flush=True)
    res["sweep_result"] = rep.get("sweep")
    print(f"[diagnose] first run ({a.workers} workers): {main_r['verdict']}: {' '.join(main_r['evidence'])} "
          f"{main_r['fix']}", flush=True)


if __name__ == "__main__":
    main()
