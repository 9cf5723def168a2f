# Issue 54: where a producer's batch spends its time with the loader alone (no model, no DALI): the image
# stage's host phases (stats()["image_us"]) and the loader's stage histograms, for the producers and decoders
# the loader has by default and a few others.  Carry .carry.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
timeout 100 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_images.py > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -5
for v in "4 1" "4 4" "8 1" "8 8" "4 1"; do
	set -- $v
	SLUICE_IMAGE_PRODUCERS=$1 SLUICE_IMAGE_DECODERS=$2 timeout 120 python3 bench/e2e_images.py --images 20000 \
		--alone-steps 70 --steps 1 --warm 4 --reps 2 --models resnet18 --only sluice_decode --out $OUT/p$1d$2.json >/dev/null 2>&1
	python3 - $OUT/p$1d$2.json "$1 producers, $2 decoders" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r.get("sluice_stats", {})
d = r.get("decode", {})
print(sys.argv[2], "img/s", d.get("sluice_decode", {}).get("images_s"), "loader_us", s.get("loader_us"),
      "batches", s.get("batches"), "image_us", s.get("image_us"))
print("  stages p50/us", {k: (v["count"], v["p50_us"], round(v["total_us"] / max(1, v["count"]))) for k, v in (s.get("stages") or {}).items() if v["count"]})
PY
done
