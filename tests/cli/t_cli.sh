#!/bin/sh
# sluice bench and info from the outside: modes, --json, --verify, and
# every bad input getting a one-line error naming the culprit.
S="$1"
D="${SLUICE_TEST_DIR:-/tmp}/t_cli.$$"
fails=0
PYTHON="${SLUICE_PYTHON:-python3}" # writes the foreign inputs (tarfile, .npy by hand)
rm -rf "$D" && mkdir -p "$D" || exit 1
trap 'rm -rf "$D"' EXIT
head -c 5000000 /dev/urandom > "$D/f.bin"
mkdir "$D/dir" && head -c 3000000 /dev/urandom > "$D/dir/a" && head -c 1000001 /dev/urandom > "$D/dir/b"

ok() { # description, command...
	d="$1"; shift
	if "$@" > "$D/out" 2> "$D/err"; then echo "ok   $d"; else echo "FAIL $d (exit $?)"; cat "$D/err"; fails=$((fails + 1)); fi
}
bad() { # description, expected text in stderr, command...
	d="$1"; want="$2"; shift 2
	"$@" > "$D/out" 2> "$D/err"; rc=$?
	if [ $rc -ne 0 ] && grep -q -- "$want" "$D/err" && [ "$(wc -l < "$D/err")" -le 2 ]; then echo "ok   $d: $(head -n1 "$D/err")"
	else echo "FAIL $d (exit $rc, stderr: $(cat "$D/err"))"; fails=$((fails + 1)); fi
}
has() { # description, text expected in the last stdout
	if grep -q -- "$2" "$D/out"; then echo "ok   $1"; else echo "FAIL $1: no '$2' in: $(cat "$D/out")"; fails=$((fails + 1)); fi
}

ok "version" "$S" version
ok "info" "$S" info --json
has "info names a backend" '"backend":"'
ok "info without CUDA" env SLUICE_GPU=0 "$S" info --json
has "json says why there is no GPU" '"gpu":-1,"gpu_name":"","gpu_unusable":"CUDA not loaded (SLUICE_GPU=0)"'
has "unusable names the GPU" '"unusable":"[^"]*gpu: CUDA not loaded'
ok "info text without CUDA" env SLUICE_GPU=0 "$S" info
has "text says why there is no GPU" '^gpu: none (CUDA not loaded (SLUICE_GPU=0))$'
has "text lists it under unusable" '^  gpu: CUDA not loaded (SLUICE_GPU=0); host memory only$'
if "$S" info --json > "$D/out" && grep -q '"gpu":-1' "$D/out"; then
	# No GPU on this machine: the reason is the driver's, never empty.
	has "no GPU here, and why" '"gpu_unusable":"[^"][^"]*"'
	"$S" info > "$D/out"
	has "no GPU here, in text" '^gpu: none ([^)]'
