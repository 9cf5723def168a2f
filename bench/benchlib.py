"""Helpers the benchmark scripts share (they run as `python3 bench/NAME.py`, so this imports as benchlib)."""
import os


def drop_caches():
    """Cold: writes back dirty pages and drops the page cache (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def warm(path):
    """Warm: reads path (a file, or every file under a directory) through the page cache."""
    files = [path] if os.path.isfile(path) else [os.path.join(r, x) for r, _, fs in os.walk(path) for x in fs]
    buf = bytearray(64 << 20)
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
