#!/bin/sh
# The README's main job: generate a default data file and run sluice bench
# on it, into the GPU when there is one, host memory otherwise.
set -e
S="${1:-build/sluice}"
F="${SLUICE_DEMO_FILE:-/var/tmp/sluice-demo.bin}"
SIZE_MB="${SLUICE_DEMO_MB:-1024}"
if [ ! -f "$F" ] || [ "$(stat -c %s "$F")" -ne $((SIZE_MB * 1048576)) ]; then
	echo "generating $F ($SIZE_MB MiB of random data)"
	head -c $((SIZE_MB * 1048576)) /dev/urandom > "$F.tmp" && mv "$F.tmp" "$F"
fi
"$S" info
echo
echo "== cold read (O_DIRECT; the file evicted from the page cache, no other) =="
"$S" bench "$F" --cold --repeat 3 --verify
echo
echo "== warm read (page cache) =="
cat "$F" > /dev/null
"$S" bench "$F" --repeat 3
echo
echo "== durable write (temporary file, fdatasync, rename) =="
"$S" bench "$F.out" --rw write --size "${SIZE_MB}M" --repeat 3 --verify
rm -f "$F.out"