fi
# A wrong setting of any bytes: --settings --json is still JSON, the setting marked, and the exit says so (the list
# under "settings" beside the "error", as every failure of a --json command is an object with "error").
env SLUICE_THREADS="$(printf '\377\376"\\\001')" "$S" info --settings --json > "$D/out" 2> "$D/err"; rc=$?
if [ $rc -ne 0 ] && "$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert [s["name"] for s in d["settings"] if "error" in s] == ["SLUICE_THREADS"]
assert d["error"]["name"] == "SLUICE_EINVAL_CONFIG" and "SLUICE_THREADS" in d["error"]["detail"]' "$D/out"; then echo "ok   settings json with a wrong value"
else echo "FAIL settings json with a wrong value (exit $rc): $(cat "$D/out" "$D/err")"; fails=$((fails + 1)); fi
# What would be dropped without a word is said once: a SLUICE_* name that is no setting, a settings file not there.
env SLUICE_THREAD=4 SLUICE_CONFIG=/nonexistent/sluice.conf "$S" info > "$D/out" 2> "$D/err"
if [ "$(grep -c 'SLUICE_THREAD is not a setting' "$D/err")" = 1 ] && grep -q 'SLUICE_CONFIG names /nonexistent/sluice.conf, which is not there' "$D/err"
then echo "ok   unknown setting and absent settings file named"; else echo "FAIL unknown setting, absent file: $(cat "$D/err")"; fails=$((fails + 1)); fi
bad "a wrong value's control bytes escaped" 'de\\x01bug' env SLUICE_LOG="$(printf 'de\001bug')" "$S" info
if grep -q "$(printf '\001')" "$D/err"; then echo "FAIL a control byte reached stderr"; fails=$((fails + 1)); fi
bad "pack to an empty path" "empty" "$S" pack --from-jsonl "$D/f.bin" --fields a ""
ok "read host json verify" "$S" bench "$D/f.bin" --target host --json --verify --io-size 1M
has "read json has gb_s" '"gb_s":'
has "read verified" '"verified":true'
has "read path reported" '"path":"[a-z]*:'
ok "cold read" "$S" bench "$D/f.bin" --target host --cold --verify --json
has "cold read is direct" 'direct'
ok "psync path" "$S" bench "$D/f.bin" --target host --path psync --json
has "psync reported" '"path":"psync'
ok "pagecache path" "$S" bench "$D/f.bin" --target host --path pagecache --json
has "pagecache is buffered" 'buffered'
ok "randread" "$S" bench "$D/f.bin" --target host --rw randread --io-size 4K --size 1M --verify --json
has "randread iops" '"iops":'
ok "directory read" "$S" bench "$D/dir" --target host --verify --json
has "directory bytes" '"bytes":4000001'
ok "write verify" "$S" bench "$D/w.bin" --target host --rw write --size 3M --verify --json
has "write path" '"path":"host'
ok "randwrite" "$S" bench "$D/w.bin" --target host --rw randwrite --size 1M --io-size 4K --verify
ok "repeat and duration" "$S" bench "$D/f.bin" --target host --repeat 3 --duration 1 --json
if grep -Eq '"passes":([3-9]|[1-9][0-9]+),' "$D/out"; then echo "ok   three or more passes"; else echo "FAIL passes"; fails=$((fails + 1)); fi

# RLIMIT_MEMLOCK too small for io_uring's fixed buffers: a warning, then the same bytes.  Kernels that charge
# the rings themselves to it (the GPU machine's 6.18) cannot run io_uring at all there: --path uring then fails
# with an error naming the memlock limit, never half-way.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
	if sh -c "ulimit -l 64 && setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock '$S' bench '$D/f.bin' --target host --cold --verify --path uring" >"$D/out" 2>"$D/err"; then
		echo "ok   small RLIMIT_MEMLOCK degrades"
		if grep -q "RLIMIT_MEMLOCK" "$D/err" && [ "$(grep -c warn "$D/err")" = 1 ]; then echo "ok   one warning names RLIMIT_MEMLOCK"
		else echo "FAIL memlock warning: $(cat "$D/err")"; fails=$((fails + 1)); fi
	elif grep -q "memlock limit" "$D/err"; then echo "ok   small RLIMIT_MEMLOCK: io_uring refused, the error names the memlock limit"
	else echo "FAIL small RLIMIT_MEMLOCK: $(cat "$D/err")"; fails=$((fails + 1)); fi
	ok "info shows fixed buffers off" sh -c "ulimit -l 64 && setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock '$S' info"
	has "fixed buffers off" "fixed buffers: no"
else
	echo "skip small RLIMIT_MEMLOCK (needs root and setpriv)"
fi

