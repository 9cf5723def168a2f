"""What users read says what the code does: the reference is the one generated from the header, each command's
--help and the Python package's docstrings (scripts/gen_reference.py); every example in the README and the guides
runs (Python, shell and C, and the programs in examples/); and no issue numbers (the project's own bookkeeping)
appear in them.

The README's examples and then every guide's, in the order the README lists the guides, run as one walk: in one
folder and one shell, each after the ones before it, as a reader copying them in order would run them, so a name
one example takes that another takes again fails (and so does an example that needs what no example before it
made). What a shell example exports the later ones see: the quickstart's lines that start a local S3 server (moto's)
and export the AWS_* variables pointing at it are what every later s3:// example runs against (on a free port in
place of its 9000, as tests run beside others). The names each example packs are also read, so the examples a
machine without a GPU skips are held to the same rule.

An example that needs a GPU or PyTorch says so in the line before its fence, `<!-- needs: gpu -->` or
`<!-- needs: torch -->`, and is skipped (reported as skipped) where there is none; everything else runs
everywhere. An example that needs more than the wheel (numpy its one dependency) says what to install on its first
line, `# pip install "sluice[images]"`: the extras it names are pyproject.toml's, and the modules it imports are
read against what that brings. The set-up commands, run in a checkout (`<!-- needs: checkout -->`), are what `make
test` and CI are already running: there each `make TARGET` is dry-run (the target exists and its recipe expands)
and each `pip install WHEEL` resolves the wheel without installing it (test_wheel installs and runs it); elsewhere
`pip install` resolves against what is installed, installing nothing (an example whose packages are not installed
here is skipped)."""
import functools
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SLUICE

# What users read; docs/BENCHMARKS.md is the benchmark log, a record kept by issue.
READ = [os.path.join(ROOT, "README.md")] + sorted(p for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                       recursive=True)
                                                  if not p.endswith("BENCHMARKS.md"))


def test_the_reference_is_generated_from_the_sources():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_reference.py"), "--check", SLUICE],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@functools.lru_cache(None)
def _have_gpu():
    import sluice
    if sluice.gpu_count() == 0:
        return False
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _needs(needs):
    assert needs in (None, "gpu", "torch", "checkout"), f"unknown need {needs!r}"
    if needs == "gpu" and not _have_gpu():
        pytest.skip("the example needs a GPU (and torch with CUDA)")
    if needs == "torch":
        pytest.importorskip("torch", reason="the example needs PyTorch")


# In a checkout: `make` dry-runs, `pip install` resolves its wheel without installing (77: it is not built).
CHECKOUT = f"""
make() {{ command make -n -C "{ROOT}" "$@" > /dev/null; }}
pip() {{
    [ "$1" = install ] || {{ echo "pip $1: not a set-up command" >&2; return 1; }}
    shift
    for w in "$@"; do [ -e "$w" ] || exit 77; done
    python3 -m pip install --dry-run --no-deps --no-index --quiet "$@"
}}
"""


def _base_env(tmp_path_factory):
    """What a user's shell has before the first example: the sluice these tests run (as `sluice`) and this
    interpreter (as `python3`), first on PATH, and the scripts of its environment after them, as an activated
    environment has them; a home of its own; no settings file and no AWS_* variables (an example that needs a store
    says how to start one)."""
    import sluice
    bin_dir = tmp_path_factory.mktemp("walk-bin")
    for name, target in (("sluice", os.path.abspath(SLUICE)), ("python3", sys.executable), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    path = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(sluice.__file__))),
                            os.environ.get("PYTHONPATH", "")])
    env = {k: v for k, v in os.environ.items()  # not the S3 test server's (conftest), which turns moto's auth on
           if not k.startswith(("AWS_", "SLUICE_TEST_S3")) and k != "INITIAL_NO_AUTH_ACTION_COUNT"}
    env.update(SLUICE_CONFIG="", PYTHONPATH=path, SLUICE_BIN=os.path.abspath(SLUICE),
               HOME=str(tmp_path_factory.mktemp("walk-home")),
               PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]))
    if env.get("SLUICE_LIB"):
        env["SLUICE_LIB"] = os.path.abspath(env["SLUICE_LIB"])
    return env


