"""Faults of whole checkpoints, as a hostile user or a crash makes them: a file replaced between the header and
the data of one load (local, S3, http), kill -9 during a sharded save, indexes that promise what the shards do
not hold or name files elsewhere, small files whose server claims a terabyte, temporaries of killed saves, and
the errors and conventions a user trips on (torch.save files, variants, tied weights, strict).  No torch."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import sluice
import sluice.checkpoint as ck
from st_header import read_header

import webserver

OLD = {"a": np.full(1000, 1.0, np.float32), "b": np.arange(10, dtype=np.int64)}
# Another layout: a tensor ahead of "a", so the old header's offsets point at other bytes of the new file.
NEW = {"0pad": np.full(700, 9.0, np.float32), "a": np.full(1000, 4.0, np.float32), "b": np.arange(10, 20, dtype=np.int64)}


def same(a, b):
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


def one_of(got, *versions):
    """got is one of versions whole (never a mix); returns its index."""
    for i, v in enumerate(versions):
        if set(got) == set(v) and all(got[k].shape == v[k].shape and np.array_equal(got[k], v[k]) for k in v):
            return i
    raise AssertionError(f"a mix of versions: {({k: got[k][:3] for k in got})}")


def model(seed, n=12):
    rng = np.random.default_rng(seed)
    return {f"layers.{i}.w": rng.standard_normal((20 + seed, 16)).astype(np.float32) for i in range(n)}


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    if webserver.NGINX is None:
        pytest.skip("nginx is absent (scripts/deps.sh test installs nginx-light)")
    root = tmp_path_factory.mktemp("www")
    with webserver.WebServer(root, tmp_path_factory.mktemp("nginx")) as w:
        w.root = root
        yield w


def _replace_once(monkeypatch, phase, replace):
    """Runs replace() once, right after load's phase (a function of sluice.checkpoint) returns."""
    real, done = getattr(ck, phase), []

    def hooked(*a, **k):
        r = real(*a, **k)
        if not done:
            done.append(1)
            replace()
        return r
    monkeypatch.setattr(ck, phase, hooked)
    return done


# A file replaced between the header and the data of one load: one version whole, never the old header's offsets
# over the new bytes.

def test_a_file_replaced_between_header_and_data_local(tmp_path, monkeypatch):
    p = str(tmp_path / "ck.safetensors")
    sluice.save(OLD, p)
    done = _replace_once(monkeypatch, "_table", lambda: sluice.save(NEW, p))
    one_of(sluice.load(p, device="numpy"), OLD, NEW)
    assert done


def test_a_file_replaced_between_header_and_data_http(web, monkeypatch):
    p = str(web.root / "replaced.safetensors")
    sluice.save(OLD, p)
    done = _replace_once(monkeypatch, "_table", lambda: sluice.save(NEW, p))
    # The data's reads carry the ETag of the header's open: the change is seen (412), the load starts again.
    assert one_of(sluice.load(web.url("replaced.safetensors"), device="numpy"), OLD, NEW) == 1
    assert done


def test_a_file_replaced_between_header_and_data_s3(s3, monkeypatch):
    url = "s3://pytest/replaced/ck.safetensors"
    sluice.save(OLD, url)
    done = _replace_once(monkeypatch, "_table", lambda: sluice.save(NEW, url))
    assert one_of(sluice.load(url, device="numpy"), OLD, NEW) == 1
    assert done


def test_a_file_that_keeps_changing_is_a_clear_error(web, monkeypatch):
    """Replaced during every attempt: a bounded number of loads, then an error naming the file."""
    p = str(web.root / "churn.safetensors")
    sluice.save(OLD, p)
    real, n = ck._table, []

    def hooked(*a, **k):
        r = real(*a, **k)
        n.append(1)
        os.utime(p, (time.time() + len(n), time.time() + len(n)))  # a new mtime: a new ETag each time
        return r
    monkeypatch.setattr(ck, "_table", hooked)
    with pytest.raises(sluice.SluiceError, match="churn.safetensors.*changed") as e:
        sluice.load(web.url("churn.safetensors"), device="numpy")
    assert 1 < len(n) <= 5, (len(n), e.value)


