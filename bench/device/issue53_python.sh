# Issue 53 on the GPU machine: the Python layer's cost per batch before and after (bench/python_bench.py --gb 0,
# sluice.Loader(device="cuda") with the batch ready, against the bare C call), five runs of each interleaved;
# exp/a is main before #53 (2d0f4a0), made here as bench/device/issue53_hold.sh says. Then what a GPU view costs
# each way (exp/view_cost.py, a scratch probe, where it is there).
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache
P0=${PYTHONPATH:+:$PYTHONPATH}
[ -f exp/a/build/libsluice.so ] || { (cmake -S exp/a -B exp/a/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
	cmake --build exp/a/build --target sluice >/dev/null) > $OUT/build_a.log 2>&1 || { tail $OUT/build_a.log; exit 1; }; }
for r in 1 2 3 4 5; do
	for t in a new; do
		case $t in a) L=exp/a/build P=exp/a/python;; new) L=build P=python;; esac
		SLUICE_LIB=$PWD/$L/libsluice.so PYTHONPATH=$PWD/$P:$PWD/bench$P0 timeout 100 python3 bench/python_bench.py \
			--sluice build/sluice --gb 0 --out $OUT/py_${t}_$r.json > $OUT/py_${t}_$r.log 2>&1 || { echo "$t $r failed"; tail -5 $OUT/py_${t}_$r.log; }
		grep "^python overhead" $OUT/py_${t}_$r.log | sed "s/^/$t $r: /"
	done
done
[ -f exp/view_cost.py ] && timeout 100 python3 exp/view_cost.py
