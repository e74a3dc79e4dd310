"""A smoke run of bench/stages.py's consumer case (the README's figures come from it): with --repeat K every
epoch is K copies of the stream, each variant reads them all, and the figures are CPU costs of the three
stages.  (On the built-in demo stream: bench/data is not part of a checkout.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_boxes16_reads_epochs_of_repeat_copies(tmp_path):
    empty = tmp_path / "no-data"  # no aug.rec there: the demo stream of --quick's 300 samples
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "bench.stages", "--cases", "boxes16", "--quick", "--repeat", "2",
                           "--data", str(empty)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)["boxes16"]
    assert doc["epoch"] == "2 x the stream" and doc["data"].startswith("parrecio.tools.demo stream, 300")
    for name in ("workers_2", "workers_2_chunk_groups_256", "workers_2_at_capacity", "workers_2_idle_cores"):
        fig = doc[name]
        assert fig["samples"] == 600, (name, fig)  # a whole epoch: both copies
        assert fig["consumer_us"] > 0 and fig["reader_us"] > 0 and fig["workers_us"] >= 0, (name, fig)
        assert fig["consumer_wakes"] >= 0, (name, fig)
        if fig["consumer_wakes"]:
            # (both rounded: per wake to 1 us, per sample to 0.01 us, i.e. 0.005 x 600 / wakes per wake)
            slack = 0.5 + 0.005 * 600 / fig["consumer_wakes"] + 1e-6
            assert abs(fig["consumer_us_per_wake"] - fig["consumer_us"] * 600 / fig["consumer_wakes"]) <= slack, (
                name, fig)
    assert doc["workers_2"]["workers_us"] > 0  # real decoders (the stand-ins at capacity may round to 0)
    # the sleeping stand-ins take about as long as the real decoders (their rate within a factor of 3)
    assert doc["workers_2_idle_cores"]["rate"] < 3 * doc["workers_2"]["rate"], doc


def test_pipe_case_measures_each_reader_against_the_plain_loop_round_by_round():
    """The Pipe-mode case (README "The serial stages"): the pipeline as ``bytes`` and as views, and
    ``workers=0`` (``inline``), each with one ratio per round to the plain FIFO loop of that round."""
    proc = subprocess.run([sys.executable, "-m", "bench.stages", "--cases", "pipe", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)["pipe"]
    assert doc["records"] == 300 and len(doc["plain_fifo_loop_gb_s"]) == 1
    for mode in ("bytes", "views", "inline"):
        fig = doc[mode]
        assert len(fig["gb_s"]) == len(fig["ratio_by_round"]) == 1, (mode, fig)
        assert fig["gb_s"][0] > 0 and fig["consumer_cpu_s_per_gb"][0] > 0, (mode, fig)
        assert abs(fig["ratio_by_round"][0] - fig["gb_s"][0] / doc["plain_fifo_loop_gb_s"][0]) < 0.01, (mode, fig)
    assert doc["bytes"]["reader_process_cpu_s_per_gb"][0] > 0  # a reader process; workers=0 has none
    assert doc["inline"]["reader_process_cpu_s_per_gb"][0] == 0
