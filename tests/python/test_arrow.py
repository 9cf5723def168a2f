"""Parquet files and Hugging Face datasets packed into sluice shards (sluice.pack(parquet=), sluice.pack(hf=)),
held against the writing tools' own readers on the same data: pyarrow's read of the Parquet files, and the
datasets library's load_from_disk of what save_to_disk wrote (images and class labels included).  Every record
equals, column for column; what sluice has no type for, nulls, and files that are not what they say are refused
by name."""
import io
import json
import os

import numpy as np
import pytest

import sluice

pa = pytest.importorskip("pyarrow", reason="pyarrow (tests/requirements.txt)")
import pyarrow.parquet as pq  # noqa: E402

N = 1000


def _table(n, seed):
    rng = np.random.default_rng(seed)
    return pa.table({
        "text": [f"row {i} é {'x' * int(rng.integers(0, 40))}" for i in range(n)],
        "label": pa.array(rng.integers(-5, 5, n), pa.int64()),
        "small": pa.array(rng.integers(0, 200, n), pa.uint8()),
        "score": pa.array(rng.random(n), pa.float32()),
        "exact": pa.array(rng.random(n), pa.float64()),
        "tokens": pa.array([rng.integers(0, 50000, int(rng.integers(0, 30))).tolist() for _ in range(n)],
                           pa.list_(pa.int32())),
        "box": pa.array(rng.random((n, 4)).tolist(), pa.list_(pa.float32(), 4)),
        "flag": pa.array(rng.integers(0, 2, n).astype(bool)),
        "raw": pa.array([rng.bytes(int(rng.integers(0, 100))) for _ in range(n)], pa.binary()),
    })


def _same(ds, rows):
    """Every record of ds against pyarrow's rows (dicts), column for column."""
    assert len(ds) == len(rows)
    for i, want in enumerate(rows):
        got = ds[i]
        for k, v in want.items():
            g = got[k]
            if isinstance(v, str):
                assert bytes(g).decode() == v, (i, k)
            elif isinstance(v, bytes):
                assert bytes(g) == v, (i, k)
            elif isinstance(v, list):
                assert np.array_equal(g, np.array(v, dtype=g.dtype)), (i, k)
            else:
                assert np.ndim(g) == 0 and g == np.array(v, dtype=np.asarray(g).dtype), (i, k)  # a scalar


def test_parquet_files_pack_like_pyarrow_reads_them(tmp_path):
    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(_table(N, 1), src / "part-0.parquet", row_group_size=128)
    pq.write_table(_table(333, 2), src / "part-1.parquet", row_group_size=100)
    (src / "_SUCCESS").write_text("")
    rep = sluice.pack(str(tmp_path / "out"), parquet=str(src), shard_size=64 << 10)
    rows = pq.read_table(src / "part-0.parquet").to_pylist() + pq.read_table(src / "part-1.parquet").to_pylist()
    assert rep == {"records": N + 333, "from_format": "parquet", "bytes": sum(
        len(v.encode() if isinstance(v, str) else v) if isinstance(v, (str, bytes)) else
        4 * len(v) if k in ("tokens", "box") else {"label": 8, "small": 1, "score": 4, "exact": 8, "flag": 1}[k]
        for r in rows for k, v in r.items())}
    ds = sluice.Dataset(str(tmp_path / "out"))
    assert dict((n, (d, s)) for n, d, s in ds.fields) == {
        "text": ("bytes", ()), "label": ("i64", ()), "small": ("u8", ()), "score": ("f32", ()),
        "exact": ("f64", ()), "tokens": ("i32", (-1,)), "box": ("f32", (4,)), "flag": ("u8", ()),
        "raw": ("bytes", ())}
    rows = pq.read_table(src / "part-0.parquet").to_pylist() + pq.read_table(src / "part-1.parquet").to_pylist()
    _same(ds, rows)
    ids = sorted(int(i) for b in sluice.Loader(ds, 64, seed=1, rank=0, world_size=1, drop_last=True)
                 for i in b["ids"])
    assert len(ids) == len(set(ids)) == (N + 333) // 64 * 64