bad "missing file" "nope.bin" "$S" bench "$D/nope.bin"
bad "unreadable file" "Permission denied\|cannot open" sh -c "chmod 000 '$D/f.bin'; if [ \$(id -u) = 0 ]; then echo 'sluice bench: cannot open (root reads anything; Permission denied)' >&2; exit 1; fi; '$S' bench '$D/f.bin'"
chmod 644 "$D/f.bin"
bad "size beyond end" "exceeds" "$S" bench "$D/f.bin" --size 1G
bad "nonsense size" "--size: 'lots'" "$S" bench "$D/f.bin" --size lots
bad "nonsense threads" "--threads: 'x'" "$S" bench "$D/f.bin" --threads x
bad "zero threads" "--threads: 0 is outside" "$S" bench "$D/f.bin" --threads 0
bad "bad io size" "--io-size" "$S" bench "$D/f.bin" --io-size 1000
bad "bad rw" "--rw: 'sideways'" "$S" bench "$D/f.bin" --rw sideways
bad "bad target" "--target: 'tpu'" "$S" bench "$D/f.bin" --target tpu
bad "bad path" "--path: 'warp'" "$S" bench "$D/f.bin" --path warp
bad "unknown option" "unknown option '--fast'" "$S" bench "$D/f.bin" --fast
bad "missing value" "--size needs a value" "$S" bench "$D/f.bin" --size
bad "no file" "no FILE" "$S" bench
bad "empty dir" "no non-empty regular files" sh -c "mkdir -p '$D/empty'; '$S' bench '$D/empty'"
bad "randwrite on short file" "smaller than --size" "$S" bench "$D/w.bin" --rw randwrite --size 1G
bad "bad env" "SLUICE_THREADS" env SLUICE_THREADS=many "$S" bench "$D/f.bin"
if [ "$("$S" info --json | grep -c '"gpu":-1')" = 1 ]; then
	bad "no GPU with --target gpu" "--target gpu" "$S" bench "$D/f.bin" --target gpu
fi
bad "unknown command" "unknown command" "$S" frobnicate

# Datasets: pack an ImageFolder tree, inspect it, verify it, find corruption.
mkdir -p "$D/imf/cat" "$D/imf/dog/deep"
for i in 1 2 3 4 5 6 7 8 9 10; do head -c $((i * 777)) /dev/urandom > "$D/imf/cat/c$i.jpg"; head -c $((i * 55)) /dev/urandom > "$D/imf/dog/deep/d$i.png"; done
ok "pack ImageFolder" "$S" pack --from-dir "$D/imf" --shard-size 16K --json "$D/ds"
has "pack counts files" '"records":20'
ok "inspect json" "$S" inspect --json "$D/ds"
has "inspect fields" '"name":"label","dtype":"i64"'
has "several shards" '"shards":[2-9]'
ok "record 11 (sorted: c1 c10 c2 .. c9, then d1 d10 ..)" "$S" inspect --record 11 "$D/ds"
want=$(head -c 16 "$D/imf/dog/deep/d10.png" | od -An -tx1 | tr -d ' \n')
if grep -q "^data	550	crc32c=[0-9a-f]* $want" "$D/out" && grep -q "^key	16	" "$D/out" && grep -q "^label	8	1$" "$D/out"; then echo "ok   record 11 holds dog/deep/d10.png's bytes, its key and label 1"
else echo "FAIL record 11: $(cat "$D/out")"; fails=$((fails + 1)); fi
ok "verify clean" "$S" verify "$D/ds"
has "verify says all good" "every CRC and bound checks out"
# Flip one byte of the first record's data (just past its 16-byte field table). XOR, so the
# byte always changes: writing a fixed value is a no-op when the random byte already holds it.
off=$((4096 + 16 + 10))
b=$(od -An -tu1 -j $off -N1 "$D/ds/shard-000000.sls" | tr -d ' ')
printf "\\$(printf %o $((b ^ 255)))" | dd of="$D/ds/shard-000000.sls" bs=1 seek=$off conv=notrunc status=none
[ "$(od -An -tu1 -j $off -N1 "$D/ds/shard-000000.sls" | tr -d ' ')" != "$b" ] || { echo "FAIL could not flip a byte"; fails=$((fails + 1)); }
"$S" verify "$D/ds" > "$D/out" 2> "$D/err"
if [ $? = 1 ]; then echo "ok   verify exits 1 on a bad record"; else echo "FAIL verify exit code"; fails=$((fails + 1)); fi
if grep -q "BAD record 0 (shard 0, offset 4096)" "$D/out"; then echo "ok   verify names record 0"; else echo "FAIL verify output: $(cat "$D/out")"; fails=$((fails + 1)); fi
bad "inspect --record of a corrupt record" "record 0" "$S" inspect --record 0 "$D/ds"
bad "pack into an existing dataset" "already holds a dataset" "$S" pack --from-dir "$D/imf" "$D/ds"
bad "pack of an empty tree" "no files to pack" sh -c "mkdir -p '$D/none'; '$S' pack --from-dir '$D/none' '$D/ds2'"
ok "pack makes OUT's missing parents" "$S" pack --from-dir "$D/imf" --json "$D/new/parent/ds"
has "pack into new parents" '"records":20'
# sluice journey --help needs neither numpy nor the library: a python3 with no packages at all.
if "$PYTHON" -m venv --without-pip "$D/bare" 2>/dev/null; then
	ok "journey --help without numpy" env SLUICE_PYTHON="$D/bare/bin/python3" "$S" journey --help
	has "journey's usage" "usage: sluice journey"
