# Issue 55, the one reader: sluice.load, from_pretrained and sluice.dcp open through the C reader (files opened and
# headers read on up to 16 threads there).  On the H200, in two calls of one lease (the checkpoint and the build
# stay on the machine between them):
#   a: the checkpoint made; the C reader's first load in fresh processes (`sluice load --json`, and with --bench);
#      where a fresh process's first sluice.load goes (bench/ckpt_first.py); the peers side by side warm in fresh
#      processes with the pinned link, safetensors 0.9's prefetch among them (bench/ckpt_bench.py)
#   b: which step of the first open is slow (issue55_opens.py); the checkpoint, DCP, models and transformers
#      tests against the GPU; cold loads beside fio and the peers
#   c: the first load under cProfile; from_pretrained beside transformers' (bench/model_bench.py); sluice's
#      transfer settings cold beside fastsafetensors
#   probe: the engine's start and its workers' (SLUICE_LOG=info), what pinning host memory costs, the first load
#      with the workers ready before the clock;  gc: the first load with Python's collections timed
#      (bench/ckpt_first.py) and the library's open timed in C (SLUICE_LOG=debug); debug: that open timed
#      inside ckpt_first.py's children and in a plain fresh process; fp: from_pretrained under cProfile
#      (issue55_fp.py)
# Carry .carry and .whl (bench/prepare_gpu_machine.sh: WHEELS="datasets ckpt").
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
D=/var/tmp/sluice-ckpt/llama8b-20
[ -d $D ] || timeout 120 python3 bench/ckpt_bench.py --make-only --shape llama8b --layers 20 --dir /var/tmp/sluice-ckpt >/dev/null 2>&1
cat $D/*.safetensors > /dev/null
case "$1" in
a)
	python3 -c "import safetensors, instanttensor; print('safetensors', safetensors.__version__)"
	du -sh $D
	for k in 1 2 3; do build/sluice load $D --json | cut -c1-220; done
	SLUICE_LOG=info build/sluice load $D --json 2>&1 | grep -E "ready|pin" | head -4
	build/sluice load $D --bench --reps 3 | tail -3
	timeout 100 python3 bench/ckpt_first.py $D --procs 3 --out $OUT/first.json | cut -c1-700
	timeout 240 python3 bench/ckpt_bench.py --dir /var/tmp/sluice-ckpt --shape llama8b --layers 20 --modes warm --reps 3 \
		--link --only "sluice,instanttensor MMAP,safetensors prefetch,safetensors prefetch pread" --out $OUT/warm.json 2>&1 | tail -12
	;;
b)
	python3 bench/device/issue55_opens.py $D; SLUICE_BACKEND=psync python3 bench/device/issue55_opens.py $D | tail -2
	timeout 200 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_checkpoint.py \
		tests/python/test_checkpoint_faults.py tests/python/test_load_cli.py tests/python/test_dcp.py \
		tests/python/test_models.py tests/python/test_transformers.py tests/python/test_ckpt_open_stranger.py \
		tests/python/test_images.py::test_windows_read_again_under_nvjpeg_give_the_right_images > $OUT/pytest.log 2>&1
	echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -8
	timeout 200 python3 bench/ckpt_bench.py --dir /var/tmp/sluice-ckpt --shape llama8b --layers 20 --modes cold --reps 2 \
		--fio $PWD/.carry/fio --only "sluice,instanttensor MMAP,fastsafetensors,safetensors prefetch" --out $OUT/cold.json 2>&1 | tail -9
	;;
c)
	timeout 60 python3 bench/ckpt_first.py $D --procs 1 --arms "load starts the engine" --profile $OUT/prof.txt | cut -c1-300
	timeout 200 python3 bench/model_bench.py --layers 8 --modes warm --reps 3 --out $OUT/model.json 2>&1 | tail -6
	timeout 150 python3 bench/ckpt_bench.py --dir /var/tmp/sluice-ckpt --shape llama8b --layers 20 --modes cold --reps 2 \
		--only "sluice,sluice 16M,sluice direct=never,fastsafetensors" --out $OUT/cold2.json 2>&1 | tail -5
	;;
probe)
	for k in 1 2; do SLUICE_LOG=info build/sluice load $D --json 2>&1 | grep -E "engine|ready|gb_s" | cut -c1-200; done
	cat /sys/kernel/mm/transparent_hugepage/enabled
	python3 bench/device/issue55_pins.py
	timeout 150 python3 bench/ckpt_first.py $D --procs 3 --arms "engine ready first,load starts the engine" --out $OUT/first.json | cut -c1-700
	SLUICE_QUEUE_DEPTH=2 timeout 80 python3 bench/ckpt_first.py $D --procs 3 --arms "load starts the engine" | cut -c1-500
	;;
gc)
	timeout 100 python3 bench/ckpt_first.py $D --procs 3 --arms "engine ready first,load starts the engine" --out $OUT/first.json | cut -c1-900
	SLUICE_LOG=debug python3 bench/device/issue55_fresh.py $D 2>&1 | grep -E "ckpt|load|ready|engine open" | cut -c1-220
	;;
debug)  # the library's open timed (SLUICE_LOG=debug) inside ckpt_first.py's children and a plain fresh process
	for k in 1 2; do
		SLUICE_LOG=debug timeout 60 python3 bench/ckpt_first.py $D --procs 1 --stderr --arms "load starts the engine" 2>&1 |
			grep -E "ckpt|ready|load starts" | sed 's/llama8b-20.model.safetensors.index.json//' | cut -c1-330
		SLUICE_LOG=debug python3 bench/device/issue55_fresh.py $D 2>&1 | grep -E "ckpt|ready|load" | cut -c1-200
	done
	;;
fp)  # from_pretrained under cProfile in a fresh process (the model of bench/model_bench.py)
	M=/var/tmp/sluice-model/llama8b-8
	[ -f $M/config.json ] || timeout 200 python3 bench/model_bench.py --layers 8 --modes warm --reps 1 --out /dev/null | tail -2
	cat $M/*.safetensors > /dev/null
	python3 bench/device/issue55_fp.py $M 2>&1 | grep -v "^$" | cut -c1-170 | head -60
	;;
esac
