"""Images decoded and augmented inside the loader (sluice.Images): pixels against PIL and a port of torchvision's
antialiased resize, crops' distribution against RandomResizedCrop's, exact flips and normalisation, determinism
and resume, every hostile image ending in the chosen policy; on a GPU, nvJPEG's and the kernel's batches against the
CPU's and against torchvision."""
import io
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import sluice

BIN = os.environ.get("SLUICE_BIN", "build/sluice")


def _has_gpu():
    try:
        import torch
        return torch.cuda.is_available() and sluice.gpu_count() > 0
    except ImportError:
        return False


gpu = pytest.mark.skipif(not _has_gpu(), reason="needs a GPU and torch")


def _image(h, w, seed):
    """A picture with edges and gradients (a JPEG of noise would say little about resizing)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x // 7 + y // 5) % 2) * 200 + 20], -1)
    a = a + rng.integers(0, 30, size=a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


def _encode(a, fmt="JPEG", **kw):
    b = io.BytesIO()
    Image.fromarray(a).save(b, fmt, **kw)
    return b.getvalue()


def _pack(tmp_path, files, name="ds"):
    """files: {relative path: bytes} under an ImageFolder tree; returns the opened dataset."""
    root = tmp_path / f"{name}-src"
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    subprocess.run([BIN, "pack", "--from-dir", str(root), "--all-files", "--quiet", str(tmp_path / name)], check=True)
    return sluice.Dataset(str(tmp_path / name))


def _photos(tmp, subsampling):
    rng = np.random.default_rng(1)
    files = {}
    for i in range(40):
        h, w = int(rng.integers(20, 300)), int(rng.integers(20, 300))
        files[f"{i % 2}/{i:03d}.jpg"] = _encode(_image(h, w, i), quality=92, subsampling=subsampling)
    return _pack(tmp, files), files


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """40 JPEGs of assorted sizes (some smaller than the output), two classes; chroma subsampled 4:2:0."""
    return _photos(tmp_path_factory.mktemp("photos"), 2)


@pytest.fixture(scope="module")
def photos444(tmp_path_factory):
    """The same at 4:4:4: no chroma upsampling, so decoders differ by their IDCT's rounding alone."""
    return _photos(tmp_path_factory.mktemp("photos444"), 0)


def _aa_matrix(n_in, n_out):
    """PyTorch's _upsample_bilinear2d_aa weights (align_corners=False) as a matrix [n_out, n_in]."""
    scale = n_in / n_out
    support = scale if scale >= 1 else 1.0
    inv = 1 / scale if scale >= 1 else 1.0
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        w = np.array([max(0.0, 1 - abs((k - center + 0.5) * inv)) for k in range(lo, hi)])
        m[i, lo:hi] = w / w.sum()
    return m


def _reference(rgb, box, out_h, out_w):
    """The loader's image from its plan: the region resized, the window taken, mirrored; floats of 0..255."""
    region = rgb[box["y"]:box["y"] + box["h"], box["x"]:box["x"] + box["w"]].astype(np.float64)
    wy, wx = _aa_matrix(box["h"], box["resized_h"]), _aa_matrix(box["w"], box["resized_w"])
    res = np.einsum("ywc,xw->cyx", np.einsum("yh,hwc->ywc", wy, region), wx)
    res = res[:, box["offset_y"]:box["offset_y"] + out_h, box["offset_x"]:box["offset_x"] + out_w]
    return res[:, :, ::-1] if box["flip"] else res