fi
if [ "$(id -u)" != 0 ]; then
	bad "unreadable input" "Permission denied" sh -c "chmod 000 '$D/imf/cat/c3.jpg'; '$S' pack --from-dir '$D/imf' '$D/ds3'"
	chmod 644 "$D/imf/cat/c3.jpg"
fi
# WebDataset written by Python's tarfile (an independent writer), read in place.
if command -v "$PYTHON" >/dev/null 2>&1; then
	"$PYTHON" - "$D/wds" <<'PY'
import io, os, sys, tarfile
os.makedirs(sys.argv[1])
for s in range(2):
    with tarfile.open(f"{sys.argv[1]}/shard-{s:06d}.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for j in range(4):
            for ext, data in (("png", bytes([s, j]) * (50 + j)), ("cls", str(j).encode())):
                key = ("d" * 120 + "/") * (j == 3) + f"s{s}_{j}"
                ti = tarfile.TarInfo(f"{key}.{ext}"); ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
PY
	ok "inspect a WebDataset directory" "$S" inspect --json "$D/wds"
	has "eight samples, two fields" '"records":8,'
	ok "sample 7 (GNU long name)" "$S" inspect --record 7 "$D/wds"
	if grep -q "^png	106	crc32c=[0-9a-f]* 01030103" "$D/out" && grep -q "^cls	1	" "$D/out"; then echo "ok   sample 7 holds tarfile's bytes"
	else echo "FAIL sample 7: $(cat "$D/out")"; fails=$((fails + 1)); fi
	ok "verify a WebDataset" "$S" verify "$D/wds"
	has "verify of a tar claims no CRCs" "every bound checks out (the format has no CRCs to check)"
	ok "pack a WebDataset into shards" "$S" pack --from "$D/wds" --json "$D/wds-packed"
	has "eight records from webdataset" '"records":8,.*"from_format":"webdataset"'
	ok "the packed sample 7" "$S" inspect --record 7 "$D/wds-packed"
	if grep -q "^png	106	crc32c=[0-9a-f]* 01030103" "$D/out"; then echo "ok   packed sample 7 is the same bytes"
	else echo "FAIL packed sample 7: $(cat "$D/out")"; fails=$((fails + 1)); fi
else
	echo "skip WebDataset cross-check (no $PYTHON)"
fi

bad "not a dataset" "index.sli" "$S" verify "$D/imf"
bad "inspect without a dataset" "no DATASET" "$S" inspect
bad "pack needs one source" "need one of" "$S" pack --from "$D/ds" --from-dir "$D/imf" "$D/x"

# JSON lines: types from the first line, errors naming file and line.
printf '%s\n' '{"text": "hello", "label": 3, "tokens": [1, 2, 3], "emb": [0.5, 1], "ok": true, "meta": {"a": 1}}' \
	'' '{"text": "world \u00e9", "label": -7, "tokens": [], "emb": [2, 3.25], "ok": false, "meta": [1]}' > "$D/in.jsonl"
ok "pack JSONL" "$S" pack --from-jsonl "$D/in.jsonl" --fields text,label,tokens,emb,ok,meta --json "$D/js"
has "two records" '"records":2'
ok "inspect JSONL fields" "$S" inspect --json "$D/js"
has "types inferred" '"name":"tokens","dtype":"i64","shape":\[-1\]},{"name":"emb","dtype":"f32","shape":\[-1\]},{"name":"ok","dtype":"u8"'
ok "JSONL record 1" "$S" inspect --record 1 "$D/js"
if grep -q "^label	8	-7$" "$D/out" && grep -q "^text	8	crc32c=[0-9a-f]* 776f726c6420c3a9$" "$D/out" && grep -q "^tokens	0	" "$D/out" && grep -q "^meta	3	" "$D/out"; then echo "ok   JSONL record 1 holds its values"
else echo "FAIL JSONL record 1: $(cat "$D/out")"; fails=$((fails + 1)); fi
ok "pack zstd" "$S" pack --from "$D/js" --zstd 5 --block-size 1M --quiet "$D/jsz"
ok "inspect zstd" "$S" inspect --json "$D/jsz"
has "codec reported" '"compression":"zstd"'
ok "verify zstd" "$S" verify "$D/jsz"
ok "zstd record 1" "$S" inspect --record 1 "$D/jsz"
has "zstd record 1 holds its value" "^label	8	-7$"
bad "zstd level" "--zstd.*1..22\|--zstd" "$S" pack --from "$D/js" --zstd 0 "$D/jsz2"
bad "block size without zstd" "needs --zstd" "$S" pack --from "$D/js" --block-size 2M "$D/jsz3"
bad "block size too small" "block size" "$S" pack --from "$D/js" --zstd 1 --block-size 64K "$D/jsz4"
printf '%s\n' '{"text": "a", "label": 1}' '{"text": "b", "label": "two"}' > "$D/bad1.jsonl"
bad "JSONL type change" "bad1.jsonl:2: record 1: field 'label' is bytes here, i64" "$S" pack --from-jsonl "$D/bad1.jsonl" --fields text,label "$D/js2"
printf '%s\n' '{"text": "a"}' '{"text": ' > "$D/bad2.jsonl"
bad "JSONL broken line" "bad2.jsonl:2:.*invalid JSON" "$S" pack --from-jsonl "$D/bad2.jsonl" --fields text "$D/js3"
bad "JSONL missing key" "field 'label' is missing" "$S" pack --from-jsonl "$D/bad2.jsonl" --fields text,label "$D/js4"
if [ -e "$D/js2/index.sli" ] || [ -e "$D/js3/index.sli" ]; then echo "FAIL a failed pack left a dataset"; fails=$((fails + 1)); else echo "ok   failed packs leave no dataset"; fi

# Token arrays: .npy written by hand (NumPy's format, version 1.0), and raw .bin.
if command -v "$PYTHON" >/dev/null 2>&1; then
	"$PYTHON" - "$D" <<'PY'
import struct, sys
def npy(path, descr, values, fmt, fortran="False", shape=None):
    shape = shape or f"({len(values)},)"
    h = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}"
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
d = sys.argv[1]
npy(f"{d}/tok.npy", "<u2", list(range(100, 110)), "H")
npy(f"{d}/len.npy", "<i8", [3, 0, 7], "q")
npy(f"{d}/badlen.npy", "<i8", [3, 8], "q")
npy(f"{d}/fortran.npy", "<u2", [1, 2], "H", fortran="True")
npy(f"{d}/twod.npy", "<u2", [1, 2], "H", shape="(1, 2)")
npy(f"{d}/bigend.npy", ">u2", [1, 2], "H")
open(f"{d}/tok32.bin", "wb").write(struct.pack("<6I", *range(6)))
open(f"{d}/len32.bin", "wb").write(struct.pack("<2q", 4, 2))
PY
	ok "pack tokens from .npy" "$S" pack --from-tokens "$D/tok.npy" --doc-lengths "$D/len.npy" --json "$D/tk"
	has "three documents of u16" '"records":3,"documents":3,"tokens":10,"dtype":"u16"'
	ok "document 2" "$S" inspect --record 2 "$D/tk"
	if grep -q "^tokens	14	crc32c=[0-9a-f]* 6700680069006a006b006c006d00$" "$D/out"; then echo "ok   document 2 holds tokens 103..109"
	else echo "FAIL document 2: $(cat "$D/out")"; fails=$((fails + 1)); fi
	ok "an empty document" "$S" inspect --record 1 "$D/tk"
	has "document 1 is empty" "^tokens	0	"
	ok "pack raw u32 tokens" "$S" pack --from-tokens "$D/tok32.bin" --dtype u32 --doc-lengths "$D/len32.bin" --json "$D/tk32"
	has "two u32 documents" '"records":2,"documents":2,"tokens":6,"dtype":"u32"'
	ok "pack tokens into rows" "$S" pack --from-tokens "$D/tok.npy" --doc-lengths "$D/len.npy" --pack-context 8 --json "$D/tkp"
	has "two rows of 8, 10 of 16 slots" '"records":2,"documents":3,"tokens":10,.*"packed_context":8,"fill":0.625000'
	ok "row 0" "$S" inspect --record 0 "$D/tkp"
	has "row 0 holds the 7-token document" "^cu_seqlens	8	crc32c=[0-9a-f]* 0000000007000000$"
	has "row 0 labels mask its first token" "^labels	32	crc32c=[0-9a-f]* 9cffffff680000006900000..."
	bad "greedy without a context" "needs --pack-context" "$S" pack --from-tokens "$D/tok.npy" --doc-lengths "$D/len.npy" --greedy "$D/tkq"
	bad "lengths that do not add up" "add up to 11 tokens, .*tok.npy holds 10" "$S" pack --from-tokens "$D/tok.npy" --doc-lengths "$D/badlen.npy" "$D/tk2"
	bad "Fortran-order .npy" "not in C order" "$S" pack --from-tokens "$D/fortran.npy" --doc-lengths "$D/len.npy" "$D/tk3"
	bad "two-dimensional .npy" "not one-dimensional" "$S" pack --from-tokens "$D/twod.npy" --doc-lengths "$D/len.npy" "$D/tk4"
	bad "big-endian .npy" "little-endian" "$S" pack --from-tokens "$D/bigend.npy" --doc-lengths "$D/len.npy" "$D/tk5"
	bad "tokens without lengths" "needs --doc-lengths" "$S" pack --from-tokens "$D/tok.npy" "$D/tk6"
fi

# A URL with credentials (a password in the userinfo, a presigned query) is named once, without them.
U='http://alice:PASSW0RD@127.0.0.1:1/sub/x?X-Amz-Signature=SIGSECRET'
for c in "cp $U $D/never" "inspect $U" "verify $U"; do
	# shellcheck disable=SC2086
	"$S" $c > "$D/out" 2> "$D/err"; rc=$?
	if [ $rc -ne 0 ] && ! grep -q 'PASSW0RD\|SIGSECRET' "$D/out" "$D/err" && grep -q 'alice:\*\*\*@127.0.0.1:1/sub/x' "$D/err" &&
	   [ "$(grep -o 'alice:\*\*\*@' "$D/err" | wc -l)" -eq 1 ]; then echo "ok   ${c%% *} names a URL once, without its credentials"
	else echo "FAIL ${c%% *} with a URL with credentials (exit $rc): $(cat "$D/err" "$D/out")"; fails=$((fails + 1)); fi
done

echo "t_cli: $fails failure(s)"
[ $fails -eq 0 ]
