"""A smoke run of bench/pass_cost.py (the README's per-pass figures come from it): both checkouts (here the
same one twice), every size, every pass read whole, and the fit through the sizes.  (On the built-in demo
stream: bench/data is not part of a checkout.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pass_cost_times_whole_passes_of_each_size_beside_the_baseline(tmp_path):
    empty = tmp_path / "no-data"  # no aug.rec there: the demo stream
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "bench.pass_cost", "--data", str(empty), "--sizes", "64,160",
                           "--rounds", "1", "--passes", "2", "--baseline", ROOT], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["data"].startswith("parrecio.tools.demo stream, 300")
    for name in ("this", "baseline"):
        for size in (64, 160):
            fig = doc[name][str(size)]
            assert fig["passes"] == 2, (name, size, fig)
            ms = fig["consumer_ms_per_pass"]
            assert 0 < ms["min"] <= ms["median"] <= ms["max"], (name, size, fig)
            us = fig["consumer_us_per_sample"]["median"]
            assert abs(us - ms["median"] * 1e3 / size) <= 0.02 * us + 0.01, (name, size, fig)  # whole passes
        fit = doc[name]["fit"]
        med = {s: doc[name][str(s)]["consumer_ms_per_pass"]["median"] for s in (64, 160)}
        slope = (med[160] - med[64]) / 96
        assert abs(fit["per_sample_us"] - slope * 1e3) < 0.01
        assert abs(fit["per_pass_ms"] - (med[64] - 64 * slope)) < 0.002
