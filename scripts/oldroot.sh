#!/bin/sh
# A Debian 11 (bullseye) root to try the wheel in: glibc 2.31, Python 3.9, pip 20.3, made once per machine.
#
#   scripts/oldroot.sh PYTHON        prints the root's directory
#
# The wheel claims manylinux_2_28: it must install with an old system's own pip and run on its own glibc and
# loader, not this machine's.  Debian 11 is the oldest Debian the archive still serves (10, glibc 2.28, has
# left deb.debian.org).  debootstrap makes a minimal root (about 75 s, 46 MB of packages); numpy for its
# Python 3.9 is fetched here, by PYTHON's pip, because the root has no CA store to reach PyPI with.  Kept in
# $SLUICE_BUILD_CACHE (default /var/cache/sluice-build), outside the clone so CI's fresh clones share it.
# tests/python/test_wheel.py runs the wheel in it (chroot).  Not root: prints nothing, and that test skips.
set -e
PY="$1"
[ -n "$PY" ] || { echo "usage: scripts/oldroot.sh PYTHON" >&2; exit 2; }
CACHE="${SLUICE_BUILD_CACHE:-/var/cache/sluice-build}"
R="$CACHE/bullseye-1" # a new name whenever what goes into the root changes
[ -f "$R/.sluice-root" ] && { echo "$R"; exit 0; }
[ "$(id -u)" = 0 ] || { echo "oldroot: debootstrap and chroot need root; the wheel's old-system test skips" >&2; exit 0; }
mkdir -p "$CACHE"
exec 9>"$CACHE/lock.root"
flock 9
[ -f "$R/.sluice-root" ] && { echo "$R"; exit 0; }
rm -rf "$R"
echo "oldroot: debootstrap bullseye into $R" >&2
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip bullseye "$R" \
	http://deb.debian.org/debian >"$CACHE/bullseye.log" 2>&1 ||
	{ tail -20 "$CACHE/bullseye.log" >&2; exit 1; }
rm -f "$R"/var/cache/apt/archives/*.deb
mkdir -p "$R/wheels"
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.9 \
	--implementation cp --platform manylinux2014_x86_64 -d "$R/wheels" "numpy==2.0.2"
touch "$R/.sluice-root"
echo "$R"
