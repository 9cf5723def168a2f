#!/bin/sh
# Installs the Debian packages sluice builds with (and with `test`, those
# its tests need), when run as root; otherwise prints the exact command.  Python's packages come from
# PyPI into the project's own environment instead (scripts/venv.sh).
need=""
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v cmake >/dev/null 2>&1 || need="$need cmake"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
pkg-config --exists liburing 2>/dev/null || need="$need liburing-dev"
pkg-config --exists libisal 2>/dev/null || need="$need libisal-dev"
pkg-config --exists libarchive 2>/dev/null || need="$need libarchive-dev"
pkg-config --exists jansson 2>/dev/null || need="$need libjansson-dev"
pkg-config --exists libzstd 2>/dev/null || need="$need libzstd-dev"
pkg-config --exists libcurl 2>/dev/null || need="$need libcurl4-openssl-dev"
pkg-config --exists libcrypto 2>/dev/null || need="$need libssl-dev"
pkg-config --exists expat 2>/dev/null || need="$need libexpat1-dev"
pkg-config --exists libmicrohttpd 2>/dev/null || need="$need libmicrohttpd-dev"
pkg-config --exists libjpeg 2>/dev/null || need="$need libjpeg62-turbo-dev"
pkg-config --exists libpng 2>/dev/null || need="$need libpng-dev"
pkg-config --exists libwebp 2>/dev/null || need="$need libwebp-dev"
command -v make >/dev/null 2>&1 || need="$need make"
# `deps.sh wheel` (and test, which builds the wheel): an assembler for isa-l's and libjpeg-turbo's SIMD code, as
# scripts/wheel_deps.sh builds them; a Debian 11 root for the wheel's test (scripts/oldroot.sh).
case "${1:-}" in test|wheel) command -v nasm >/dev/null 2>&1 || need="$need nasm" ;; esac
[ "${1:-}" = test ] && ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ] && need="$need debootstrap"
# `deps.sh test`: what only the tests need too (a headless browser opens sluice journey's report,
# a web server serves the http store's ranges).
[ "${1:-}" = test ] && ! command -v chromium >/dev/null 2>&1 && need="$need chromium"
[ "${1:-}" = test ] && ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] && need="$need nginx-light"
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "sluice: installing$need"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null || exit 1
else
	echo "sluice: missing$need; install with: sudo apt-get install -y$need" >&2
	exit 1
fi
