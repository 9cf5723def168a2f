#!/bin/sh
# Issue #14 on the GPU machine: sluice doctor, sluice top while a GPU loader
# and a GPU read run, the loader's /metrics scraped, and sluice tune on the
# machine's disk.  Run after `. bench/gpu_machine.sh`, with SLUICE_LIB,
# SLUICE_BIN and PYTHONPATH=python set; outputs go to $OUT (default /tmp/op).
OUT="${OUT:-/tmp/op}"
S="${SLUICE_BIN:-build/sluice}"
DIR="${OP_DIR:-/tmp/sluice-op}"
mkdir -p "$OUT" "$DIR"
export SLUICE_CONFIG=  # measure the defaults, whatever a settings file says

echo "== sluice doctor $DIR"
"$S" doctor "$DIR" | tee "$OUT/doctor.txt"
"$S" doctor --json "$DIR" > "$OUT/doctor.json"

echo "== sluice top: a 2 GiB file read into the GPU, and a GPU loader with SLUICE_METRICS_PORT=9464"
dd if=/dev/zero of="$DIR/top.bin" bs=1M count=2048 status=none
python3 -c "
import json, random
with open('$DIR/in.jsonl', 'w') as f:
    for i in range(20000):
        f.write(json.dumps({'text': 'x' * random.randint(200, 4000), 'n': i}) + '\n')"
"$S" pack --from-jsonl "$DIR/in.jsonl" --fields text,n --quiet "$DIR/ds"
SLUICE_METRICS_PORT=9464 python3 -c "
import sluice, time, torch
ld = sluice.Loader(sluice.Dataset('$DIR/ds'), batch_size=64, device='cuda')
t = time.time()
while time.time() - t < 8:
    for b in ld:
        torch.cuda._sleep(200000)  # a training step's GPU time
    ld.set_epoch(ld.state_dict()['epoch'] + 1)
" &
LOADER=$!
"$S" bench --duration 8 "$DIR/top.bin" > /dev/null &
BENCH=$!
sleep 3
"$S" top --count 2 --interval 1 | tee "$OUT/top.txt"
"$S" top --json --count 1 --interval 1 > "$OUT/top.json"
curl -s http://127.0.0.1:9464/metrics > "$OUT/metrics.txt"
grep -E '^sluice_(io_bytes_total|io_calls_total|loader_batches_total|loader_gpu_wait_ratio|loader_stage_seconds_total.*(read|h2d|consumer_wait))' "$OUT/metrics.txt"
wait $LOADER $BENCH

echo "== sluice tune $DIR"
SLUICE_CONFIG="$OUT/sluice.conf" "$S" tune --json "$DIR" > "$OUT/tune.json" 2> "$OUT/tune.err"
echo "exit $?"
cat "$OUT/tune.err"
cat "$OUT/sluice.conf"
python3 -c "
import json; t = json.load(open('$OUT/tune.json'))
print('defaults', t['defaults']); print('picked  ', t['picked'])
print('gain cold %.3f warm %.3f over %d trials' % (t['gain_cold'], t['gain_warm'], len(t['trials'])))"
rm -rf "$DIR"