def test_a_saved_hugging_face_dataset_packs_like_datasets_loads_it(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets library (tests/requirements.txt)")
    from PIL import Image
    imgs = []
    for i in range(40):
        b = io.BytesIO()
        Image.fromarray(np.full((8 + i, 6, 3), i, np.uint8)).save(b, format="PNG")
        imgs.append({"bytes": b.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"]),
                                  "caption": datasets.Value("string"),
                                  "ids": datasets.Sequence(datasets.Value("int64"))})
    d = datasets.Dataset.from_dict({"image": imgs, "label": [i % 2 for i in range(40)],
                                    "caption": [f"a picture {i}" for i in range(40)],
                                    "ids": [list(range(i % 5)) for i in range(40)]}, features=features)
    d.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    rep = sluice.pack(str(tmp_path / "out"), hf=str(tmp_path / "saved"))
    assert rep["records"] == 40
    ds = sluice.Dataset(str(tmp_path / "out"))
    back = datasets.load_from_disk(str(tmp_path / "saved")).cast_column("image", datasets.Image(decode=False))
    for i in range(40):
        want = back[i]
        assert bytes(ds[i]["image"]) == want["image"]["bytes"] and int(ds[i]["label"]) == want["label"]
        assert bytes(ds[i]["caption"]).decode() == want["caption"] and ds[i]["ids"].tolist() == want["ids"]
    assert ds.metadata["features"]["label"]["names"] == ["cat", "dog"]


def test_arrow_cache_files_pack_too(tmp_path):
    """A datasets cache file is an Arrow stream; a directory of them packs in name order."""
    t = _table(50, 3)
    for k, part in enumerate((t.slice(0, 20), t.slice(20))):
        with pa.OSFile(str(tmp_path / f"cache-{k}.arrow"), "wb") as f, pa.ipc.new_stream(f, part.schema) as w:
            w.write_table(part)
    sluice.pack(str(tmp_path / "out"), hf=str(tmp_path))
    _same(sluice.Dataset(str(tmp_path / "out")), t.to_pylist())


@pytest.mark.parametrize("case,words", [
    ("uint64", "column 'big' of type uint64"),
    ("nested", "column 'deep'"),
    ("null", "row 7, column 'text': null"),
    ("null_in_list", "column 'tokens': a list holds a null"),
    ("not_parquet", "not a Parquet file"),
])
def test_what_sluice_cannot_store_is_refused_by_name(tmp_path, case, words):
    p = tmp_path / "x.parquet"
    if case == "uint64":
        pq.write_table(pa.table({"big": pa.array([1, 2], pa.uint64())}), p)
    elif case == "nested":
        pq.write_table(pa.table({"deep": pa.array([[[1]], [[2, 3]]], pa.list_(pa.list_(pa.int32())))}), p)
    elif case == "null":
        pq.write_table(pa.table({"text": [f"r{i}" if i != 7 else None for i in range(10)]}), p)
    elif case == "null_in_list":
        pq.write_table(pa.table({"tokens": pa.array([[1, None]], pa.list_(pa.int32()))}), p)
    else:
        p.write_bytes(b"PAR1 not really")
    with pytest.raises(sluice.SluiceError, match=words):
        sluice.pack(str(tmp_path / "out"), parquet=str(p))
    assert not os.path.exists(tmp_path / "out" / "index.sli")  # nothing half-written opens as a dataset


def test_a_state_json_pointing_outside_is_refused(tmp_path):
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../../etc/passwd"}]}))
    with pytest.raises(sluice.SluiceError, match="outside the dataset's directory"):
        sluice.pack(str(tmp_path / "out"), hf=str(tmp_path / "saved"))
    # Nor by a link whose name is inside
    t = pa.table({"n": pa.array(range(5), pa.int64())})
    with pa.OSFile(str(tmp_path / "elsewhere.arrow"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        w.write_table(t)
    os.symlink(tmp_path / "elsewhere.arrow", tmp_path / "saved" / "data.arrow")
    (tmp_path / "saved" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))
    with pytest.raises(sluice.SluiceError, match="outside the dataset's directory"):
        sluice.pack(str(tmp_path / "out"), hf=str(tmp_path / "saved"))


def test_files_whose_columns_differ_are_named_with_the_difference(tmp_path):
    """Nullability alone is no difference (a null is refused row by row); a type is, named with both files."""
    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int64()), "s": ["x", "y"]}), d / "0.parquet")
    pq.write_table(pa.table({"a": pa.array([3], pa.int64()), "s": ["z"]},
                            schema=pa.schema([pa.field("a", pa.int64(), nullable=False), ("s", pa.string())])),
                   d / "1.parquet")
    assert sluice.pack(str(tmp_path / "out"), parquet=str(d))["records"] == 3
    pq.write_table(pa.table({"a": pa.array([4], pa.int32()), "s": ["w"]}), d / "2.parquet")
    with pytest.raises(sluice.SluiceError, match=r"2.parquet: row 3 .*0.parquet's \(column 'a' is int32 here, int64"):
        sluice.pack(str(tmp_path / "out2"), parquet=str(d))


def test_a_damaged_file_among_several_is_named(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    t = pa.table({"text": [f"row {i} " * 20 for i in range(2000)]})
    pq.write_table(t, d / "a.parquet")
    pq.write_table(t, d / "b.parquet", compression="snappy")
    raw = bytearray((d / "b.parquet").read_bytes())
    raw[200:400] = bytes(200)  # inside the first data page, past the header
    (d / "b.parquet").write_bytes(bytes(raw))
    with pytest.raises(sluice.SluiceError, match="b.parquet: not a Parquet file sluice reads"):
        sluice.pack(str(tmp_path / "out"), parquet=str(d))
    assert not os.path.exists(tmp_path / "out" / "index.sli")


@pytest.mark.parametrize("names,words", [(["x\0a"], "without '/' or NUL"), (["c", "c"], "'c' appears twice"),
                                         ([""], "1-255 bytes"), (["a/b"], "without '/'")])
def test_column_names_sluice_cannot_keep_are_refused_naming_the_file(tmp_path, names, words):
    p = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1]) for _ in names], names=names), p)
    with pytest.raises(sluice.SluiceError, match=f"x.parquet: column .*{words}"):
        sluice.pack(str(tmp_path / "out"), parquet=str(p))