def _guides_in_order():
    """docs/guides/*.md in the order the README's "Learn more" lists them: the order a reader takes them."""
    readme = open(READ[0]).read()
    listed = re.findall(r"\(docs/guides/([\w-]+\.md)\)", readme[readme.index("## Learn more"):])
    return [os.path.join(ROOT, "docs", "guides", g) for g in dict.fromkeys(listed)]


def _walks():
    """The examples as readers run them: the README's and then every guide's in one folder and one shell, in
    order, as a user copying them would (so a name one example takes and another takes again fails, as it would for
    that user); each other document's in a folder of its own. [(walk, [(doc, lang, index, code, needs)])]"""
    guides = [READ[0]] + _guides_in_order()
    walks = [("guides", guides)] + [(os.path.relpath(p, ROOT), [p]) for p in READ if p not in guides]
    out = []
    for name, docs in walks:
        examples = [(doc, lang, i, code, needs) for doc in docs for lang, i, code, needs in _blocks(doc)]
        if examples:
            out.append((name, examples))
    return out


def _blocks(doc):
    """(lang, index among the document's blocks of that lang, code, needs) of its python, sh and c blocks, in
    document order (the generated reference's blocks are declarations, not examples)."""
    if os.sep + "reference" + os.sep in doc:
        return
    seen = {}
    for m in re.finditer(r"(?:<!-- needs: (\w+) -->\n)?```(python|sh|c)\n(.*?)```", open(doc).read(), re.S):
        lang = m.group(2)
        seen[lang] = seen.get(lang, -1) + 1
        yield lang, seen[lang], m.group(3), m.group(1)


WALKS = _walks()

# Outside a checkout, `pip install` resolves against what is installed here, installing nothing (77: it is not).
PIP_INSTALLED = """
pip() {
    [ "$1" = install ] || { echo "pip $1: not a set-up command" >&2; return 1; }
    shift
    python3 -m pip install --dry-run --no-index --quiet "$@" > /dev/null 2>&1 || exit 77
}
"""


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Walk:
    """One walk's folder and shell: the environment its shell examples have exported so far, the processes they
    left running (stopped when the session ends), and how many of its examples have run."""

    def __init__(self, name, env, folder):
        self.name, self.env, self.folder = name, env, folder
        self.done, self.failed, self.jobs, self.no_s3 = 0, [], [], None

    def run(self, doc, lang, code, needs, tmp):
        """Runs one example; returns (ok, output), or raises pytest's skip."""
        _needs(needs)
        if self.no_s3 and "s3://" in code:
            pytest.skip(f"an example before this one started the S3 server it uses, and could not here: {self.no_s3}")
        if lang == "python":
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                               cwd=self.folder, env=self.env)
            return r.returncode == 0, r.stderr[-3000:]
        if lang == "c":
            return self._c(code, tmp)
        if needs == "checkout":
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", CHECKOUT + code], capture_output=True,
                               text=True, timeout=300, cwd=ROOT, env=self.env)
            if r.returncode == 77:
                pytest.skip("the wheel is not built (make wheel)")
            return r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
        server = "moto_server" in code
        if server:  # the quickstart's port, 9000, made a free one: the tests run beside others
            assert "-p 9000" in code and ":9000" in code, "the S3 server's example names its port, 9000, twice"
            code = code.replace("9000", str(_free_port()))
        state = tmp / "state"
        # What it left running and exported, kept however it ends (a server it started is stopped at the end).
        keep = f"trap 'jobs -p > \"{state}.jobs\"; env -0 > \"{state}.env\"' EXIT"
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", f"{keep}\n{PIP_INSTALLED}\n{code}"],
                           capture_output=True, text=True, timeout=300, cwd=self.folder, env=self.env)
        if os.path.exists(f"{state}.jobs"):
            self.jobs += [int(p) for p in open(f"{state}.jobs").read().split()]
        if os.path.exists(f"{state}.env"):
            self.env = dict(kv.split("=", 1) for kv in open(f"{state}.env").read().split("\0") if "=" in kv)
            for k in ("_", "SHLVL", "PWD", "OLDPWD"):
                self.env.pop(k, None)
        if r.returncode == 77:
            if server:
                self.no_s3 = "moto[server] and crc32c are not installed"
            pytest.skip("what the example installs is not installed here")
        return r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])

    def _c(self, code, tmp):
        """Built with the machine's C compiler against include/sluice.h and the library these tests run."""
        import shutil
        import sluice
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            pytest.skip("no C compiler")
        lib = os.path.dirname(os.path.abspath(sluice._lib.lib._name))
        (tmp / "example.c").write_text(code)
        b = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"), "example.c",
                            "-o", "example", "-L", lib, "-lsluice", f"-Wl,-rpath,{lib}"],
                           capture_output=True, text=True, cwd=tmp)
        if b.returncode:
            return False, b.stderr[-3000:]
        r = subprocess.run([str(tmp / "example")], capture_output=True, text=True, timeout=300, cwd=self.folder,
                           env=self.env)
        return r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])


