#!/bin/sh
# Makes the project's own Python environment: a virtual environment at $1
# (build/venv by default) with the packages of tests/requirements.txt from
# PyPI.  Every Python step of the Makefile runs its interpreter, so nothing
# depends on which python3 comes first on PATH, or on packages installed by
# hand for it.
#
# The environment is made from the first python3 on PATH that can make one
# (>= 3.9, with the venv module and ensurepip), else /usr/bin/python3; as root
# on Debian/Ubuntu, python3-venv is installed when no interpreter can.
set -e
V="${1:-build/venv}"
REQ="$(dirname "$0")/../tests/requirements.txt"
stamp="$V/.sluice-requirements"

# Up to date: made by this script from the same requirements.
if [ -x "$V/bin/python" ] && [ -f "$stamp" ] && cmp -s "$REQ" "$stamp"; then
	exit 0
fi

can_venv() {
	"$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 9))' 2>/dev/null
}

pick() {
	for py in "$(command -v python3 2>/dev/null)" /usr/bin/python3; do
		[ -n "$py" ] && [ -x "$py" ] && can_venv "$py" && { echo "$py"; return 0; }
	done
	return 1
}

if ! py=$(pick); then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "sluice: installing python3 python3-venv"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
		py=$(pick) || { echo "sluice: no python3 can make a virtual environment" >&2; exit 1; }
	else
		echo "sluice: no python3 (>= 3.9) with the venv module; install with: sudo apt-get install -y python3 python3-venv" >&2
		exit 1
	fi
fi

echo "sluice: making $V from $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
rm -rf "$V"
# PYTHONNOUSERSITE: packages in the user's site directory must not satisfy
# the requirements; the environment gets its own copies.
PYTHONNOUSERSITE=1 "$py" -m venv "$V"
PYTHONNOUSERSITE=1 "$V/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$REQ"
cp "$REQ" "$stamp"
