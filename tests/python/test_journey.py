"""sluice journey --quick: each experiment's figures in the JSON, sane where the seed report says which way they
go, and the HTML report with a chart per experiment that ran (a GPU's experiment says why it did not run)."""
import gzip
import html
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import sluice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    """One `sluice journey --quick` run for the module's tests: its folder, with r.html and r.json."""
    tmp_path = tmp_path_factory.mktemp("journey")
    env = dict(os.environ, SLUICE_PYTHON=sys.executable)
    r = subprocess.run([SLUICE, "journey", "--quick", "--dir", str(tmp_path / "data"), "--html", str(tmp_path / "r.html"),
                        "--json", str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return tmp_path


def test_journey_quick(journey):
    tmp_path = journey
    rep = json.loads((tmp_path / "r.json").read_text())
    exps = {e["name"]: e for e in rep["experiments"]}
    assert list(exps) == ["random_vs_sequential", "dataloader_masking", "cpu_starvation", "padding_tax",
                          "pinned_vs_pageable", "full_picture"]
    assert rep["machine"]["cpus"] == os.cpu_count() and rep["machine"]["sluice"] == sluice.lib.sluice_version().decode()
    # What the report's measurements are is checked here, not which way they point: a virtio disk whose host
    # caches reads can invert the seed's direction, and the report's verdict says so (bench/ holds timings).
    rs = exps["random_vs_sequential"]
    assert rs["ratios"]["python_sequential_over_random"] > 0
    assert all(v > 0 for _, v in rs["series"])
    assert "sluice, sequential (io_uring, 4 MiB reads)" in dict(rs["series"]) and "reads ahead" in rs["verdict"]
    pt = exps["padding_tax"]
    assert pt["lengths"]["min"] >= 13 and pt["lengths"]["max"] <= 307 and 80 < pt["lengths"]["mean"] < 110
    padded, packed = (v for _, v in pt["series"])
    assert 1.5 < padded < 3.5 and packed > 95 and pt["ratios"]["packed_over_padded"] > 25  # the seed: 2.3%, 98.5%
    if importlib.util.find_spec("torch"):
        for name in ("dataloader_masking", "cpu_starvation"):
            assert "skipped" not in exps[name]
        dm = exps["dataloader_masking"]
        assert dm["ratios"]["big_over_small_0_workers"] > 0 and dm["ratios"]["big_4_workers_warm_mb_s"] > 0
        assert "from the page cache" in dm["verdict"]
        labels = [k for k, _ in dm["series"]]
        for peer, label in (("streaming", "MosaicML Streaming (MDS shards), shuffled, 4 workers"),
                            ("webdataset", "WebDataset (tar shards), shuffled, 4 workers")):
            assert (label in labels) == (importlib.util.find_spec(peer) is not None) == (peer not in dm["not_installed"])
        assert labels[-1] == "sluice.Loader, shards, shuffled" and all(v > 0 for _, v in dm["series"])
        assert all(0 <= v <= 100 for _, v in exps["cpu_starvation"]["series"])  # GPU idle, a percentage
    else:
        assert exps["dataloader_masking"]["skipped"] == exps["cpu_starvation"]["skipped"] == "PyTorch is not installed"
    fp = exps["full_picture"]
    gpu_torch = importlib.util.find_spec("torch") and importlib.util.find_spec("torchvision") and sluice.gpu_count()
    if not gpu_torch:
        assert fp["skipped"] in ("PyTorch is not installed", "torchvision is not installed",
                                 "no GPU on this machine (the step trains ResNet-50)")
    else:
        f = fp["figures"]
        assert "ImageFolder, 0 workers" in f and "ImageFolder, 4 workers" in f and "sluice.Loader + nvJPEG" in f
        for r in f.values():  # the phases add up to the step; each step trained something
            assert abs(sum(r["phases_ms"].values()) - r["step_ms"]) < 1e-6 * r["step_ms"] and r["compute_ms"] > 0
            assert abs(r["images_per_s"] - 64e3 / r["step_ms"]) < 1e-6 * r["images_per_s"]
        assert fp["ratios"]["imagefolder_4_over_0_workers"] > 0
        assert all(0 <= r["data_wait_pct"] <= 100 for r in f.values())
        for kind in ("imagefolder_w0", "imagefolder_w4", "sluice_w0"):  # the profiler's traces, with the markers
            with gzip.open(os.path.join(fp["traces"], kind + ".json.gz"), "rt") as t:
                names = {ev.get("name") for ev in json.load(t)["traceEvents"]}
            assert {"DATALOADER_WAIT", "H2D_TRANSFER", "FORWARD", "BACKWARD", "OPTIMIZER"} <= names
    pp = exps["pinned_vs_pageable"]
    if not (importlib.util.find_spec("torch") and sluice.gpu_count()):
        assert pp["skipped"] in ("PyTorch is not installed", "no GPU on this machine")
    else:
        assert pp["ratios"]["d2h_pinned_over_pageable_256mb"] > 0, pp["tables"][0]
        assert all(0 <= v <= 100 for v in pp["overlap_pct"].values()), pp["tables"][1]
        assert [r[0] for r in pp["tables"][0]["rows"]] == ["1 MB", "16 MB", "256 MB", "1024 MB"]
        assert all(v > 0 for _, v in pp["series"])
    page = (tmp_path / "r.html").read_text()
    ran = [e for e in rep["experiments"] if "skipped" not in e]
    assert page.count("<svg") == len(ran) and page.startswith("<!doctype html>")
    for e in rep["experiments"]:
        assert html.escape(e["title"]) in page and html.escape(e["seed"]) in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched to view it


def test_journey_report_in_a_browser(journey, tmp_path):
    """The report opened in a real headless browser (Debian's chromium): the screenshot shows the charts' bars."""
    import shutil
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("no chromium (scripts/deps.sh test installs it)")
    Image = pytest.importorskip("PIL.Image")
    shot = tmp_path / "shot.png"
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1000,6000", (journey / "r.html").as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr
    import numpy as np
    px = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)

    def count(r, g, b):
        return int((np.abs(px - np.array([r, g, b])) < 12).all(axis=2).sum())
    orange, blue = count(0xe0, 0x7b, 0x39), count(0x2b, 0x7b, 0xb9)
    ran = [e for e in json.loads((journey / "r.json").read_text())["experiments"] if "skipped" not in e]
    # Every chart's first bar is orange and its second blue: each at least 2 px wide and 26 px high.
    assert orange >= 52 * len(ran) and blue >= 52 * len(ran), (orange, blue)


def test_journey_says_warm_where_its_files_stay_cached(tmp_path, monkeypatch):
    """Where the files stay in the page cache (tmpfs, another process maps them), an experiment says its storage
    was warm."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "journey"))
    import journey as j
    monkeypatch.setattr(j, "_drop_caches", lambda *paths: False)
    monkeypatch.setattr(j, "SLUICE", SLUICE)
    e = j.random_vs_sequential(str(tmp_path), True)
    assert e["cold"] is False and e["title"] == "Random against sequential reads, warm (its files stayed in the page cache)"
    assert all(v > 0 for _, v in e["series"])


def test_journey_only_some_sections(tmp_path):
    """--only runs the sections named, in the report's order; a section that is not one is named in the error."""
    env = dict(os.environ, SLUICE_PYTHON=sys.executable)
    r = subprocess.run([SLUICE, "journey", "--quick", "--only", "5,2", "--dir", str(tmp_path / "d"), "--html",
                        str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [e["section"] for e in rep["experiments"]] == [2, 5]
    assert (tmp_path / "r.html").read_text().count("<section>") == 2
    for bad in ("9", "x"):
        r = subprocess.run([SLUICE, "journey", "--only", bad, "--html", str(tmp_path / "no.html")], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 2 and f"--only: '{bad}' is not a section of the report (2-7)" in r.stderr
        assert not (tmp_path / "no.html").exists()
