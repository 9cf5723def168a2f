#!/bin/sh
# Prepares, on this (CPU) machine, what the device tool carries to the GPU
# machine, which reaches no package registry.  Run from the repository root,
# as root on Debian bookworm; every output folder is git-ignored:
#
#   build/wheelhouse  the wheel (make wheel): the package, the `sluice`
#                command and every library they link; all that the Python
#                benchmarks and tests need of sluice
#   .carry/deps  Debian's -dev and runtime packages sluice builds with, for
#                the C test binaries and a source build
#                (liburing, isa-l, libarchive, jansson, zstd, curl, OpenSSL's libcrypto, expat, libmicrohttpd), unpacked
#                with dpkg -x; bench/gpu_machine.sh points pkg-config at them
#   .carry/fio   fio, built from Debian's source package without optional
#                engines, so it needs only libc, libm and libz there
#   .whl         the Python peers as wheels for CPython 3.12 (the GPU
#                machine's python3), fetched with the device README's
#                pip download command; WHEELS picks a subset by group
#
# Then: device run with carry ["build/wheelhouse", ".whl"] (and ".carry" for
# the C tests or fio) and a command that starts with `. bench/gpu_machine.sh`
# (installs the wheels; builds from source where .carry/deps came too).
set -e
[ -f include/sluice.h ] || { echo "run from the repository root" >&2; exit 1; }
WHEELS="${WHEELS:-engine datasets loaders s3 s3peers}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p .carry .whl
grep -qx '/.carry/' .gitignore && grep -qx '/.whl/' .gitignore

# 0. The wheel.
make wheel >/dev/null
echo "prepare: $(ls build/wheelhouse/sluice-*.whl) ($(du -sh build/wheelhouse | cut -f1))"

