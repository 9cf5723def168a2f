# Issue 53 on the GPU machine: the hold option's cost, traced (bench/loader_ab.py, raw records warm and cold) and
# the JPEG pipeline before and after (bench/e2e_images.py, sluice on ResNet-18), in one lease.
#   exp/a  main before #53 (2d0f4a0), exp/e  #53 with the producer moving every held batch (eager),
#   build  #53 as it is: a held batch moves only once the ring runs below half full.
# Made here before the call: for c in 2d0f4a0:a 06a4226:e; do mkdir -p exp/${c#*:} && git archive ${c%:*} src include
#   cli CMakeLists.txt bench tests python sluice.pc.in scripts | tar -x -C exp/${c#*:}; done
# Part 1 (no argument): builds, the GPU tests, loader_ab; part 2 ("images"): the JPEG a/b.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_BIN=$PWD/build/sluice
P0=${PYTHONPATH:+:$PYTHONPATH}
for t in a e; do
	[ -f exp/$t/build/libsluice.so ] || { (cmake -S exp/$t -B exp/$t/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
		cmake --build exp/$t/build --target sluice_ds_bench sluice >/dev/null) > $OUT/build_$t.log 2>&1 || { tail $OUT/build_$t.log; exit 1; }; }
done
if [ "$1" != images ]; then
	SLUICE_LIB=$PWD/build/libsluice.so PYTHONPATH=$PWD/python$P0 timeout 200 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider \
		tests/python/test_dataloader_contract.py tests/python/test_gpu.py tests/python/test_images.py \
		tests/python/test_loader_resume.py tests/python/test_sluice.py > $OUT/pytest.log 2>&1
	echo "pytest rc=$?"; grep -E "FAILED|ERROR " $OUT/pytest.log | head -20; tail -1 $OUT/pytest.log
	timeout 330 python3 bench/loader_ab.py --a exp/a/build/sluice_ds_bench --b build/sluice_ds_bench \
		--arm new+hold=build/sluice_ds_bench --arm eager+hold=exp/e/build/sluice_ds_bench \
		--sluice build/sluice --reps 7 --temps warm,cold > $OUT/loader_ab.log 2>&1
	echo "ab rc=$?"; cat $OUT/loader_ab.log | tail -8
	exit 0
fi
for r in 1 2 3; do
	for t in a new eager; do
		case $t in a) L=exp/a/build P=exp/a/python;; new) L=build P=python;; eager) L=exp/e/build P=python;; esac
		SLUICE_LIB=$PWD/$L/libsluice.so PYTHONPATH=$PWD/$P$P0 timeout 150 python3 bench/e2e_images.py --only sluice \
			--models resnet18 --reps 1 --steps 60 --out $OUT/e2e_${t}_$r.json > $OUT/e2e_${t}_$r.log 2>&1 || { echo "e2e $t $r failed"; tail -5 $OUT/e2e_${t}_$r.log; }
		grep "^resnet18" $OUT/e2e_${t}_$r.log | cut -c1-60 | sed "s/^/$t $r: /"
	done
done
