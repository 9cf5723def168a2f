# Issue 55, the one reader: sluice.load, from_pretrained and sluice.dcp open through the C reader (files opened and
# headers read on up to 16 threads there).  On the H200: where a fresh process's first load goes
# (bench/ckpt_first.py), the peers side by side warm in fresh processes, safetensors 0.9's prefetch among them
# (bench/ckpt_bench.py), then the checkpoint, DCP, models and transformers tests against the GPU.
# Carry .carry and .whl (safetensors 0.9.0rc1, instanttensor 0.2.2, fastsafetensors 0.5.0, runai-model-streamer
# 0.16.1, webdataset's two).
export PATH=$PWD/.carry:$PATH; . bench/gpu_machine.sh >$OUT/setup.log 2>&1 || { tail $OUT/setup.log; exit 1; }
export SLUICE_CONFIG= PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/var/tmp/pycache SLUICE_LIB=$PWD/build/libsluice.so
export SLUICE_BIN=$PWD/build/sluice PYTHONPATH=$PWD/python:$PYTHONPATH
python3 -c "import safetensors, instanttensor; print('safetensors', safetensors.__version__)"
timeout 120 python3 bench/ckpt_bench.py --make-only --shape llama8b --layers 20 --dir /var/tmp/sluice-ckpt >/dev/null 2>&1
D=/var/tmp/sluice-ckpt/llama8b-20; cat $D/*.safetensors > /dev/null
timeout 100 python3 bench/ckpt_first.py $D --procs 3 --out $OUT/first.json | cut -c1-600
timeout 200 python3 bench/ckpt_bench.py --dir /var/tmp/sluice-ckpt --shape llama8b --layers 20 --modes warm --reps 3 \
	--link --only "sluice,instanttensor MMAP,safetensors prefetch,safetensors prefetch pread" --out $OUT/warm.json 2>&1 | tail -12
timeout 170 python3 -m pytest -q -rfs -n 4 -p no:cacheprovider tests/python/test_checkpoint.py \
	tests/python/test_checkpoint_faults.py tests/python/test_load_cli.py tests/python/test_dcp.py \
	tests/python/test_models.py tests/python/test_transformers.py tests/python/test_ckpt_open_stranger.py \
	tests/python/test_images.py::test_windows_read_again_under_nvjpeg_give_the_right_images > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -8