def _decoded(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _by_id(ds):
    """record id -> its encoded bytes, read through the dataset."""
    return {i: bytes(ds[i]["data"]) for i in range(len(ds))}


@pytest.mark.parametrize("mode", ["random_resized_crop", "center_crop", "resize"])
def test_pixels_match_pil_and_torchvision_resize(photos, mode):
    ds, _ = photos
    enc = _by_id(ds)
    im = sluice.Images("data", size=(48, 40), mode=mode, flip=0.5, dtype="f32")
    ld = sluice.Loader(ds, numpy=True, batch_size=16, seed=7, epoch=2, images=im)
    worst = 0.0
    for b in ld:
        x = b["data"]
        assert x.shape == (len(b.ids), 3, 48, 40) and x.dtype == np.float32
        for row, rid in enumerate(b.ids):
            rgb = _decoded(enc[int(rid)])
            box = im.plan(rgb.shape[1], rgb.shape[0], int(rid), seed=7, epoch=2)
            ref = _reference(rgb, box, 48, 40) / 255
            worst = max(worst, float(np.abs(x[row] - ref).max()))
    # libjpeg-turbo here and PIL's own build decode alike up to IDCT rounding: a level or two at most.
    assert worst < 2.5 / 255, worst


def test_flip_and_normalisation_are_exact(photos):
    ds, _ = photos
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    def first(**kw):
        ld = sluice.Loader(ds, numpy=True, batch_size=8, shuffle=False, images=sluice.Images("data", size=32, mode="resize", **kw))
        return next(iter(ld))["data"].copy()

    plain, flipped = first(flip=0.0), first(flip=1.0)
    assert np.array_equal(flipped, plain[:, :, :, ::-1])
    norm = first(mean=mean, std=std)
    want = (plain - np.array(mean, np.float32)[:, None, None]) * (1 / np.array(std, np.float32))[:, None, None]
    assert np.abs(norm - want).max() < 1e-5
    u8 = first(dtype="u8")
    assert u8.dtype == np.uint8 and np.array_equal(u8, np.clip(np.floor(plain * 255 + 0.5), 0, 255).astype(np.uint8))
    for dt, tol in (("f16", 1e-3), ("bf16", 8e-3)):
        y = first(dtype=dt).astype(np.float32) if dt == "f16" else \
            (first(dtype=dt).astype(np.uint32) << 16).view(np.float32)
        assert np.abs(y - plain).max() < tol, dt
    last = first(channels_last=True)
    assert last.shape == plain.shape and np.array_equal(last, plain)


def _torchvision_get_params(rng, h, w, scale, ratio):
    """RandomResizedCrop.get_params, line for line, on numpy's generator (where torchvision is missing)."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        cw = int(round(math.sqrt(target_area * aspect_ratio)))
        ch = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def _ks(a, b):
    """Two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())


@pytest.mark.parametrize("size,scale,ratio", [((375, 500), (0.08, 1.0), (3 / 4, 4 / 3)),
                                              ((100, 400), (0.5, 1.0), (0.9, 1.1)),
                                              ((64, 64), (0.2, 0.4), (1 / 3, 3.0))])
def test_crop_distribution_matches_random_resized_crop(size, scale, ratio):
    """The crops' top, left, height and width, over 20,000 records, against get_params' (torchvision's own where
    installed): a two-sample KS test at a level a correct sampler fails once in a thousand runs; fixed seeds."""
    h, w = size
    im = sluice.Images("data", size=224, scale=scale, ratio=ratio)
    n = 20000
    ours = np.array([[b["y"], b["x"], b["h"], b["w"]] for b in (im.plan(w, h, i, seed=3) for i in range(n))], float)
    try:
        import torch
        from torchvision.transforms import v2
        torch.manual_seed(0)
        img = torch.empty(3, h, w)
        theirs = np.array([v2.RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)], float)
    except ImportError:
        rng = np.random.default_rng(0)
        theirs = np.array([_torchvision_get_params(rng, h, w, scale, ratio) for _ in range(n)], float)
    bound = 1.95 * math.sqrt(2 / n)  # alpha = 0.001
    for k, name in enumerate(["top", "left", "height", "width"]):
        d = _ks(ours[:, k], theirs[:, k])
        assert d < bound, (name, d, bound)
    # and the crop's area fraction, which the scale parameter shapes
    assert _ks(ours[:, 2] * ours[:, 3], theirs[:, 2] * theirs[:, 3]) < bound


def test_same_seed_same_batches_and_resume_mid_epoch(photos):
    ds, _ = photos

    def batches(ld, k=None):
        out = []
        for b in ld:
            out.append((b.ids.copy(), b["data"].copy(), b["label"].copy()))
            if len(out) == k:
                break
        return out

    im = sluice.Images("data", size=24, flip=0.5)
    a = batches(sluice.Loader(ds, numpy=True, batch_size=6, seed=11, epoch=1, images=im))
    b = batches(sluice.Loader(ds, numpy=True, batch_size=6, seed=11, epoch=1, images=im))
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    ld = sluice.Loader(ds, numpy=True, batch_size=6, seed=11, epoch=1, images=im)
    batches(ld, 3)
    state = ld.state_dict()
    resumed = sluice.Loader(ds, numpy=True, batch_size=6, seed=0, images=im)
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(rest) == len(a) - 3
    for x, y in zip(a[3:], rest):
        assert np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) and np.array_equal(x[2], y[2])
    # another world size sees the same images for the same records
    r0 = sluice.Loader(ds, numpy=True, batch_size=3, seed=11, epoch=1, rank=0, world_size=2, images=im)
    for b in r0:
        for row, rid in enumerate(b.ids):
            for ids, data, _ in a:
                hit = np.nonzero(ids == rid)[0]
                if len(hit):
                    assert np.array_equal(data[hit[0]], b["data"][row])
        break


