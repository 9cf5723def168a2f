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


def test_no_branch_on_a_scheme_outside_the_stores():
    """What a path is, the registry of stores says (store/store.h): no code outside src/store (and remote/, the
    transport; core/sys.c, which hides credentials in any URL) tests a path's scheme, so a new store is one file
    there.  The S3 Client of sluice.h and Python (bucket and key, S3 by design) builds s3:// names, not tests."""
    c_test = re.compile(r'(strn?(case)?cmp|strstr)\([^;]*"(s3|https?)?:?//|sl__is_s3_url\(')
    py_test = re.compile(r'startswith\([^)]*["\'](s3|https?)://')
    found = []
    for top, exempt in ((SRC, ("store", "remote", os.path.join("core", "sys.c"))), (os.path.join(ROOT, "cli"), ())):
        for d, _, names in os.walk(top):
            for n in names:
                p = os.path.join(d, n)
                if n.endswith((".c", ".h")) and not os.path.relpath(p, top).startswith(exempt):
                    with open(p, encoding="utf-8") as f:
                        found += [f"{os.path.relpath(p, ROOT)}: {line.strip()}" for line in f if c_test.search(line)]
    pkg = os.path.join(ROOT, "python", "sluice")
    for n in os.listdir(pkg):
        if n.endswith(".py") and n != "s3.py":  # s3.py: the S3 Client and ObjectFolder, S3 by design
            with open(os.path.join(pkg, n), encoding="utf-8") as f:
                found += [f"python/sluice/{n}: {line.strip()}" for line in f if py_test.search(line)]
    assert not found, "tests of a scheme outside src/store:\n" + "\n".join(found)
