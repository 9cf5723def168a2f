"""sluice journey --quick: each experiment's figures in the JSON, sane where the seed report says which way they
go, and the HTML report with a chart per experiment that ran (a GPU's experiment says why it did not run)."""
import html
import json
import os
import subprocess
import sys

import sluice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLUICE = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice"))


def test_journey_quick(tmp_path):
    env = dict(os.environ, SLUICE_PYTHON=sys.executable)
    r = subprocess.run([SLUICE, "journey", "--quick", "--dir", str(tmp_path / "data"), "--html", str(tmp_path / "r.html"),
                        "--json", str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    exps = {e["name"]: e for e in rep["experiments"]}
    assert list(exps) == ["random_vs_sequential", "padding_tax", "pinned_vs_pageable"]
    assert rep["machine"]["cpus"] == os.cpu_count() and rep["machine"]["sluice"] == sluice.lib.sluice_version().decode()
    rs = exps["random_vs_sequential"]
    assert rs["ratios"]["python_sequential_over_random"] > 1  # the seed: 20.2x on NVMe
    assert all(v > 0 for _, v in rs["series"])
    pt = exps["padding_tax"]
    assert pt["lengths"]["min"] >= 13 and pt["lengths"]["max"] <= 307 and 80 < pt["lengths"]["mean"] < 110
    padded, packed = (v for _, v in pt["series"])
    assert 1.5 < padded < 3.5 and packed > 95 and pt["ratios"]["packed_over_padded"] > 25  # the seed: 2.3%, 98.5%
    pp = exps["pinned_vs_pageable"]
    if sluice.gpu_count() == 0:
        assert pp["skipped"] == "no GPU on this machine"
    else:
        assert pp["ratios"]["pinned_over_pageable"] > 1
    page = (tmp_path / "r.html").read_text()
    ran = [e for e in rep["experiments"] if "skipped" not in e]
    assert page.count("<svg") == len(ran) and page.startswith("<!doctype html>")
    for e in rep["experiments"]:
        assert html.escape(e["title"]) in page and html.escape(e["seed"]) in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched to view it