def test_a_dataset_dict_asks_for_one_split_and_urls_are_not_read(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets library (tests/requirements.txt)")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"n": [1, 2]}),
                          "test": datasets.Dataset.from_dict({"n": [3]})}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(sluice.SluiceError, match="a DatasetDict .*splits: test, train"):
        sluice.pack(str(tmp_path / "out"), hf=str(tmp_path / "dd"))
    assert sluice.pack(str(tmp_path / "out"), hf=str(tmp_path / "dd" / "train"))["records"] == 2
    with pytest.raises(sluice.SluiceError) as e:
        sluice.pack(str(tmp_path / "out2"), parquet="https://user:secret@example.com/x.parquet?X-Amz-Signature=s")
    assert "not URLs" in str(e.value) and "secret" not in str(e.value)


def test_a_null_inside_a_fixed_size_list_is_refused(tmp_path):
    p = tmp_path / "x.parquet"
    pq.write_table(pa.table({"box": pa.array([[1, 2], [3, None]], pa.list_(pa.int32(), 2))}), p)
    with pytest.raises(sluice.SluiceError, match="column 'box': a list holds a null"):
        sluice.pack(str(tmp_path / "out"), parquet=str(p))


def test_an_arrow_stream_cut_short_is_refused_not_packed_in_part(tmp_path):
    t = pa.table({"n": pa.array(range(100), pa.int64())})
    src, ends = tmp_path / "data-00000-of-00001.arrow", []
    with pa.OSFile(str(src), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        for b in t.to_batches(max_chunksize=10):
            w.write_batch(b)
            ends.append(f.tell())
    os.truncate(src, ends[2])  # three whole batches of ten, no end-of-stream marker
    with pytest.raises(sluice.SluiceError, match="cut short"):
        sluice.pack(str(tmp_path / "out"), hf=str(src))


def test_special_files_are_refused_not_read(tmp_path):
    d = tmp_path / "saved"
    d.mkdir()
    os.mkfifo(d / "state.json")
    with pytest.raises(sluice.SluiceError, match="not a regular file"):
        sluice.pack(str(tmp_path / "out"), hf=str(d))
    with pytest.raises(sluice.SluiceError, match="not a regular file"):
        sluice.pack(str(tmp_path / "out2"), parquet="/dev/zero")


def test_the_command_packs_parquet_and_hugging_face_datasets_too(tmp_path):
    """`sluice pack --from-parquet` / `--from-hf`: the same packing, run by the command with SLUICE_PYTHON; its
    options checked, its report printed, a missing source named."""
    import subprocess
    import sys
    from conftest import SLUICE
    pq.write_table(_table(300, 3), tmp_path / "t.parquet", row_group_size=64)
    env = {**os.environ, "SLUICE_PYTHON": sys.executable}
    r = subprocess.run([SLUICE, "pack", "--from-parquet", str(tmp_path / "t.parquet"), "--zstd", "3",
                        "--block-size", "2M", "--json", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["records"] == 300 and rep["from_format"] == "parquet" and rep["bytes"] > 0
    r = subprocess.run([SLUICE, "pack", "--json", "--from-dir", str(tmp_path / "nodir"), str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60, env=env)  # the C command's report: same keys
    (tmp_path / "tree" / "cat").mkdir(parents=True)
    (tmp_path / "tree" / "cat" / "a.jpg").write_bytes(b"x")
    r = subprocess.run([SLUICE, "pack", "--json", "--from-dir", str(tmp_path / "tree"), str(tmp_path / "outdir")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and set(json.loads(r.stdout)) == set(rep), r.stdout + r.stderr
    # The current directory is not searched for modules: a numpy.py beside the data does not run.
    (tmp_path / "numpy.py").write_text("raise SystemExit('the numpy.py of the current directory ran')\n")
    here = {**env, "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p)}
    if env.get("SLUICE_LIB"):
        here["SLUICE_LIB"] = os.path.abspath(env["SLUICE_LIB"])
    r = subprocess.run([os.path.abspath(SLUICE), "pack", "--from-parquet", "t.parquet", "out4"], capture_output=True,
                       text=True, timeout=120, env=here, cwd=tmp_path)
    assert r.returncode == 0 and "ran" not in r.stderr, r.stderr
    (tmp_path / "numpy.py").unlink()
    _same(sluice.Dataset(str(tmp_path / "out")), pq.read_table(tmp_path / "t.parquet").to_pylist())
    r = subprocess.run([SLUICE, "pack", "--from-hf", str(tmp_path / "none"), str(tmp_path / "out2")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "none" in r.stderr and not (tmp_path / "out2").exists(), r.stderr
    r = subprocess.run([SLUICE, "pack", "--from-parquet", str(tmp_path / "t.parquet"), "--fields", "a",
                        str(tmp_path / "out3")], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "--from-parquet takes only" in r.stderr, r.stderr
