"""A stranger's attacks on the loader's stage table through Python (issue 54): images decoded by the CPU beside other
fields (a variable-size key, a label) with records refused under skip_corrupt, batches every record of which is
refused, the last short batch, two ranks, resume, the stage's field not first among those loaded, the CUDA counts
of a CPU loader, and bad SLUICE_IMAGE_DECODERS / SLUICE_IMAGE_PRODUCERS from the environment and the settings file.
Each image is one solid colour that names its record, so a row of any field that belongs to another record shows."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import sluice

BIN = os.environ.get("SLUICE_BIN", "build/sluice")
N = 23
BAD = {3, 4, 5, 11, 22}  # 3-5: a whole batch of 3 (shuffle off); 22: in the last, short batch


def _colour(i):
    return (i * 10 % 256, 255 - i * 10 % 256, i * 7 % 256)


def _png(i):
    b = io.BytesIO()
    Image.fromarray(np.full((9 + i, 13, 3), _colour(i), np.uint8)).save(b, "PNG")
    return b.getvalue()


def _bad(i):
    return [b"", b"not an image", _png(i)[:40], _png(i)[:-20], b"\x89PNG\r\n\x1a\n" + b"\0" * 30][i % 5]


def _pack(root, classes, *extra):
    src = root / "src"
    for i in range(N):
        p = src / f"{i % classes}" / f"{i:03d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_bad(i) if i in BAD else _png(i))
    subprocess.run([BIN, "pack", "--from-dir", str(src), "--all-files", "--quiet", *extra, str(root / "ds")], check=True)
    ds = sluice.Dataset(str(root / "ds"))
    # record id -> the file's number, its key and label as the dataset stores them
    truth = {}
    for r in range(len(ds)):
        key = bytes(ds[r]["key"])
        truth[r] = (int(key.decode().rsplit("/", 1)[-1][:3]), key, int(np.asarray(ds[r]["label"]).reshape(-1)[0]))
    return ds, truth


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory):
    return _pack(tmp_path_factory.mktemp("two"), 2)


@pytest.fixture(scope="module")
def zstd_classes(tmp_path_factory):
    """The same in zstd blocks: a window stage (zstd, by the CPU) before the field stage (images)."""
    return _pack(tmp_path_factory.mktemp("zstd"), 2, "--zstd", "3")


@pytest.fixture(scope="module")
def one_class(tmp_path_factory):
    ds, truth = _pack(tmp_path_factory.mktemp("one"), 1)
    assert [truth[r][0] for r in range(N)] == list(range(N))  # record r is file r
    return ds, truth


IM = sluice.Images("data", size=(4, 5), mode="resize", dtype="u8", decode="cpu")


def _rows(b):
    """[(id, colour, key, label)] of a numpy batch, key cut out of its (data, offsets)."""
    kd, ko = b["key"]
    assert b["data"].shape == (len(b.ids), 3, 4, 5) and b["label"].shape[0] == len(b.ids) and len(ko) == len(b.ids) + 1
    out = []
    for j, rid in enumerate(b.ids):
        px = b["data"][j]
        assert (px == px[:, :1, :1]).all(), "a solid image came out mixed"
        out.append((int(rid), tuple(int(c) for c in px[:, 0, 0]), bytes(kd[ko[j]:ko[j + 1]]), int(b["label"][j])))
    return out


def _check(rows, truth):
    for rid, colour, key, label in rows:
        i, tkey, tlabel = truth[rid]
        assert i not in BAD, (rid, i)
        assert colour == _colour(i) and key == tkey and label == tlabel, (rid, i, colour, key, label)


@pytest.mark.parametrize("fields", [None, ["label", "key", "data"]])
@pytest.mark.parametrize("packed", ["two_classes", "zstd_classes"])
def test_refused_images_leave_every_field_aligned(request, packed, fields):
    ds, truth = request.getfixturevalue(packed)
    ld = sluice.Loader(ds, numpy=True, batch_size=4, shuffle=True, seed=5, images=IM, skip_corrupt=True, fields=fields)
    rows = [r for b in ld for r in _rows(b)]
    _check(rows, truth)
    assert sorted(r[0] for r in rows) == sorted(r for r in truth if truth[r][0] not in BAD)
    st = ld.stats()
    assert st["skipped"] == len(BAD), st
    assert (st["images_gpu"], st["nvjpeg_calls"], st["cuda_calls_producers"], st["cuda_calls_consumer"]) == (0,) * 4
    assert st["images_cpu"] >= N - len(BAD), st


def test_a_batch_whose_every_image_is_refused_is_not_delivered(one_class):
    ds, truth = one_class
    ld = sluice.Loader(ds, numpy=True, batch_size=3, shuffle=False, images=IM, skip_corrupt=True)
    got = [_rows(b) for b in ld]
    for rows in got:
        _check(rows, truth)
    assert [len(r) for r in got] == [3, 3, 2, 3, 3, 3, 1], [len(r) for r in got]  # 3-5 gone; 21 alone at the end
    assert [r[0] for rows in got for r in rows] == [i for i in range(N) if i not in BAD]
    # without skip_corrupt the first bad record fails its batch, naming the dataset, record and field
    ld = sluice.Loader(ds, numpy=True, batch_size=3, shuffle=False, images=IM)
    it = iter(ld)
    _check(_rows(next(it)), truth)
    with pytest.raises(sluice.SluiceError, match=r"record 3: field 'data'"):
        next(it)


def test_two_ranks_take_the_same_steps_and_share_the_good_records(one_class):
    ds, truth = one_class
    per = []
    for rank in (0, 1):
        ld = sluice.Loader(ds, numpy=True, batch_size=2, shuffle=False, images=IM, skip_corrupt=True, rank=rank,
                           world_size=2)
        per.append([_rows(b) for b in ld])
        assert len(per[-1]) == len(ld)
    assert len(per[0]) == len(per[1])
    ids = set()
    for rows in per[0] + per[1]:
        _check(rows, truth)  # a batch left empty too arrives with every field's shape right
        ids.update(r[0] for r in rows)
    assert ids == {r for r in range(N) if r not in BAD}


def test_resume_after_refused_records_goes_on_where_it_stopped(two_classes):
    ds, truth = two_classes
    mk = lambda: sluice.Loader(ds, numpy=True, batch_size=4, shuffle=True, seed=9, epoch=2, images=IM,
                               skip_corrupt=True)
    whole = [_rows(b) for b in mk()]
    ld, head = mk(), []
    for b in ld:
        head.append(_rows(b))
        if len(head) == 2:
            break
    state = ld.state_dict()
    again = sluice.Loader(ds, numpy=True, batch_size=4, shuffle=True, images=IM, skip_corrupt=True)
    again.load_state_dict(state)
    rest = [_rows(b) for b in again]
    assert head + rest == whole


@pytest.mark.parametrize("var", ["SLUICE_IMAGE_DECODERS", "SLUICE_IMAGE_PRODUCERS"])
@pytest.mark.parametrize("where,value", [(w, v) for w in ("env", "file") for v in
                                         ("0", "9", "-1", "abc", "99999999999999999999999", "18446744073709551617")]
                         + [("env", " 2")])  # the settings file's values are trimmed, as INI's are
def test_bad_image_settings_are_refused_naming_the_variable(one_class, tmp_path, var, value, where):
    ds, _ = one_class
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_IMAGE_")}
    if where == "env":
        env[var] = value
        env["SLUICE_CONFIG"] = ""
    else:
        conf = tmp_path / "sluice.conf"
        conf.write_text(f"[sluice]\n{var[len('SLUICE_'):].lower()} = {value}\n")
        env["SLUICE_CONFIG"] = str(conf)
    code = ("import sluice, sys\n"
            "ds = sluice.Dataset(sys.argv[1])\n"
            "im = sluice.Images('data', size=4, decode='cpu')\n"
            "try:\n"
            "    sum(1 for _ in sluice.Loader(ds, numpy=True, batch_size=4, images=im, skip_corrupt=True))\n"
            "except sluice.SluiceError as e:\n"
            "    print('ERR', e)\n"
            "    sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code, ds.path], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert var in p.stdout and "1 to 8" in p.stdout, p.stdout
    if where == "file":
        assert str(tmp_path / "sluice.conf") in p.stdout, p.stdout
    info = subprocess.run([BIN, "info", "--settings"], env=env, capture_output=True, text=True)
    assert info.returncode != 0 and var in info.stderr + info.stdout, (info.stdout, info.stderr)


def test_info_lists_the_image_settings_and_where_they_came_from(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_IMAGE_")}
    conf = tmp_path / "sluice.conf"
    conf.write_text("[sluice]\nimage_decoders = 3\n")
    env.update(SLUICE_CONFIG=str(conf), SLUICE_IMAGE_PRODUCERS="6")
    out = subprocess.run([BIN, "info", "--settings"], env=env, capture_output=True, text=True, check=True).stdout
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("SLUICE_IMAGE_")}
    assert lines["SLUICE_IMAGE_PRODUCERS"].split()[1:3] == ["6", "env"], lines
    assert lines["SLUICE_IMAGE_DECODERS"].split()[1] == "3" and str(conf) in lines["SLUICE_IMAGE_DECODERS"] or \
        "file" in lines["SLUICE_IMAGE_DECODERS"], lines


def test_padded_keys_beside_refused_images_are_the_kept_records(two_classes):
    ds, truth = two_classes
    ld = sluice.Loader(ds, numpy=True, batch_size=5, shuffle=True, seed=1, images=IM, skip_corrupt=True,
                       ragged="padded")
    n = 0
    for b in ld:
        keys, lens = b["key"]
        assert keys.shape[0] == len(b.ids) == b["data"].shape[0] == len(lens)
        for j, rid in enumerate(b.ids):
            assert bytes(keys[j][:lens[j]]) == truth[int(rid)][1] and truth[int(rid)][0] not in BAD
            n += 1
    assert n == N - len(BAD)


def test_a_batch_whose_records_all_fail_their_crc_reaches_the_image_stage_empty(tmp_path):
    """Records 6-8 stored damaged (their CRCs fail, so the gather leaves them out before the image stage runs, on no
    record at all): that batch is not delivered, the rest are the good records, every field aligned."""
    ds, truth = _pack(tmp_path, 1)
    path = ds.path
    del ds
    shard = next(p for p in (tmp_path / "ds").iterdir() if p.suffix == ".sls")
    raw = bytearray(shard.read_bytes())
    for i in (6, 7, 8):
        at = raw.index(_png(i))
        raw[at + len(_png(i)) // 2] ^= 0x55
    shard.write_bytes(bytes(raw))
    ds = sluice.Dataset(path)
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        ld = sluice.Loader(ds, numpy=True, batch_size=3 if world == 1 else 2, shuffle=False, images=IM,
                           skip_corrupt=True, rank=rank, world_size=world)
        got = [_rows(b) for b in ld]
        if world == 1:
            assert [len(r) for r in got] == [3, 2, 3, 3, 3, 1], [len(r) for r in got]  # 3-5 refused, 6-8 damaged
        ids = [r[0] for rows in got for r in rows]
        assert not set(ids) & (BAD | {6, 7, 8}), ids
        for rows in got:
            _check(rows, truth)