@pytest.mark.parametrize("phase", ["_sources", "_table"])
def test_a_sharded_checkpoint_saved_again_during_a_load(tmp_path, monkeypatch, phase):
    """A sharded save into the directory while it is loaded, after its index was read or after its headers
    were: the old checkpoint whole or the new one, never shards of both."""
    d = str(tmp_path / "ck")
    a, b = model(1), model(2, n=7)
    sluice.save(a, d, max_shard_size=2000)
    done = _replace_once(monkeypatch, phase, lambda: sluice.save(b, d, max_shard_size=3000))
    one_of(sluice.load(d, device="numpy"), a, b)
    assert done


# Sharded saves: all or nothing.

def _shards(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))


def test_a_second_sharded_save_leaves_no_old_shards(tmp_path):
    d = tmp_path / "ck"
    sluice.save(model(1), str(d), max_shard_size=1500)
    first = _shards(d)
    sluice.save(model(2, n=5), str(d), max_shard_size=4000)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert _shards(d) == sorted(set(idx["weight_map"].values())) and not set(first) & set(_shards(d))
    assert not [n for n in os.listdir(d) if "sluice-tmp" in n]
    same(sluice.load(str(d), device="numpy"), model(2, n=5))
    # The names: Hugging Face's model-0000K-of-0000N, and the save's own mark.
    assert all(n.startswith("model-0000") and "-of-0000" in n for n in _shards(d)), _shards(d)


def test_a_sharded_save_over_a_hugging_face_one_removes_its_shards(tmp_path):
    """The shards the old index named go, whatever their names; files it did not name stay."""
    d = tmp_path / "ck"
    d.mkdir()
    old = model(3, n=4)
    sluice.save({k: old[k] for k in list(old)[:2]}, str(d / "model-00001-of-00002.safetensors"))
    sluice.save({k: old[k] for k in list(old)[2:]}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f"model-0000{1 + (i >= 2)}-of-00002.safetensors" for i, k in enumerate(old)}}))
    (d / "README.md").write_text("mine")
    same(sluice.load(str(d), device="numpy"), old)
    sluice.save(model(4), str(d), max_shard_size=3000)
    assert "model-00001-of-00002.safetensors" not in os.listdir(d) and "README.md" in os.listdir(d)
    same(sluice.load(str(d), device="numpy"), model(4))


@pytest.mark.parametrize("name", ["../outside.safetensors", "sub/inner.safetensors", "%2e%2e%2foutside.safetensors"])
def test_a_save_over_an_index_naming_files_elsewhere_removes_none_of_them(tmp_path, name):
    """The old index is read by the library's index rules (sluice_st_index_files): one naming a file outside the
    directory, or below it, is not a checkpoint's, and the save removes nothing it names."""
    d = tmp_path / "ck"
    (d / "sub").mkdir(parents=True)
    for f in (tmp_path / "outside.safetensors", d / "sub" / "inner.safetensors", d / "%2e%2e%2foutside.safetensors"):
        f.write_bytes(b"keep")
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {"w": name}}))
    sluice.save(model(5), str(d), max_shard_size=3000)
    assert (tmp_path / "outside.safetensors").read_bytes() == b"keep"
    assert (d / "sub" / "inner.safetensors").read_bytes() == b"keep"
    assert (d / "%2e%2e%2foutside.safetensors").read_bytes() == b"keep"
    same(sluice.load(str(d), device="numpy"), model(5))


# A child that saves A and B in turn into a directory, sharded, until it is killed (kill -9 at a random moment).
SAVER = """
import sys, numpy as np, sluice
d, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
def model(seed, n=12):
    rng = np.random.default_rng(seed)
    return {f"layers.{i}.w": rng.standard_normal((20 + seed, 16)).astype(np.float32) for i in range(n)}
ms = [model(s, n=12 - 5 * (s % 2)) for s in seeds]
print("ready", flush=True)
k = 0
while True:
    sluice.save(ms[k % len(ms)], d, max_shard_size=1500 + 700 * (k % 2))
    k += 1
"""