def _hostile():
    good = _image(60, 80, 5)
    jpeg = _encode(good, quality=90)
    cmyk = io.BytesIO()
    Image.fromarray(good).convert("CMYK").save(cmyk, "JPEG", quality=95)
    # Entropy data damaged a third of the way in, the end marker kept (bit rot): libjpeg notices only at the
    # scan's end, so a crop above the damage must not be taken for a good image.
    noise = np.random.default_rng(3).integers(0, 256, (400, 300, 3), dtype=np.uint8)
    damaged = bytearray(_encode(noise, quality=90))
    for off in range(len(damaged) * 3 // 10, len(damaged) * 3 // 10 + 20):
        damaged[off] = 0 if damaged[off] != 0xFF else 0xFF
    big = bytearray(_encode(_image(16, 16, 1), quality=90))
    i = big.index(b"\xff\xc0")
    big[i + 5:i + 9] = (20000).to_bytes(2, "big") + (20000).to_bytes(2, "big")
    return {
        "truncated": (jpeg[: len(jpeg) // 2], False),
        "zero-size": (b"", False),
        "garbage": (b"not an image at all", False),
        "lying-20000x20000": (bytes(big), False),
        "header-only": (jpeg[:200], False),
        "damaged-scan": (bytes(damaged), False),
        "png-truncated": (_encode(good, "PNG")[:-30], False),
        "png-cut-before-iend": (_encode(good, "PNG")[:-12], False),
        "png-bytes-after-iend": (_encode(good, "PNG") + b"\0" * 7 + b"appended by a tool", True),
        "one-pixel": (_encode(np.full((1, 1, 3), 200, np.uint8), quality=90), True),
        "cmyk": (cmyk.getvalue(), True),
        "grey": (_encode(good[:, :, 0], quality=90), True),
        "progressive": (_encode(good, quality=90, progressive=True), True),
        "png": (_encode(good, "PNG"), True),
        "png-alpha": (_encode(np.dstack([good, np.full(good.shape[:2], 255, np.uint8)]), "PNG"), True),
        "webp": (_encode(good, "WEBP", lossless=True), True),
        "rgb-colorspace": (_encode(good, quality=95, keep_rgb=True), True),
        "restart-markers": (_encode(good, quality=90, restart_marker_blocks=2) if "restart_marker_blocks" in
                            Image.SAVE.__repr__() else jpeg, True),
    }


@pytest.mark.parametrize("decode", ["cpu", pytest.param("gpu", marks=gpu), pytest.param("auto", marks=gpu)])
def test_hostile_images_end_in_the_chosen_policy(tmp_path, decode):
    cases = _hostile()
    if decode != "cpu":
        # nvJPEG's hardware decoders report no error for entropy data damaged between intact markers (measured on
        # an H100: the image comes out wrong, as it does from PIL, which ignores libjpeg's warning); only the CPU's
        # decoder, which decodes to the scan's end, refuses it (docs/guides/images.md).
        del cases["damaged-scan"]
    files = {f"0/{name}.img": data for name, (data, _) in cases.items()}
    ds = _pack(tmp_path, files)
    names = [bytes(ds[i]["key"]).decode() for i in range(len(ds))]
    device = "cpu" if decode == "cpu" else "cuda"
    im = sluice.Images("data", size=16, decode=decode, dtype="f32")
    # Alone, each bad record fails its batch, naming the dataset, the record and what is wrong.
    for rid, name in enumerate(names):
        ok = cases[name.split("/")[-1].rsplit(".", 1)[0]][1]
        one = sluice.Loader(ds, batch_size=len(ds), shuffle=False, device=device, images=im)
        if ok:
            continue
        with pytest.raises(sluice.SluiceError) as e:
            for _ in one:
                pass
        assert "record" in str(e.value) and str(tmp_path) in str(e.value), str(e.value)
        break
    # skip_corrupt: the bad ones left out and counted, every good one decoded as PIL decodes it.
    ld = sluice.Loader(ds, batch_size=len(ds), shuffle=False, device=device, images=im, skip_corrupt=True)
    b = next(iter(ld))
    bad = sum(not ok for _, ok in cases.values())
    assert len(b.ids) == len(ds) - bad
    assert ld.stats()["skipped"] == bad
    x = b["data"].cpu().numpy() if device != "cpu" else b["data"]
    for row, rid in enumerate(b.ids):
        name = names[int(rid)].split("/")[-1].rsplit(".", 1)[0]
        assert cases[name][1], name
        rgb = _decoded(cases[name][0])
        box = im.plan(rgb.shape[1], rgb.shape[0], int(rid))
        ref = _reference(rgb, box, 16, 16) / 255
        # CMYK: PIL's conversion and sluice's agree to a few levels; the rest as any decode
        assert np.abs(x[row] - ref).max() < (12 if name == "cmyk" else 3) / 255, name


def test_bad_options_name_the_option(photos):
    ds, _ = photos
    for kw, word in [({"size": 0}, "size"), ({"scale": (0.5, 0.1)}, "scale"), ({"ratio": (0, 1)}, "ratio"),
                     ({"flip": 2.0}, "flip"), ({"dtype": "u8", "mean": (0, 0, 0), "std": (1, 1, 1)}, "normalised"),
                     ({"mode": "center_crop", "resize": 10}, "resize")]:
        with pytest.raises((ValueError, sluice.SluiceError), match=word):  # Python's checks, or the library's
            sluice.Loader(ds, numpy=True, batch_size=4, images=sluice.Images("data", **kw))
    with pytest.raises(sluice.SluiceError, match="no loaded field"):
        sluice.Loader(ds, numpy=True, batch_size=4, images=sluice.Images("pixels"))
    with pytest.raises(sluice.SluiceError, match="not of variable-size bytes"):
        sluice.Loader(ds, numpy=True, batch_size=4, images=sluice.Images("label"))
    # A stranger's: options that wrapped on their way into C, or were dropped without a word.
    with pytest.raises(ValueError, match="std above 0"):
        sluice.Images("data", mean=(0.5, 0.5, 0.5), std=(0, 0, 0))
    for field in (b"data", None, "", "da\0ta"):
        with pytest.raises(TypeError, match="field="):
            sluice.Images(field)
    with pytest.raises(TypeError, match="size="):
        sluice.Images("data", size=True)
    with pytest.raises(TypeError, match="a sluice.Images"):
        sluice.Loader(ds, numpy=True, batch_size=4, images="data")
    with pytest.raises(ValueError, match="needs a GPU loader"):
        sluice.Loader(ds, numpy=True, batch_size=4, images=sluice.Images("data", decode="gpu"))
    for device in ("CPU", "cpu:0", "gpu", "cuda:x"):
        with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:N'"):
            sluice.Loader(ds, batch_size=4, device=device)
    im = sluice.Images("data", size=64)
    for kw in ({"width": 2 ** 32 + 10}, {"record": -1}, {"seed": 2 ** 64}, {"height": 0}):
        args = {"width": 300, "height": 400, "record": 0, **kw}
        with pytest.raises(ValueError, match="out of range"):
            im.plan(args["width"], args["height"], args["record"], kw.get("seed", 0))


@gpu
@pytest.mark.parametrize("dtype,channels_last,sub", [("f32", False, 0), ("bf16", True, 0), ("u8", False, 0),
                                                     ("f32", False, 2), ("u8", True, 2)])
def test_gpu_batches_match_the_cpu(photos, photos444, dtype, channels_last, sub):
    """nvJPEG (its hardware decoders on A100/H100/H200, writing RGB with chroma interpolated as libjpeg's "fancy"
    upsampling does; where nvJPEG refuses that, JPEG's planes, which the NVRTC kernel upsamples and converts) and the
    kernel against the CPU's pipeline (libjpeg-turbo), within IDCT rounding, at 4:4:4 and 4:2:0."""
    import torch
    ds, _ = photos444 if sub == 0 else photos
    kw = dict(size=(56, 48), flip=0.5, dtype=dtype, channels_last=channels_last,
              mean=None if dtype == "u8" else sluice.IMAGENET_MEAN, std=None if dtype == "u8" else sluice.IMAGENET_STD)
    g = sluice.Loader(ds, batch_size=16, seed=5, device="cuda", images=sluice.Images("data", decode="gpu", **kw))
    c = sluice.Loader(ds, numpy=True, batch_size=16, seed=5, device="cpu", images=sluice.Images("data", decode="cpu", **kw))
    n = 0
    for bg, bc in zip(g, c):
        assert np.array_equal(bg.ids, bc.ids)
        xg = bg["data"]
        assert xg.is_cuda and xg.shape == (len(bc.ids), 3, 56, 48)
        assert xg.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        xg = xg.float().cpu().numpy()
        xc = bc["data"].astype(np.float32) if dtype != "bf16" else \
            (bc["data"].astype(np.uint32) << 16).view(np.float32)
        scale = 1.0 if dtype == "u8" else 1 / 255 / 0.224
        # IDCTs differ by a level or two; bf16 adds its rounding
        d = np.abs(xg - xc)
        assert d.max() <= (3 * scale if dtype != "bf16" else 3 * scale + 0.02), (dtype, d.max() / scale)
        n += 1
    assert n == len(g)
    st = g.stats()
    assert st["images_gpu"] > 0, st


@gpu
def test_windows_read_again_under_nvjpeg_give_the_right_images(tmp_path):
    """nvJPEG reads each JPEG where it lies, in the loader's windows, which are read again with other records as
    soon as a batch is made: windows of a few records each, turned over every batch by four producers over three
    epochs, still give every record's own image (against the CPU's decoder, within IDCT rounding)."""
    rng = np.random.default_rng(7)
    files = {f"{i % 3}/{i:04d}.jpg": _encode(_image(int(rng.integers(60, 140)), int(rng.integers(60, 140)), i),
                                             quality=90, subsampling=2) for i in range(240)}
    ds = _pack(tmp_path, files)
    kw = dict(size=(32, 32), flip=0.0, dtype="u8", mean=None, std=None)
    for epoch in range(3):
        g = sluice.Loader(ds, batch_size=12, seed=11, device="cuda", window_bytes=64 << 10, prefetch=2,
                          images=sluice.Images("data", decode="gpu", **kw))
        c = sluice.Loader(ds, numpy=True, batch_size=12, seed=11, device="cpu", window_bytes=64 << 10,
                          images=sluice.Images("data", decode="cpu", **kw))
        g.set_epoch(epoch)
        c.set_epoch(epoch)
        n = 0
        for bg, bc in zip(g, c):
            assert np.array_equal(bg.ids, bc.ids)
            d = np.abs(bg["data"].cpu().numpy().astype(np.int16) - bc["data"].astype(np.int16))
            assert d.max() <= 3, (epoch, n, int(d.max()))  # another record's image is off by far more
            n += 1
        # every record decoded by nvJPEG (and the next epoch's first batches, made ahead)
        assert n == 20 and g.stats()["images_gpu"] >= 240 and g.stats()["images_cpu"] == 0, (n, g.stats())


@gpu
@pytest.mark.parametrize("decoders", ["2", "4"])
def test_producers_sharing_decoders_make_the_same_batches(photos, monkeypatch, decoders):
    """The producers take turns on one nvJPEG hardware decoder (SLUICE_IMAGE_DECODERS=1, the default) or on
    several: the same seed gives the same batches, pixel for pixel, whichever they share; and the stats count the
    CUDA calls of the loader's threads (its producers' per batch, its consumer's per call) and its calls into
    nvJPEG."""
    ds, _ = photos
    kw = dict(size=(56, 48), flip=0.5, dtype="u8")

    def run(n):
        monkeypatch.setenv("SLUICE_IMAGE_DECODERS", n)
        ld = sluice.Loader(ds, batch_size=8, seed=3, device="cuda", images=sluice.Images("data", decode="gpu", **kw))
        out = [(np.array(b.ids), b["data"].cpu().numpy()) for b in ld]
        return out, ld.stats()

    one, st = run("1")
    other, _ = run(decoders)
    assert len(one) == len(other) == 5
    for (i1, x1), (i2, x2) in zip(one, other):
        assert np.array_equal(i1, i2) and np.array_equal(x1, x2)
    assert st["images_gpu"] > 0 and st["images_gpu"] + st["images_cpu"] == 40 and st["batches"] == 5, st
    assert st["nvjpeg_calls"] >= 1, st                      # nvjpegDecodeBatched for the batches nvJPEG took
    assert st["cuda_calls_producers"] >= 3 * st["batches"], st  # a batch's copy, kernel and event at least
    assert 0 < st["cuda_calls_consumer"] <= 8 * st["batches"], st
    # Each batch went through a producer's GPU pipeline, whose host time is told by phase and holds its parse
    assert st["image_batches_gpu"] == st["batches"], st
    assert set(st["image_us"]) == {"last_batch_wait", "parse", "lane_wait", "shared_decode_wait", "nvjpeg",
                                   "nvjpeg_read_wait", "cpu_decode", "augment"}, st
    assert st["image_us"]["parse"] > 0 and st["image_us"]["augment"] > 0 and min(st["image_us"].values()) >= 0, st


def test_cuda_call_counts_are_zero_without_a_gpu(photos):
    """A CPU loader makes no CUDA call and no call into nvJPEG, and says so."""
    ds, _ = photos
    ld = sluice.Loader(ds, numpy=True, batch_size=8, device="cpu", images=sluice.Images("data", size=16, decode="cpu"))
    assert sum(1 for _ in ld) == 5
    st = ld.stats()
    assert (st["cuda_calls_producers"], st["cuda_calls_consumer"], st["nvjpeg_calls"]) == (0, 0, 0), st
    assert st["image_batches_gpu"] == 0 and not any(st["image_us"].values()), st


@gpu
def test_gpu_against_torchvision(photos444):
    """The same crop through torchvision: decode_jpeg on the GPU, v2.functional.resized_crop (antialias), flip,
    normalise, against the loader's batch (at 4:4:4: at 4:2:0 torchvision's nvJPEG upsamples chroma otherwise than
    libjpeg, which sluice follows)."""
    import torch
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as F
    ds, _ = photos444
    enc = _by_id(ds)
    im = sluice.Images("data", size=64, flip=0.5, mean=sluice.IMAGENET_MEAN, std=sluice.IMAGENET_STD)
    b = next(iter(sluice.Loader(ds, batch_size=16, seed=9, device="cuda", images=im)))
    for row, rid in enumerate(b.ids):
        data = torch.frombuffer(bytearray(enc[int(rid)]), dtype=torch.uint8)
        img = decode_jpeg(data, device="cuda").float()
        box = im.plan(img.shape[2], img.shape[1], int(rid), seed=9)
        ref = F.resized_crop(img, box["y"], box["x"], box["h"], box["w"], [64, 64], antialias=True)
        if box["flip"]:
            ref = F.horizontal_flip(ref)
        ref = F.normalize(ref / 255, list(sluice.IMAGENET_MEAN), list(sluice.IMAGENET_STD))
        assert (b["data"][row] - ref).abs().max().item() < 3 / 255 / 0.224, int(rid)


def _png_chunk(kind, data):
    import zlib
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def _with_gama(png, gamma):
    """The PNG with a gAMA chunk after IHDR (PIL does not write one)."""
    at = 8 + 25
    return png[:at] + _png_chunk(b"gAMA", int(gamma * 100000).to_bytes(4, "big")) + png[at:]


def _stored_rgb_cases():
    """Images whose stored RGB PIL's convert("RGB") gives as it is: no compositing, no gamma, 16-bit colour by its
    high byte."""
    g = _image(24, 32, 3)
    alpha = np.dstack([g, np.full(g.shape[:2], 64, np.uint8)])
    pal = Image.fromarray(g).convert("P", palette=Image.ADAPTIVE, colors=16)
    pal.info["transparency"] = 0
    b = io.BytesIO()
    pal.save(b, "PNG", transparency=0)
    rgb16 = io.BytesIO()
    import zlib
    raw = b"".join(b"\0" + (g[y].astype(">u2") * 257 + 77).tobytes() for y in range(24))
    ihdr = (32).to_bytes(4, "big") + (24).to_bytes(4, "big") + bytes([16, 2, 0, 0, 0])
    rgb16.write(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(raw)) +
                _png_chunk(b"IEND", b""))
    cmyk = io.BytesIO()
    Image.fromarray(g).convert("CMYK").save(cmyk, "JPEG", quality=95)
    c = cmyk.getvalue()
    i = c.find(b"\xff\xee")  # Adobe's APP14 out: PIL takes the samples as inverted all the same
    no_adobe = c[:i] + c[i + 2 + int.from_bytes(c[i + 2:i + 4], "big"):] if i > 0 else c
    return {"rgba-alpha64": _encode(alpha, "PNG"), "palette-trns": b.getvalue(), "rgb16": rgb16.getvalue(),
            "gama-1.0": _with_gama(_encode(g, "PNG"), 1.0), "gama-0.55": _with_gama(_encode(g, "PNG"), 1 / 1.8),
            "cmyk-no-adobe": no_adobe, "cmyk": c}


def _identity_decoded(tmp_path, cases):
    """{name: (sluice's pixels, PIL's convert("RGB")'s)} of 32 x 24 images through the identity resize, u8, CPU."""
    ds = _pack(tmp_path, {f"0/{k}.img": v for k, v in cases.items()})
    names = [bytes(ds[i]["key"]).decode().split("/")[-1].rsplit(".", 1)[0] for i in range(len(ds))]
    ld = sluice.Loader(ds, numpy=True, batch_size=len(ds), shuffle=False,
                       images=sluice.Images("data", size=(24, 32), mode="resize", dtype="u8", decode="cpu"))
    b = next(iter(ld))
    assert len(b.ids) == len(cases)
    return {names[int(rid)]: (b["data"][row], _decoded(cases[names[int(rid)]]).transpose(2, 0, 1).astype(int))
            for row, rid in enumerate(b.ids)}


def test_stored_colours_are_kept_as_pil_keeps_them(tmp_path):
    """PNG alpha dropped (not composited), 16-bit colour by its high byte, gAMA ignored; CMYK JPEGs inverted with or
    without Adobe's marker: what PIL's convert("RGB") gives, to the level (identity resize, u8)."""
    for name, (got, want) in _identity_decoded(tmp_path, _stored_rgb_cases()).items():
        d = np.abs(got.astype(int) - want).max()
        assert d <= (1 if name.startswith("cmyk") else 0), (name, d)


def _png16(h, w, colour, samples, extra=b""):
    """A 16-bit PNG (colour type 0 grey, 2 RGB, 4 grey+alpha, 6 RGBA) of samples [h, w, channels], big-endian."""
    import zlib
    raw = b"".join(b"\0" + samples[y].astype(">u2").tobytes() for y in range(h))
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([16, colour, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + extra + _png_chunk(b"IDAT", zlib.compress(raw)) +
            _png_chunk(b"IEND", b""))


def _png16_cases():
    """Every 16-bit PNG kind, its samples over the whole range (0..65535: below 256, the low byte alone, both)."""
    rng = np.random.default_rng(16)
    h, w = 24, 32
    s = rng.integers(0, 65536, (h, w, 4), dtype=np.uint16)
    s[0, :, :] = np.array([0, 1, 255, 256, 257, 300, 0x1234, 0xff00, 0xffff, 254, 128, 2] * 3)[:w, None]
    s[1, :, :] = rng.integers(0, 256, (w, 4))  # the low byte alone: where clipping and the high byte part most
    grey = io.BytesIO()
    Image.fromarray(s[:, :, 0]).save(grey, "PNG")  # PIL writes this one itself
    trns = (int(s[5, 5, 0])).to_bytes(2, "big")
    return {"grey16-pil": grey.getvalue(), "grey16": _png16(h, w, 0, s[:, :, :1]),
            "grey16-trns": _png16(h, w, 0, s[:, :, :1], _png_chunk(b"tRNS", trns)),
            "grey-alpha16": _png16(h, w, 4, s[:, :, :2]), "rgb16": _png16(h, w, 2, s[:, :, :3]),
            "rgb16-trns": _png16(h, w, 2, s[:, :, :3], _png_chunk(b"tRNS", trns * 3)),
            "rgba16": _png16(h, w, 6, s)}


def test_16_bit_pngs_are_pils_convert_rgb_byte_for_byte(tmp_path):
    """docs/guides/images.md names PIL's convert("RGB") as the reference: 16-bit grey (PIL's I;16) is clipped to 255
    as its conversion clips, 16-bit colour and grey with alpha taken by the high byte as PIL opens them; every
    byte equal to PIL's, over every 16-bit kind (the identity resize, u8)."""
    cases = _png16_cases()
    for name, (got, want) in _identity_decoded(tmp_path, cases).items():
        assert np.array_equal(got, want), (name, np.abs(got.astype(int) - want).max())
    # The two 16-bit rules PIL has, held here so that a Pillow that changes them fails this test, not the users.
    g = np.asarray(Image.open(io.BytesIO(cases["grey16"])).convert("RGB"))[1, :, 0]
    raw = np.asarray(Image.open(io.BytesIO(cases["grey16"])))[1]
    assert np.array_equal(g, np.minimum(raw, 255))


def test_torchvision_decode_png_keeps_16_bits_where_pil_clips():
    """What the images guide says of torchvision: decode_png gives 16-bit samples whole, its ToDtype(uint8) the
    high byte; so for 16-bit grey it and PIL (sluice's reference) differ."""
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    from torchvision.io import ImageReadMode, decode_png
    from torchvision.transforms.v2 import functional as F
    data = _png16_cases()["grey16"]
    x = decode_png(torch.frombuffer(bytearray(data), dtype=torch.uint8), ImageReadMode.RGB)
    raw = np.asarray(Image.open(io.BytesIO(data))).astype(np.int64)
    assert x.dtype == torch.uint16 and np.array_equal(x[0].to(torch.int64).numpy(), raw), tv.__version__
    assert np.array_equal(F.to_dtype(x, torch.uint8, scale=True)[0].numpy(), raw >> 8)


def test_the_error_names_the_first_bad_record_and_earlier_batches_arrive(tmp_path):
    """skip_corrupt=False with records 1 and 2 bad, batches of 1 built by several producers at once: batch 0 arrives,
    then the error names record 1, every time (it once named whichever producer failed first)."""
    good = _encode(_image(20, 20, 0), quality=90)
    files = {"0/a.jpg": good, "0/b.jpg": b"junk", "0/c.jpg": good[:-300] + b"\xff\xd9"}
    files.update({f"0/z{i:02d}.jpg": good for i in range(10)})
    ds = _pack(tmp_path, files)
    for _ in range(20):
        ld = sluice.Loader(ds, numpy=True, batch_size=1, shuffle=False, images=sluice.Images("data", size=8, decode="cpu"))
        got = 0
        with pytest.raises(sluice.SluiceError, match=r"record 1: field 'data'"):
            for _ in ld:
                got += 1
        assert got == 1


def test_long_thin_images_and_wrapping_options_are_refused(tmp_path):
    import zlib
    raw = b"".join(b"\0" + bytes([y % 256] * 3) for y in range(60000))
    ihdr = (1).to_bytes(4, "big") + (60000).to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    tall = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(raw)) +
            _png_chunk(b"IEND", b""))
    ds = _pack(tmp_path, {"0/tall.png": tall})
    ld = sluice.Loader(ds, numpy=True, batch_size=1, images=sluice.Images("data", size=64, mode="center_crop", resize=256))
    with pytest.raises(sluice.SluiceError, match="passes"):
        next(iter(ld))
    with pytest.raises(sluice.SluiceError, match="passes"):
        sluice.Images("data", size=64, mode="center_crop", resize=256).plan(1, 60000, 0)
    for kw in ({"size": 2 ** 32 + 8}, {"size": 0}, {"resize": -5}, {"resize": 2 ** 31 + 7}, {"scale": (0, 0)},
               {"ratio": (0, 0)}, {"flip": float("nan")}):
        with pytest.raises(ValueError):
            sluice.Images("data", **kw)
    with pytest.raises(sluice.SluiceError, match="inverse"):
        sluice.Loader(ds, numpy=True, batch_size=1, images=sluice.Images("data", mean=(0, 0, 0), std=(1e-40, 1, 1)))
    with pytest.raises(sluice.SluiceError, match="named twice"):
        sluice.Loader(ds, numpy=True, batch_size=1, fields=["data", "data"], images=sluice.Images("data"))


def test_a_transform_of_ours_runs_on_each_batch_before_the_loop(photos):
    """Loader(transform=f): f sees each batch (images already decoded) and changes it in place before the loop does;
    an exception it raises is raised by the loop."""
    ds, _ = photos
    seen = []

    def shift(batch):
        batch["label"] += 1000
        batch["data"] *= 0  # the images are there to change, decoded
        seen.append(len(batch.ids))

    ld = sluice.Loader(ds, numpy=True, batch_size=8, images=sluice.Images("data", size=16), transform=shift)
    n = 0
    for b in ld:
        assert (b["label"] >= 1000).all() and not b["data"].any()
        n += len(b.ids)
    assert n == len(ds) and sum(seen) >= n

    def fails(batch):
        if 3 in batch.ids:
            raise KeyError("record 3 is not wanted")

    ld = sluice.Loader(ds, numpy=True, batch_size=8, shuffle=False, transform=fails)
    with pytest.raises(KeyError, match="record 3"):
        for _ in ld:
            pass


def test_a_transform_that_keeps_replaces_or_returns_is_an_error_not_the_untransformed_batch(photos):
    """The transform's arrays are the ring's memory for the call only: one it keeps would change under later
    batches, a field it assigns anew or a batch it returns would leave the loop the untransformed batch. Each is an
    error the loop raises at that batch, naming what happened; an array kept still points at live memory."""
    ds, _ = photos
    kept = []
    with pytest.raises(RuntimeError, match="kept an array of the batch"):
        for _ in sluice.Loader(ds, numpy=True, batch_size=4, transform=lambda b: kept.append(b["label"])):
            pass
    assert kept and kept[0].shape == (4,)

    def double(b):
        b["label"] = b["label"] * 2

    with pytest.raises(ValueError, match="assigned or removed field.*label"):
        next(iter(sluice.Loader(ds, numpy=True, batch_size=4, transform=double)))
    def drop(b):
        del b["label"]

    with pytest.raises(ValueError, match="assigned or removed field.*label"):
        next(iter(sluice.Loader(ds, numpy=True, batch_size=4, transform=drop)))
    with pytest.raises(TypeError, match="returned a _Batch"):
        next(iter(sluice.Loader(ds, numpy=True, batch_size=4, transform=lambda b: b)))
    # An array a transform kept, read after the loader is closed and gone: the memory it points at is still there.
    r = subprocess.run([sys.executable, "-c",
                        "import sys, gc, numpy as np, sluice\n"
                        "kept = []\n"
                        "ld = sluice.Loader(sys.argv[1], batch_size=4, numpy=True, transform=lambda b: kept.append(b['label']))\n"
                        "try:\n    next(iter(ld))\nexcept RuntimeError:\n    pass\n"
                        "ld.close(); del ld; gc.collect()\n"
                        "junk = [np.ones(10**6) for _ in range(50)]\n"
                        "print(kept[0].shape)", ds.path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "(4,)", (r.returncode, r.stderr[-400:])


@gpu
def test_a_transform_on_the_gpu_is_done_before_the_loop_sees_the_batch(photos):
    """On the GPU the transform's work is queued on the batch's own stream: the loop's stream sees it done."""
    import torch
    ds, _ = photos

    def scale(batch):
        torch.cuda._sleep(2_000_000)  # long enough that a batch not waited for would show the old values
        batch["data"].mul_(0).add_(7)

    ld = sluice.Loader(ds, batch_size=8, device="cuda", images=sluice.Images("data", size=16), transform=scale)
    for b in ld:
        assert (b["data"] == 7).all().item()


def test_import_leaves_cuda_settings_alone():
    """CUDA_DEVICE_MAX_CONNECTIONS is the user's to set (Megatron-style recipes want 1; a GPU image loader wants
    32 and warns when it finds fewer than 16): importing sluice must not set it for them."""
    import sys
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    out = subprocess.run([sys.executable, "-c", "import os, sluice; print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "None"
