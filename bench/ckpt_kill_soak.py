"""kill -9 soak of sharded sluice.save: the directory loads as the old checkpoint or the new one, never a mix.

    python3 bench/ckpt_kill_soak.py --trials 100

Two cases, `--trials` times each:
  replace  a child saving checkpoints A and B in turn (12 and 7 tensors, shards of 1500 and 2200 bytes: the
           shard counts differ) into one directory is killed (SIGKILL) after a random 0-300 ms; the directory
           must then load as A or as B, whole;
  first    a child's first save into an empty directory is killed at its K-th rename (K random, 1 to 13: the
           12 shards, then the index); the directory must be refused (an unfinished save) or, past the index,
           load whole, never load as a checkpoint of fewer tensors.
  single   the same first save, into a directory holding a single-file model.safetensors (7 other tensors):
           the directory must load as that file's checkpoint whole, be refused (an unfinished save over
           another checkpoint) or, past the index, load as the new one whole; never a mix of the two.
Then one more save must leave exactly the files its index names.  It prints, per case, the trials, how each
ended and the failures (any mix, partial load or unexpected error), as JSON; the exit status is 1 on any
failure.  tests/python/test_checkpoint_faults.py runs a few trials of each in `make test`.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python"), os.path.join(ROOT, "tests", "remote")]
import sluice  # noqa: E402
from test_checkpoint_faults import KILLED_AT, kill_trials, model  # noqa: E402  (the tests' children and checks)


def replace_case(d, trials, rng):
    sluice.save(model(1, n=7), d, max_shard_size=1500)
    ends, failures = {}, []
    for t in range(trials):
        try:
            end = kill_trials(d, 1, rng)[0]
        except Exception as e:  # a mix (AssertionError) or an error loading what the kill left
            end = "failure"
            failures.append(f"trial {t}: {type(e).__name__}: {str(e)[:300]}")
        ends[end] = ends.get(end, 0) + 1
    sluice.save(model(5), d, max_shard_size=2000)
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    left = sorted(set(os.listdir(d)) - set(idx["weight_map"].values()) - {"model.safetensors.index.json"})
    if left:
        failures.append(f"after the last save, files no index names: {left}")
    return ends, failures


def first_case(base, trials, rng, over_single=False):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    ends, failures = {}, []
    old = {f"old.{i}": v for i, v in enumerate(model(1, n=7).values())}
    for t in range(trials):
        d, k = os.path.join(base, f"{'single' if over_single else 'first'}{t}"), rng.randint(1, 13)
        if over_single:
            os.makedirs(d)
            sluice.save(old, os.path.join(d, "model.safetensors"))
        subprocess.run([sys.executable, "-c", KILLED_AT, d, str(k)], env=env, capture_output=True, timeout=120)
        try:
            got = sluice.load(d, device="numpy")
            end = "whole" if len(got) == 12 and not set(got) & set(old) else \
                "old" if over_single and set(got) == set(old) else "partial"
            if end == "partial":
                failures.append(f"trial {t} (killed at rename {k}): loaded {len(got)} tensors: {sorted(got)[:4]}")
        except sluice.SluiceError as e:
            end = "refused"
            if "unfinished save" not in str(e) and "No such file" not in str(e):
                failures.append(f"trial {t} (killed at rename {k}): {e}")
        ends[end] = ends.get(end, 0) + 1
    return ends, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=37)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for name, run in (("replace", lambda: replace_case(os.path.join(tmp, "ck"), a.trials, rng)),
                          ("first", lambda: first_case(tmp, a.trials, rng)),
                          ("single", lambda: first_case(tmp, a.trials, rng, over_single=True))):
            ends, failures = run()
            out[name] = {"trials": a.trials, "ends": ends, "failures": failures}
    print(json.dumps(out, indent=2))
    sys.exit(1 if any(v["failures"] for v in out.values()) else 0)


if __name__ == "__main__":
    main()