def kill_trials(d, trials, rng):
    """kill -9 a SAVER child at random moments; after each, the directory loads as A or B whole.  Returns the
    outcomes."""
    a, b = model(1, n=7), model(2, n=12)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(sluice.__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    seen = []
    for _ in range(trials):
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(d), "1", "2"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        time.sleep(rng.uniform(0, 0.3))
        child.kill()
        child.wait()
        seen.append("AB"[one_of(sluice.load(str(d), device="numpy"), a, b)])
    return seen


def test_killed_during_sharded_saves_old_or_new_never_a_mix(tmp_path):
    d = tmp_path / "ck"
    sluice.save(model(1, n=7), str(d), max_shard_size=1500)
    seen = kill_trials(d, 6, random.Random(37))
    assert set(seen) <= {"A", "B"}, seen
    sluice.save(model(5), str(d), max_shard_size=2000)  # the next save clears what the kills left
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert sorted(os.listdir(d)) == sorted([*set(idx["weight_map"].values()), "model.safetensors.index.json"])


# A child killed (SIGKILL) at the K-th rename of a sharded save into an empty directory: shards 1..K-1 in place.
KILLED_AT = """
import os, signal, sys, numpy as np, sluice
d, k = sys.argv[1], int(sys.argv[2])
real, n = os.replace, [0]
def replace(a, b):
    n[0] += 1
    if n[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)
    real(a, b)
os.replace = replace
rng = np.random.default_rng(2)
sluice.save({f"layers.{i}.w": rng.standard_normal((22, 16)).astype(np.float32) for i in range(12)}, d,
            max_shard_size=1500)
"""


@pytest.mark.parametrize("k", [2, 5, 12, 13])
def test_killed_during_a_first_sharded_save_is_not_a_partial_checkpoint(tmp_path, k):
    """Killed at the k-th rename of the first save into a directory (12 shards, then the index): what is
    there is refused, never loaded as a checkpoint of fewer tensors; killed after the index, it loads whole."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(sluice.__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    d = tmp_path / "ck"
    r = subprocess.run([sys.executable, "-c", KILLED_AT, str(d), str(k)], env=env, capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    if k <= 12:
        with pytest.raises(sluice.SluiceError, match="unfinished save"):
            sluice.load(str(d), device="numpy")
    else:
        assert len(sluice.load(str(d), device="numpy")) == 12


# Indexes: exactly the tensors they name, from files beside them.

def _index(d, wm):
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


def test_a_tensor_the_index_places_in_one_file_and_another_holds_too_is_an_error(tmp_path):
    """transformers reads each file of an index whole, so the last file's copy would win; which is meant is not
    the reader's guess."""
    sluice.save({"a": np.ones(3, np.float32), "b": np.zeros(2, np.int8)}, str(tmp_path / "s1.safetensors"))
    sluice.save({"a": np.full(3, 2, np.float32)}, str(tmp_path / "s2.safetensors"))
    _index(tmp_path, {"a": "s2.safetensors", "b": "s1.safetensors"})
    for call in (lambda: sluice.load(str(tmp_path), device="numpy"), lambda: ck._listing(str(tmp_path))):
        with pytest.raises(sluice.SluiceError, match=r"s1.safetensors: tensor 'a' is also in .*s2.safetensors, the "
                                                     r"file .*index.json names for it \(which copy is meant\?\)"):
            call()


def test_a_tensor_the_index_promises_and_no_shard_holds_is_an_error(tmp_path):
    sluice.save({"a": np.ones(3, np.float32)}, str(tmp_path / "s1.safetensors"))
    sluice.save({"b": np.ones(2, np.float32)}, str(tmp_path / "s2.safetensors"))
    _index(tmp_path, {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"})
    with pytest.raises(sluice.SluiceError, match=r"model.safetensors.index.json.*'b'.*'c'|model.safetensors"
                                                 r".index.json.*'c'.*'b'") as e:
        sluice.load(str(tmp_path), device="numpy")
    assert "s1.safetensors" in str(e.value) or "s2.safetensors" in str(e.value)
    _index(tmp_path, {})
    with pytest.raises(sluice.SluiceError, match="names no tensor"):
        sluice.load(str(tmp_path), device="numpy")


def test_tensors_the_index_does_not_name_are_not_loaded(tmp_path):
    sluice.save({"a": np.ones(3, np.float32), "extra": np.zeros(2, np.int8)}, str(tmp_path / "s1.safetensors"))
    _index(tmp_path, {"a": "s1.safetensors"})
    got = sluice.load(str(tmp_path), device="numpy")
    assert list(got) == ["a"]


@pytest.mark.parametrize("name", ["../secret.safetensors", "%2e%2e%2fsecret.safetensors", "%2E%2E/secret.safetensors",
                                  "sub%2fx.safetensors", "/etc/passwd", "..", "%2e%2e", "", "a\\..\\b", "x?y=1"])
def test_an_index_naming_anything_but_a_file_beside_it_is_refused(tmp_path, name):
    d = tmp_path / "ck"
    d.mkdir()
    sluice.save({"a": np.ones(3, np.float32)}, str(tmp_path / "secret.safetensors"))
    _index(d, {"a": name})
    with pytest.raises(sluice.SluiceError, match="not a file beside the index"):
        sluice.load(str(d), device="numpy")


def test_an_index_over_http_cannot_reach_outside_its_directory(web):
    (web.root / "ckx").mkdir()
    sluice.save({"a": np.full(3, 66, np.int8)}, str(web.root / "secret.safetensors"))
    _index(web.root / "ckx", {"a": "%2e%2e%2fsecret.safetensors"})
    with pytest.raises(sluice.SluiceError, match="not a file beside the index"):
        sluice.load(web.url("ckx/"), device="numpy")


@pytest.mark.parametrize("doc", ['{"weight_map": {"a": 5}}', '{"weight_map": ["a"]}', '{"weight_map": {"a": null}}',
                                 '[1, 2]', '{"nothing": 1}', '{"weight_map": {"a": "s.safetensors"}, "metadata": 3}',
                                 'not json', '\xff'])
def test_index_problems_are_errors_naming_the_index(tmp_path, doc):
    sluice.save({"a": np.ones(3, np.float32)}, str(tmp_path / "s.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(doc, errors="surrogateescape")
    with pytest.raises(sluice.SluiceError, match="model.safetensors.index.json"):
        sluice.load(str(tmp_path), device="numpy")


# Small files read whole (an index, DCP's metadata): a bounded size, a regular file.

def test_an_index_claiming_a_huge_size_is_refused_not_allocated(tmp_path, web):
    with open(tmp_path / "model.safetensors.index.json", "wb") as h:
        h.truncate(300 << 20)  # sparse: no disk used
    with pytest.raises(sluice.SluiceError, match=r"model.safetensors.index.json.*314572800 bytes"):
        sluice.load(str(tmp_path), device="numpy")
    (web.root / "huge").mkdir()
    with open(web.root / "huge" / "model.safetensors.index.json", "wb") as h:
        h.truncate(1 << 40)  # what the server's HEAD claims: 1 TB
    with pytest.raises(sluice.SluiceError, match=r"model.safetensors.index.json.*1099511627776 bytes"):
        sluice.load(web.url("huge/"), device="numpy")


def test_an_index_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    with pytest.raises(sluice.SluiceError, match="not a regular file"):
        sluice.load(str(tmp_path), device="numpy")


# Temporaries of killed saves.

KILLED_SAVE = """
import os, signal, sys, numpy as np, sluice
path, sharded = sys.argv[1], sys.argv[2] == "1"
real = os.replace
os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL) if b.endswith(sys.argv[3]) else real(a, b)
sluice.save({"x": np.ones(1 << 16, np.float32)}, path, max_shard_size=(1 << 20) if sharded else None)
"""


@pytest.mark.parametrize("sharded,at", [(False, ".safetensors"), (True, ".safetensors"), (True, ".json")])
def test_temporaries_of_killed_saves_are_reclaimed(tmp_path, sharded, at):
    """A save killed before its rename leaves its temporary; the next save there removes it (its writer is
    gone), and leaves a live writer's alone."""
    path = str(tmp_path / ("ck" if sharded else "ck.safetensors"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(sluice.__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", KILLED_SAVE, path, "1" if sharded else "0", at], env=env,
                           capture_output=True, timeout=120)
        assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    d = path if sharded else str(tmp_path)
    assert [n for n in os.listdir(d) if "sluice-tmp" in n]
    live = os.path.join(d, f".{'model.safetensors.index.json' if sharded else 'ck.safetensors'}.sluice-tmp-"
                           f"{ck._host()}-{os.getpid()}-999")
    open(live, "wb").close()
    sluice.save({"x": np.zeros(4, np.float32)}, path, max_shard_size=(1 << 20) if sharded else None)
    assert [n for n in os.listdir(d) if "sluice-tmp" in n] == [os.path.basename(live)]


# Errors and conventions.

def test_a_torch_save_file_is_named_as_such(tmp_path):
    p = tmp_path / "pytorch_model.bin"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 200)  # torch.save's zip
    with pytest.raises(sluice.SluiceError, match="pytorch_model.bin.*torch.save.*not safetensors"):
        sluice.load(str(p), device="numpy")
    # The legacy format: a pickle (protocol 2) of torch's magic number first.
    p.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03." + b"\0" * 64)
    with pytest.raises(sluice.SluiceError, match="pytorch_model.bin.*torch.save.*not safetensors"):
        sluice.load(str(p), device="numpy")


def test_save_writes_the_format_transformers_reads(tmp_path):
    sluice.save({"a": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"))
    assert read_header(str(tmp_path / "a.safetensors"))[0]["__metadata__"] == {"format": "pt"}
    sluice.save({"a": np.ones(2, np.float32)}, str(tmp_path / "b.safetensors"), metadata={"format": "np", "k": "v"})
    assert read_header(str(tmp_path / "b.safetensors"))[0]["__metadata__"] == {"format": "np", "k": "v"}
    sluice.save({"a": np.ones(2, np.float32)}, str(tmp_path / "sh"), max_shard_size=100)
    (f,) = _shards(tmp_path / "sh")
    assert read_header(str(tmp_path / "sh" / f))[0]["__metadata__"] == {"format": "pt"}


def test_a_directory_of_variants_is_a_choice_to_name(tmp_path):
    sluice.save({"a": np.ones(2, np.float32)}, str(tmp_path / "model.safetensors"))
    sluice.save({"a": np.ones(2, np.float16)}, str(tmp_path / "model.fp16.safetensors"))
    with pytest.raises(sluice.SluiceError, match=r"model.safetensors.*model.fp16.safetensors.*variant='fp16'"):
        sluice.load(str(tmp_path), device="numpy")
    assert sluice.load(str(tmp_path), device="numpy", variant="fp16")["a"].dtype == np.float16
    assert sluice.load(str(tmp_path / "model.safetensors"), device="numpy")["a"].dtype == np.float32
    with pytest.raises(sluice.SluiceError, match="bf16"):
        sluice.load(str(tmp_path), device="numpy", variant="bf16")
    # A sharded variant: its own index, model.safetensors.index.fp16.json, as transformers names it.
    d = tmp_path / "sh"
    d.mkdir()
    sluice.save({"a": np.ones(2, np.float32)}, str(d / "model.safetensors"))
    sluice.save({"a": np.ones(2, np.float16)}, str(d / "model.fp16-00001-of-00001.safetensors"))
    (d / "model.safetensors.index.fp16.json").write_text(json.dumps(
        {"weight_map": {"a": "model.fp16-00001-of-00001.safetensors"}}))
    assert sluice.load(str(d), device="numpy", variant="fp16")["a"].dtype == np.float16
    with pytest.raises(sluice.SluiceError, match="variant"):
        sluice.load(str(d), device="numpy")


def test_float8_fnuz_dtypes_are_read(tmp_path):
    import struct
    data = bytes(range(16))
    h = json.dumps({"x": {"dtype": "F8_E4M3FNUZ", "shape": [2, 4], "data_offsets": [0, 8]},
                    "y": {"dtype": "F8_E5M2FNUZ", "shape": [8], "data_offsets": [8, 16]}}).encode()
    (tmp_path / "f.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + data)
    got = sluice.load(str(tmp_path / "f.safetensors"), device="numpy")
    assert got["x"].tobytes() == data[:8] and got["y"].tobytes() == data[8:]


def test_into_follows_load_state_dicts_strict(tmp_path):
    """into= as torch's load_state_dict: strict (the default) names every missing and unexpected key in one
    error; strict=False loads what both have and reports the rest; tied tensors (one memory under two names,
    as lm_head.weight and embed.weight) are filled once and not missing when the checkpoint holds either."""
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    sluice.save({"embed.weight": emb, "norm": np.ones(3, np.float32), "old.bias": np.ones(2, np.float32)},
                str(tmp_path / "ck.safetensors"))
    shared = np.zeros((4, 3), np.float32)
    into = {"embed.weight": shared, "lm_head.weight": shared, "norm": np.zeros(3, np.float32),
            "new.bias": np.zeros(5, np.float32)}
    with pytest.raises(ValueError) as e:
        sluice.load(str(tmp_path / "ck.safetensors"), into=into)
    msg = str(e.value)
    assert "'new.bias'" in msg and "'old.bias'" in msg and "lm_head" not in msg and "ck.safetensors" in msg
    assert not shared.any()  # nothing read before the check
    rep = {}
    got = sluice.load(str(tmp_path / "ck.safetensors"), into=into, strict=False, report=rep)
    assert np.array_equal(shared, emb) and np.array_equal(into["norm"], np.ones(3)) and not into["new.bias"].any()
    assert rep["missing_keys"] == ["new.bias"] and rep["unexpected_keys"] == ["old.bias"]
    assert set(got) == {"embed.weight", "lm_head.weight", "norm"}
    # The tied pair with none of its names in the checkpoint: both missing.
    with pytest.raises(ValueError, match="'lm_head.weight'"):
        sluice.load(str(tmp_path / "ck.safetensors"), into={"lm_head.weight": shared, "tok": shared})


def _special(path, kind):
    """Makes at path a FIFO, a socket, a directory or a character device (as /dev/null's; skip where not root)."""
    import socket
    import stat
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s
    elif kind == "dir":
        os.mkdir(path)
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")


@pytest.mark.parametrize("kind", ["fifo", "socket", "dir", "device"])
def test_a_save_over_a_special_file_is_refused_naming_it(tmp_path, kind):
    """save and the small durable writes (an index, DCP's metadata) rename a temporary over their target: over a
    device, a FIFO, a socket or a directory that would replace it by a file, so it is refused, naming it."""
    import stat
    for write in (lambda p: sluice.save({"a": np.ones(4, np.float32)}, str(p)),
                  lambda p: ck._write_whole(str(p), b"{}")):
        p = tmp_path / f"target-{kind}"
        keep = _special(p, kind)
        mode = os.lstat(p).st_mode
        with pytest.raises(sluice.SluiceError, match=f"{p}: exists and is "):
            write(p)
        assert os.lstat(p).st_mode == mode and not stat.S_ISREG(mode)
        assert [n for n in os.listdir(tmp_path) if "sluice-tmp" in n] == []
        if keep:
            keep.close()
        os.rmdir(p) if kind == "dir" else os.unlink(p)


def test_json_nested_too_deeply_is_the_error_naming_the_file(tmp_path):
    """JSON nested deeper than Python's parser goes (a header, an index, DCP's metadata) is the usual error naming
    the file, not a bare RecursionError; and a sharded save over such an index still replaces it."""
    import struct
    deep = b'{"a":' + b"[" * 200000 + b"]" * 200000 + b"}"
    (tmp_path / "deep.safetensors").write_bytes(struct.pack("<Q", len(deep)) + deep)
    with pytest.raises(sluice.SluiceError, match="deep.safetensors: header is not JSON"):
        sluice.load(str(tmp_path / "deep.safetensors"), device="numpy")
    d = tmp_path / "ck"
    d.mkdir()
    (d / ck.INDEX).write_bytes(b'{"weight_map": {"w": "x.safetensors"}, "metadata":' + deep[5:])
    with pytest.raises(sluice.SluiceError, match="index.json: not a safetensors index: not JSON"):
        sluice.load(str(d), device="numpy")
    sluice.save(OLD, str(d), max_shard_size=1 << 20)
    same(sluice.load(str(d), device="numpy"), OLD)
    from sluice import _dcpmeta as dm
    with pytest.raises(dm.Damaged, match="ck/.metadata: damaged metadata"):
        dm.decode(dm.MAGIC + deep, "ck/.metadata")


def test_names_ending_in_a_newline_are_not_a_saves_files(tmp_path):
    """A name is a save's shard, temporary or DCP data file only as a whole ('$' also matches before a trailing
    newline): a user's file named so plus a newline survives the next save, and metadata naming one is damaged."""
    from sluice import _dcpmeta as dm
    shard = "model-00001-of-00001-0123456789ab.safetensors\n"
    tmp = f".{ck.INDEX}.sluice-tmp-{ck._host()}-999999999-0\n"
    for n in (shard, tmp):
        (tmp_path / n).write_bytes(b"a user's file")
    sluice.save(OLD, str(tmp_path), max_shard_size=1 << 20)
    assert (tmp_path / shard).read_bytes() == (tmp_path / tmp).read_bytes() == b"a user's file"
    d = {"tensors": {}, "bytes": ["b"], "items": [{"fqn": "b", "offset": None, "index": 0,
                                                   "file": "__0_0123456789ab.safetensors\n", "name": "b", "at": 0,
                                                   "length": 1}], "planner_data": None, "storage_meta": None}
    with pytest.raises(dm.Damaged, match="damaged metadata"):
        dm.decode(dm.encode(d), "ck/.metadata")


@pytest.mark.parametrize("tensors, metadata, error, match", [
    ({"__metadata__": np.ones(2, np.float32), "x": np.ones(2, np.float32)}, None, ValueError, "'__metadata__'"),
    ({1: np.ones(2, np.float32)}, None, TypeError, "tensor name 1 "),
    ({"x": np.ones(2, np.float32)}, {"format": None}, TypeError, "metadata 'format': None "),
    ({"x": np.ones(2, np.float32)}, {3: "a"}, TypeError, "metadata key 3 "),
    ({"x": np.ones(2, np.float32)}, {"a": [1]}, TypeError, r"metadata 'a': \[1\] "),
])
def test_save_refuses_names_and_metadata_the_format_cannot_hold(tmp_path, tensors, metadata, error, match):
    """A tensor named __metadata__ would be the file's metadata (a corrupt file); a name or a metadata key or
    value that is not a str was silently turned into one: each is refused, naming it, and nothing written."""
    for shard in (None, 1 << 20):
        with pytest.raises(error, match=match):
            sluice.save(tensors, str(tmp_path / "ck"), metadata=metadata, max_shard_size=shard)
        assert not (tmp_path / "ck").exists() or os.listdir(tmp_path / "ck") == []


def test_a_sharded_save_over_a_single_file_is_old_or_new(tmp_path, monkeypatch):
    """A sharded save that dies before its index, in a directory holding a single-file model.safetensors, left
    the old file and a whole set of new shards without an index: loaded together, a mix.  Such a directory is
    refused; and a finished sharded save removes the old model.safetensors (as transformers' save_pretrained
    removes stale weight files), so no tool reads the old weights beside the new."""
    sluice.save(OLD, str(tmp_path / "model.safetensors"))

    def killed(*a):
        raise KeyboardInterrupt("killed before the index")
    with monkeypatch.context() as m:
        m.setattr(ck, "_write_whole", killed)
        with pytest.raises(KeyboardInterrupt):
            sluice.save({"c": np.ones(300, np.float32), "d": np.ones(300, np.float32)}, str(tmp_path),
                        max_shard_size=1000)
    with pytest.raises(sluice.SluiceError, match="model.safetensors.*unfinished save"):
        sluice.load(str(tmp_path), device="numpy")
    sluice.save(NEW, str(tmp_path), max_shard_size=1000)
    assert not (tmp_path / "model.safetensors").exists()
    same(sluice.load(str(tmp_path), device="numpy"), NEW)
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors")) == sorted(
        set(json.loads((tmp_path / ck.INDEX).read_text())["weight_map"].values()))


def test_an_index_naming_a_missing_file_says_so_once(tmp_path, monkeypatch):
    """An index naming a shard that is not there (a typo, a partial download) is that error, naming the index and
    the file, after one load: a load starts again only where the index itself changed (a save replaced it)."""
    sluice.save({"w": np.ones(4, np.float32)}, str(tmp_path / "a.safetensors"))
    (tmp_path / ck.INDEX).write_text(json.dumps({"weight_map": {"w": "a.safetensors",
                                                                "v": "model-00002-of-00002.safetensors"}}))
    loads, real = [], ck._Open  # a load's opening of the checkpoint's files
    monkeypatch.setattr(ck, "_Open", lambda *a: loads.append(1) or real(*a))
    with pytest.raises(sluice.SluiceError) as e:
        sluice.load(str(tmp_path), device="numpy")
    assert e.value.code == -errno.ENOENT and len(loads) == 1
    assert f"{tmp_path / ck.INDEX}: names a file that is not there" in str(e.value)
    assert "model-00002-of-00002.safetensors" in str(e.value) and "changed" not in str(e.value)


@pytest.mark.parametrize("kw, error, match", [
    ({"shard": (0, 1.5, 2)}, TypeError, r"shard=\(0, 1.5, 2\)"),
    ({"shard": (True, 0, 2)}, TypeError, r"shard=\(True, 0, 2\)"),
    ({"shard": (0, 0)}, TypeError, r"shard=\(0, 0\)"),
    ({"shard": lambda name, shape: (0, "1", 2)}, TypeError, "shard= gives"),
    ({"keys": [None]}, TypeError, "keys= holds None"),
    ({"keys": [b"x"]}, TypeError, "keys= holds b'x'"),
    ({"into": [np.zeros(4, np.float32)]}, TypeError, "into= is a list"),
])
def test_loads_arguments_of_the_wrong_type_are_named(tmp_path, kw, error, match):
    """An argument of the wrong type is an error naming it, not numpy's or ctypes' (or a bool taken as a dim)."""
    sluice.save({"x": np.ones((4, 4), np.float32)}, str(tmp_path / "ck.safetensors"))
    with pytest.raises(error, match=match):
        sluice.load(str(tmp_path / "ck.safetensors"), device="numpy" if "into" not in kw else "cpu", **kw)


def test_a_device_that_needs_torch_says_so(tmp_path):
    try:
        import torch  # noqa: F401
        pytest.skip("torch is here: it judges the device itself")
    except ImportError:
        pass
    sluice.save({"x": np.ones(4, np.float32)}, str(tmp_path / "ck.safetensors"))
    with pytest.raises(ValueError, match="device='tpu' needs torch"):
        sluice.load(str(tmp_path / "ck.safetensors"), device="tpu")


def test_more_files_than_may_be_open_is_an_error_saying_so(tmp_path):
    """Every file of a checkpoint stays open from its open to its load's end: past the process's limit on open
    files, the error names the file, the count and the limit to raise (in a child process, its limit lowered)."""
    d = str(tmp_path / "ck")
    sluice.save({f"t{i}": np.full(2, i, np.float32) for i in range(300)}, d, max_shard_size=8)
    code = ("import resource, sys, sluice\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))\n"
            "try:\n    sluice.load(sys.argv[1], device='numpy')\nexcept sluice.SluiceError as e:\n"
            "    print(e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "Too many open files" in r.stdout and "300 files stay open" in r.stdout and "ulimit -n" in r.stdout
    assert ".safetensors" in r.stdout
