# Issue 53 on the GPU machine, the build that closes it: the GPU tests of the loader, then the loader before and
# after (exp/a: main before #53, 2d0f4a0, made as bench/device/issue53_hold.sh says), raw records warm and cold
# (bench/loader_ab.py) and, with "images", the JPEG pipeline (bench/e2e_images.py, ResNet-18), in one lease.
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_BIN=$PWD/build/sluice
P0=${PYTHONPATH:+:$PYTHONPATH}
[ -f exp/a/build/libsluice.so ] && [ -f exp/a/build/sluice_ds_bench ] || { (cmake -S exp/a -B exp/a/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
	cmake --build exp/a/build --target sluice_ds_bench sluice >/dev/null) > $OUT/build_a.log 2>&1 || { tail $OUT/build_a.log; exit 1; }; }
if [ "$1" != images ]; then
	SLUICE_LIB=$PWD/build/libsluice.so PYTHONPATH=$PWD/python$P0 timeout 200 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider \
		tests/python/test_dataloader_contract.py tests/python/test_loader_stranger.py tests/python/test_gpu.py \
		tests/python/test_images.py tests/python/test_loader_resume.py tests/python/test_sluice.py > $OUT/pytest.log 2>&1
	echo "pytest rc=$?"; grep -E "FAILED|ERROR " $OUT/pytest.log | head -20; tail -1 $OUT/pytest.log
	timeout 300 python3 bench/loader_ab.py --a exp/a/build/sluice_ds_bench --b build/sluice_ds_bench \
		--arm new+hold=build/sluice_ds_bench --sluice build/sluice --reps 7 --temps warm,cold > $OUT/loader_ab.log 2>&1
	echo "ab rc=$?"; tail -6 $OUT/loader_ab.log
	exit 0
fi
for r in 1 2 3; do
	for t in a new; do
		case $t in a) L=exp/a/build P=exp/a/python;; new) L=build P=python;; esac
		SLUICE_LIB=$PWD/$L/libsluice.so PYTHONPATH=$PWD/$P$P0 timeout 150 python3 bench/e2e_images.py --only sluice \
			--models resnet18 --reps 1 --steps 60 > $OUT/e2e_${t}_$r.log 2>&1 || { echo "e2e $t $r failed"; tail -5 $OUT/e2e_${t}_$r.log; }
		grep "^resnet18" $OUT/e2e_${t}_$r.log | cut -c1-60 | sed "s/^/$t $r: /"
	done
done