@pytest.fixture(scope="session")
def walks(tmp_path_factory):
    state = {}
    yield lambda name: state.setdefault(name, _Walk(name, _base_env(tmp_path_factory),
                                                    tmp_path_factory.mktemp(name.replace(os.sep, "-"))))
    import signal
    for w in state.values():
        for pid in w.jobs:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("walk,k", [pytest.param(name, k, id=f"{os.path.relpath(doc, ROOT)}:{lang}{i}")
                                    for name, examples in WALKS
                                    for k, (doc, lang, i, _, _) in enumerate(examples)])
def test_each_example_runs(walk, k, walks, tmp_path_factory):
    """Each in its walk's folder and shell, after the ones before it (run first if this one was picked alone):
    Python blocks as `python3 -c`, shell blocks under bash -e -o pipefail (every command must succeed; what they
    export, the next examples see), C blocks built and run. A name an earlier example of the walk took that this
    one takes again fails here as it would for a reader."""
    w = walks(walk)
    examples = dict(WALKS)[walk]
    while w.done <= k:
        doc, lang, i, code, needs = examples[w.done]
        w.done += 1
        try:
            ok, out = w.run(doc, lang, code, needs, tmp_path_factory.mktemp("example"))
        except pytest.skip.Exception:
            if w.done > k:
                raise
            continue
        if w.done <= k:  # an earlier one, run now because this one was picked alone
            if not ok:
                w.failed.append(f"{os.path.relpath(doc, ROOT)}:{lang}{i}")
            continue
        if not ok:
            w.failed.append(f"{os.path.relpath(doc, ROOT)}:{lang}{i}")
        assert ok, (out, f"examples of the walk that failed: {w.failed}")


def _python_of(lang, code):
    """The Python an example runs: a python block, and in a shell block each `python3 -c "..."` and each here
    document that parses as Python (a script it writes, as `cat > train.py <<'EOF'`)."""
    import ast
    if lang == "python":
        yield code
        return
    if lang != "sh":
        return
    found = [m.group(2) for m in re.finditer(r"python3? -c ([\"'])(.*?)(?<!\\)\1", code, re.S)]
    found += [m.group(2) for m in re.finditer(r"<<-?'?(\w+)'?\n(.*?)\n\1\n", code, re.S)]
    for py in found:
        try:
            ast.parse(py)
        except SyntaxError:
            continue
        yield py