# 1. The build's Debian packages.
if [ ! -f .carry/deps/usr/include/webp/decode.h ]; then
	rm -rf .carry/deps
	(cd "$tmp" && apt-get download -q liburing-dev liburing2 libisal-dev libisal2 libarchive-dev libarchive13 \
		libjansson-dev libjansson4 libzstd-dev libzstd1 libcurl4-openssl-dev libcurl4 libexpat1-dev libexpat1 \
		libmicrohttpd-dev libmicrohttpd12 libssl-dev libssl3 \
		libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 libwebp-dev libwebp7 libwebpmux3 libwebpdemux2 \
		libssh2-1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db >/dev/null)
	for f in "$tmp"/*.deb; do dpkg -x "$f" .carry/deps; done
	# Shared libraries only (sluice links them so), and no docs: the carry holds 64 MiB in all.
	find .carry/deps -name "*.a" -delete && rm -rf .carry/deps/usr/share/doc .carry/deps/usr/share/man
	# Linked dynamically: libmicrohttpd's gnutls is the machine's own, and pkg-config would want gnutls.pc.
	sed -i '/^Requires.private:/d' .carry/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc
	sed -i '/^Requires.private:/d' .carry/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libpng16.pc # zlib: linked dynamically
	rm -f "$tmp"/*.deb
	echo "prepare: .carry/deps ($(du -sh .carry/deps | cut -f1))"
fi

# 2. fio from source (deb-src is not configured here: a list of our own).
if [ ! -x .carry/fio ]; then
	mkdir -p "$tmp/lists" "$tmp/src"
	printf 'deb-src http://deb.debian.org/debian bookworm main\n' > "$tmp/src.list"
	o="-o Dir::Etc::SourceList=$tmp/src.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$tmp/lists"
	apt-get $o update -qq
	(cd "$tmp/src" && apt-get $o source -qq --download-only fio >/dev/null && dpkg-source -q -x fio_*.dsc fio >/dev/null)
	(cd "$tmp/src/fio" && ./configure --disable-native --disable-optimizations >/dev/null &&
		sed -i 's/^CONFIG_LIBAIO=y/# &/' config-host.mak && make -s -j"$(nproc)" fio >/dev/null 2>&1)
	cp "$tmp/src/fio/fio" .carry/fio
	echo "prepare: .carry/fio ($(.carry/fio --version))"
fi

# 3. The peers' wheels (exact versions, so every session measures the same peers).
pyget() {
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
		--platform any -d .whl "$@"
}
for g in $WHEELS; do
	case $g in
	engine) pyget kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 rapids-logger==0.3.0 ;;
	datasets) pyget webdataset==1.0.2 braceexpand==0.1.7 ;;
	loaders) pyget mosaicml-streaming==0.13.0 brotli python-snappy cramjam zstd catalogue litdata==0.2.76 obstore==0.12.1 \
		boto3 botocore s3transfer==0.19.3 jmespath==1.1.0 ;;
	# The S3 test server (tests/remote/s3server.py) beside what the image has (werkzeug, jinja2, click, ...);
	# boto3, botocore, s3transfer and jmespath come with the loaders group.
	# crc32c gives moto real CRC32C checksums (the fault suite checks them).
	s3) pyget moto==5.2.5 cryptography==46.0.3 cffi==2.0.0 pycparser==2.23 xmltodict==1.0.2 responses==0.25.8 \
		flask==3.1.2 flask-cors==6.0.1 blinker==1.9.0 itsdangerous==2.2.0 py-partiql-parser==0.6.3 \
		crc32c==2.9.post0 ;;
	# What the S3 tests and benches need without the loaders group.
	boto) pyget boto3==1.44.5 botocore==1.44.5 s3transfer==0.19.3 jmespath==1.1.0 ;;
	# The checkpoint loaders of bench/ckpt_bench.py (issue #24) and what they need beside torch (about 11 MB;
	# safetensors 0.9 for its prefetch loader):
	# carry them in a .whl of their own (WHEELS=ckpt).
	ckpt) pyget fastsafetensors==0.5.0 typer==0.29.2 shellingham==1.5.4 rich==14.2.0 markdown-it-py==4.0.0 mdurl==0.1.2 \
		pygments==2.19.2 instanttensor==0.2.2 runai-model-streamer==0.16.1 humanize==4.17.0 safetensors==0.9.0rc1 ;;
	# nvCOMP for GPU decoding (the C library only: sluice loads libnvcomp.so.6 from it at run time). 30 MB:
	# carry it without the other groups (WHEELS=nvcomp in a .whl of its own).
	nvcomp) pyget nvidia-libnvcomp-cu13==6.0.0.12 ;;
	# The object-store peers of bench/s3_bench.py: s3torchconnector is published as source only (pure Python).
	s3peers) pyget s3torchconnectorclient==1.5.0
		python3 -m pip wheel -q --no-deps s3torchconnector==1.5.0 -w .whl ;;
	# A fast S3-compatible server for the read benchmark (bench/s3_bench.py beside
	# tests/remote/with_s3_server.py --alocals3): alocals3's static Rust server binary, from its wheel,
	# xz-compressed into .carry (3.5 MB); the command there unpacks it.
	s3server) pyget alocals3==0.11.2
		unzip -p .whl/alocals3-0.11.2-*.whl alocals3/bin/alocals3-server | xz -9 > .carry/alocals3-server.xz
		rm -f .whl/alocals3-0.11.2-*.whl ;;
	# Debian's nginx binary, in front of alocals3 in bench/s3_checksum_bench.py (it adds the checksum
	# headers alocals3 does not keep); it needs only libssl, libpcre2, libz and libcrypt, which the image has.
	nginx) (cd "$tmp" && apt-get download -q nginx >/dev/null && dpkg -x nginx_*.deb ngx && cp ngx/usr/sbin/nginx "$OLDPWD/.carry/nginx") ;;
	*) echo "prepare: unknown wheel group '$g' (engine, datasets, loaders, s3, boto, s3peers, ckpt, nvcomp, s3server, nginx)" >&2; exit 1 ;;
	esac
done
echo "prepare: .whl ($(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1)); carried size $(du -shc .carry .whl | tail -1 | cut -f1)"
