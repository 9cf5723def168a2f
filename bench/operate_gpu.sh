#!/bin/sh
# Issue #14 on the GPU machine: sluice doctor, sluice top while a GPU loader
# and a cold GPU read run, the loader's /metrics scraped, and sluice tune on
# the machine's disk and on an object of the test S3 server (moto).  Run
# after `. bench/gpu_machine.sh`, with SLUICE_LIB, SLUICE_BIN and
# PYTHONPATH=python set; outputs go to $OUT (default /tmp/op).
OUT="${OUT:-/tmp/op}"
S="${SLUICE_BIN:-build/sluice}"
DIR="${OP_DIR:-/tmp/sluice-op}"
mkdir -p "$OUT" "$DIR"
export SLUICE_CONFIG=  # measure the defaults, whatever a settings file says

echo "== sluice doctor $DIR"
"$S" doctor "$DIR" | tee "$OUT/doctor.txt"
"$S" doctor --json "$DIR" > "$OUT/doctor.json"

echo "== sluice top: a cold 2 GiB read into the GPU, and a GPU loader with SLUICE_METRICS_PORT=9464"
dd if=/dev/urandom of="$DIR/top.bin" bs=1M count=2048 status=none
python3 -c "
import json, random
with open('$DIR/in.jsonl', 'w') as f:
    for i in range(20000):
        f.write(json.dumps({'text': 'x' * random.randint(200, 4000), 'n': i}) + '\n')"
"$S" pack --from-jsonl "$DIR/in.jsonl" --fields text,n --quiet "$DIR/ds"
SLUICE_METRICS_PORT=9464 python3 -c "
import sluice, time, torch
ld = sluice.Loader(sluice.Dataset('$DIR/ds'), shuffle=True, batch_size=64, device='cuda')
t = None
while t is None or time.time() - t < 10:
    for b in ld:
        torch.cuda._sleep(200000)  # a training step's GPU time
        if t is None:
            t = time.time()
            open('$DIR/ready', 'w').close()
    ld.set_epoch(ld.state_dict()['epoch'] + 1)
" &
LOADER=$!
for i in $(seq 60); do [ -f "$DIR/ready" ] && break; sleep 1; done
"$S" bench --cold --duration 5 "$DIR/top.bin" > /dev/null &
BENCH=$!
sleep 1
"$S" top --count 2 --interval 1 | tee "$OUT/top.txt"
"$S" top --json --count 1 --interval 1 > "$OUT/top.json"
python3 -c "
import urllib.request
open('$OUT/metrics.txt', 'wb').write(urllib.request.urlopen('http://127.0.0.1:9464/metrics').read())"
grep -E '^sluice_(io_bytes_total|io_calls_total|loader_batches_total|loader_gpu_wait_ratio|loader_stage_seconds_total.*(read|h2d|consumer_wait))' "$OUT/metrics.txt"
wait $LOADER $BENCH

echo "== sluice tune $DIR"
SLUICE_CONFIG="$OUT/sluice.conf" "$S" tune "$DIR" 2>&1 | tee "$OUT/tune.txt"
cat "$OUT/sluice.conf"

echo "== sluice tune s3://tune/obj (1 GiB on moto, tests/remote/s3server.py)"
python3 tests/remote/with_s3_server.py sh -c '
	export AWS_ENDPOINT_URL=$SLUICE_TEST_S3_ENDPOINT AWS_ACCESS_KEY_ID=$SLUICE_TEST_S3_ACCESS_KEY \
		AWS_SECRET_ACCESS_KEY=$SLUICE_TEST_S3_SECRET_KEY AWS_REGION=us-east-1
	python3 -c "import boto3, os; boto3.client(\"s3\", endpoint_url=os.environ[\"AWS_ENDPOINT_URL\"]).create_bucket(Bucket=\"tune\")"
	head -c 1073741824 '"$DIR/top.bin"' > '"$DIR/obj"' && "'"$S"'" cp '"$DIR/obj"' s3://tune/obj &&
	SLUICE_CONFIG='"$OUT/sluice.conf"' "'"$S"'" tune s3://tune/obj' 2>&1 | grep -v werkzeug | tee "$OUT/tune_s3.txt"
cat "$OUT/sluice.conf"
rm -rf "$DIR"
