"""The directories of src/ include one another only as their headers say (each header's "Depends on"), and in no
loop: the layers as this table gives them, kept equal to the code."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")

# Each directory and those it may include, as its header comment states them.
ALLOWED = {
    "core": set(),
    "store": {"core", "remote", "gpu"},
    "gpu": {"core"},
    "remote": {"core"},
    "diag": {"core", "store"},
    "engine": {"core", "store", "gpu", "diag"},
    "format": {"core", "store"},
    "xfer": {"core", "engine", "remote", "format"},
    "dsread": {"core", "engine", "format"},
    "image": {"core", "gpu"},
    "loader": {"core", "engine", "format", "gpu", "image", "diag", "dsread"},
    "pack": {"core", "format"},
}


def includes():
    """{directory: {directories its files include}} from the #include lines of src/."""
    got = {}
    for d in sorted(os.listdir(SRC)):
        if not os.path.isdir(os.path.join(SRC, d)):
            continue
        got[d] = set()
        for name in os.listdir(os.path.join(SRC, d)):
            with open(os.path.join(SRC, d, name), encoding="utf-8") as f:
                got[d] |= {m for m in re.findall(r'^#include "(\w+)/\w+\.h"', f.read(), re.M) if m != d}
    return got


def test_every_directory_is_in_the_table():
    assert set(includes()) == set(ALLOWED)


def test_includes_follow_the_layers():
    wrong = {d: sorted(uses - ALLOWED[d]) for d, uses in includes().items() if uses - ALLOWED[d]}
    assert not wrong, f"includes that the headers' dependency rules do not allow: {wrong}"


def test_the_layers_have_no_loop():
    done, on_path = set(), []

    def visit(d):
        assert d not in on_path, " -> ".join(on_path + [d])
        if d in done:
            return
        on_path.append(d)
        for u in ALLOWED[d]:
            visit(u)
        on_path.pop()
        done.add(d)

    for d in ALLOWED:
        visit(d)