def _packs(lang, code):
    """The outputs an example packs: (OUT, overwrite?) of each sluice.pack(OUT, ...) and `sluice pack ... OUT`."""
    import ast
    import shlex
    for py in _python_of(lang, code):
        for n in ast.walk(ast.parse(py)):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pack" and \
                    isinstance(n.func.value, ast.Name) and n.func.value.id == "sluice" and n.args and \
                    isinstance(n.args[0], ast.Constant):
                yield n.args[0].value, any(k.arg == "overwrite" and getattr(k.value, "value", False)
                                           for k in n.keywords)
    valued = {"--from-dir", "--from", "--from-jsonl", "--fields", "--from-tokens", "--doc-lengths", "--dtype",
              "--shard-size", "--threads", "--zstd", "--block-size", "--pack-context", "--from-parquet", "--from-hf"}
    for line in code.splitlines() if lang == "sh" else ():
        words = shlex.split(line.split(" #")[0]) if re.match(r"\s*(\w+=\S+\s+)*sluice pack\b", line) else []
        words = words[words.index("pack") + 1:] if words else []
        outs = [w for j, w in enumerate(words) if not w.startswith("-") and (j == 0 or words[j - 1] not in valued)]
        if outs:
            yield outs[-1], "--overwrite" in words


def test_no_example_packs_a_dataset_another_example_of_its_walk_made():
    """Read, not run, so the examples a machine without a GPU skips are held to it too: two examples of one walk
    (the README's and the guides' in one folder) that pack the same output fail for the reader who runs both, the
    second with "already holds a dataset", unless the second says overwrite."""
    for walk, examples in WALKS:
        made, again = {}, []
        for doc, lang, i, code, _ in examples:
            where = f"{os.path.relpath(doc, ROOT)}:{lang}{i}"
            for out, overwrite in _packs(lang, code):
                key = out.rstrip("/")
                if key in made and not overwrite:
                    again.append(f"{where} packs {out!r}, which {made[key]} packed")
                made.setdefault(key, where)
        assert not again, again
        assert len(made) >= 10, f"the walk {walk} packs only {sorted(made)}: is the reader of packs broken?"


def _canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _extras():
    """pyproject.toml's optional dependencies: {extra: [requirement]}."""
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    try:
        import tomllib
        return tomllib.loads(text)["project"].get("optional-dependencies", {})
    except ImportError:  # Python 3.9, 3.10: the table's simple form
        section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        return {m.group(1): re.findall(r'"([^"]+)"', m.group(2))
                for m in re.finditer(r"^([\w-]+)\s*=\s*\[(.*?)\]", section, re.M | re.S)}


def _installs(code):
    """What an example says to install: the sluice extras and the other packages (name, extras) of its
    `pip install ...` lines (a comment in a Python block, a command in a shell one)."""
    extras, others = set(), set()
    for line in re.findall(r"pip install ([^\n#]*)", code):
        for word in re.findall(r"\"[^\"]*\"|'[^']*'|\S+", line):
            if word.startswith("("):
                break  # a remark after the command
            word = word.strip("\"'")
            m = re.fullmatch(r"([A-Za-z0-9][\w.-]*)(?:\[([\w,.-]+)\])?(?:[<>=!~].*)?", word)
            if word.startswith("-") or not m:
                continue  # an option, or a path (a wheel)
            names = set(m.group(2).split(",")) if m.group(2) else set()
            if _canon(m.group(1)) == "sluice":
                extras |= names
            else:
                others.add((_canon(m.group(1)), frozenset(names)))
    return extras, others


def _requirement(text):
    """(name, extras, marker or None) of a requirement string."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    r = Requirement(text)
    return _canon(r.name), frozenset(r.extras), r.marker


def _closure(reqs):
    """The distributions installing reqs [(name, extras)] brings: theirs and, where they are installed here,
    their dependencies' (markers evaluated for this interpreter and the extras asked for)."""
    import importlib.metadata as md
    seen, todo = set(), list(reqs)
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            dep, dep_extras, marker = _requirement(text)
            if marker is None or any(marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append((dep, dep_extras))
    return {name for name, _ in seen}


# Import names whose distribution is named otherwise, for packages not installed here (installed ones are looked
# up in their metadata).
_DIST_OF = {"PIL": "pillow", "yaml": "pyyaml", "google": "protobuf"}


def _dists_of(module):
    import importlib.metadata as md
    try:
        found = md.packages_distributions().get(module)
    except AttributeError:  # Python 3.9
        found = None
    return {_canon(d) for d in found} if found else {_canon(_DIST_OF.get(module, module))}


def _needed(lang, code):
    """The top-level modules an example imports that are not the standard library's or sluice's, and the
    modules sluice imports for it (pyarrow for parquet= and hf=, their command-line forms)."""
    import ast
    mods = set()
    for py in _python_of(lang, code):
        for n in ast.walk(ast.parse(py)):
            if isinstance(n, ast.Import):
                mods |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                mods.add(n.module.split(".")[0])
    if re.search(r"\b(parquet|hf)=|--from-(parquet|hf)\b", code):
        mods.add("pyarrow")
    return {m for m in mods if m not in sys.stdlib_module_names and m not in ("sluice", "sluice_cmd")}


def _examples_to_install():
    """(where, lang, code) of every example, each program in examples/ too."""
    for _, examples in WALKS:
        for doc, lang, i, code, _ in examples:
            yield f"{os.path.relpath(doc, ROOT)}:{lang}{i}", lang, code
    for program in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        yield os.path.relpath(program, ROOT), "python", open(program).read()


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is Python 3.10's")
def test_each_example_says_what_to_install_for_what_it_imports():
    """On a machine with the wheel alone (numpy its one dependency) and what the example's `pip install` line
    names (sluice's extras, or other packages), every module the example imports is there."""
    extras = _extras()
    base = _closure([(_canon(r), frozenset()) for r in ("numpy",)])
    missing = []
    for where, lang, code in _examples_to_install():
        named, others = _installs(code)
        unknown = named - set(extras)
        assert not unknown, f"{where} names sluice extras that pyproject.toml lacks: {sorted(unknown)}"
        reqs = [_requirement(r)[:2] for e in named for r in extras[e]] + sorted(others)
        have = base | _closure(reqs)
        for mod in sorted(_needed(lang, code)):
            if not _dists_of(mod) & have:
                missing.append(f"{where} imports {mod}, which neither the wheel nor its `pip install` line "
                               f"({sorted(named) or 'none'}, {sorted(n for n, _ in others) or 'no others'}) brings")
    assert not missing, missing


def test_the_extras_the_docs_name_are_the_packages():
    """Every sluice extra that a `pip install` in the README, the docs or the example programs names, and every
    `sluice[EXTRA]` of the README's installing section, is one pyproject.toml has; that section names each."""
    extras = set(_extras())
    texts = {os.path.relpath(p, ROOT): open(p).read() for p in READ + glob.glob(os.path.join(ROOT, "examples", "*.py"))}
    install = texts["README.md"].split("## Install", 1)[1].split("\n## ", 1)[0]
    named = {(where, e) for where, text in texts.items() for e in _installs(text)[0]}
    named |= {("README.md, Install", e) for m in re.finditer(r"sluice\[([\w,.-]+)\]", install)
              for e in m.group(1).split(",")}
    assert {e for _, e in named} <= extras, sorted((w, e) for w, e in named if e not in extras)
    assert all(f"sluice[{e}]" in install for e in extras), (sorted(extras), install)


@pytest.mark.parametrize("program", sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))),
                         ids=os.path.basename)
def test_each_example_program_runs(program, tmp_path, tmp_path_factory):
    """The training programs in examples/ (they train on the GPU)."""
    _needs("gpu")
    r = subprocess.run([sys.executable, program, "--sluice", os.path.abspath(SLUICE)], capture_output=True,
                       text=True, timeout=600, cwd=tmp_path, env=_base_env(tmp_path_factory))
    assert r.returncode == 0, r.stderr[-3000:]


def test_no_issue_numbers_in_what_users_read():
    found = [f"{os.path.relpath(p, ROOT)}: {m}" for p in READ for m in re.findall(r"issues? #\d+", open(p).read())]
    assert not found, found
