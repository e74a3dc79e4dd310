"""What a pass (an epoch) costs the consumer besides its samples, beside a baseline checkout in one run.

    python -m bench.pass_cost [--data bench/data] [--sizes 256,2048] [--rounds 3] [--passes 5]
                              [--baseline PATH] [--json OUT]

The consumer is one process whatever ``workers`` is, so its CPU per sample caps the pipeline; over an
epoch that is its steady cost per sample plus what each pass costs it once (starting the pass's reader,
its first chunks, ending it) spread over the epoch's samples.  This script times whole passes of
``ParallelReader(path, fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)], workers=2,
batch_size=64)`` over files of each size in ``--sizes`` (samples: the groups of ``aug.rec``, cycled, or of
the demo's photo-like stream when ``--data`` has none; written to a temp dir), by the consumer's CPU
time (``time.process_time`` of the iterating process; never wall time: the machine is shared), and fits
``cpu = per_pass + n x per_sample`` through the sizes: the intercept is the pass's own cost.

Each run is a fresh interpreter (one untimed pass first, then ``--passes`` timed ones); ``--baseline
PATH`` runs the checkout at PATH (an earlier commit, its C extensions copied in) through ``PYTHONPATH``
from a directory outside both checkouts, alternating with this one run by run, so that both share the
machine's state of the moment.  Prints one JSON object: per checkout and size the median [min, max] of
the passes' consumer CPU (ms per pass, us per sample) and samples/s, and the fit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from bench.stages import image_stream

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_DRIVER = r"""
import json, sys, time
from parrecio import ParallelReader
from parrecio.decoders import BoundingBoxes, Image
path, passes = sys.argv[1], int(sys.argv[2])
r = ParallelReader(path, fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)], workers=2, batch_size=64)
out = []
for p in range(passes + 1):
    c0, w0, n = time.process_time(), time.perf_counter(), 0
    for images, boxes in r:
        n += len(boxes)
    c1, w1 = time.process_time(), time.perf_counter()
    if p:
        out.append({"n": n, "cpu_s": c1 - c0, "wall_s": w1 - w0})
r.close()
print(json.dumps(out))
"""


def write_sizes(src: str, tmp: str, sizes: List[int]) -> Dict[int, str]:
    """Files of the first groups of ``src`` (pairs of records), cycled up to each size."""
    from parrecio.recordio import RecordReader, RecordWriter
    with RecordReader(src) as rd:
        recs = [rec[1] for rec in rd]
    groups = [recs[i:i + 2] for i in range(0, len(recs) - 1, 2)]
    paths = {}
    for size in sizes:
        path = os.path.join(tmp, f"pass_{size}.rec")
        with RecordWriter(path) as w:
            for i in range(size):
                for rec in groups[i % len(groups)]:
                    w.write(rec)
        paths[size] = path
    return paths


def run_once(checkout: str, path: str, passes: int, cwd: str) -> List[Dict[str, float]]:
    env = dict(os.environ, PYTHONPATH=checkout)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", _DRIVER, path, str(passes)], env=env, cwd=cwd,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(xs: List[float], digits: int) -> Dict[str, Any]:
    return {"median": round(statistics.median(xs), digits), "min": round(min(xs), digits),
            "max": round(max(xs), digits)}


def summarize(runs: Dict[int, List[Dict[str, float]]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    med = {}
    for size, passes in sorted(runs.items()):
        ms = [p["cpu_s"] * 1e3 for p in passes]
        us = [p["cpu_s"] / p["n"] * 1e6 for p in passes]
        rate = [p["n"] / p["wall_s"] for p in passes]
        med[size] = statistics.median(ms)
        # (4 digits: the fit's slope is read back from these medians, and 3 put its rounding at 0.01 us)
        out[str(size)] = {"passes": len(passes), "consumer_ms_per_pass": _spread(ms, 4),
                          "consumer_us_per_sample": _spread(us, 2), "samples_per_s": _spread(rate, 0)}
    sizes = sorted(med)
    if len(sizes) >= 2:  # the line through the smallest and the largest size's medians
        a, b = sizes[0], sizes[-1]
        slope = (med[b] - med[a]) / (b - a)
        out["fit"] = {"per_pass_ms": round(med[a] - slope * a, 3), "per_sample_us": round(slope * 1e3, 2)}
    return out


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"), help="folder with aug.rec (bench.data build)")
    ap.add_argument("--sizes", default="256,2048", help="samples per pass, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (a fresh process per run)")
    ap.add_argument("--passes", type=int, default=5, help="timed passes per run")
    ap.add_argument("--baseline", default="", help="a checkout of an earlier parrecio, timed beside this one")
    ap.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    checkouts = {"this": ROOT}
    if args.baseline:
        checkouts["baseline"] = os.path.abspath(args.baseline)
    runs: Dict[str, Dict[int, list]] = {name: {s: [] for s in sizes} for name in checkouts}
    with tempfile.TemporaryDirectory(prefix="parrecio-pass-cost-") as tmp:
        src = image_stream(args.data, tmp, 300)  # (the demo's photo-like stream when aug.rec is not built)
        paths = write_sizes(src["path"], tmp, sizes)
        for _ in range(args.rounds):
            for name, checkout in sorted(checkouts.items()):
                for size in sizes:
                    runs[name][size] += run_once(checkout, paths[size], args.passes, tmp)
    result = {"workload": "[Image((224, 224)), BoundingBoxes(max_boxes=16)], workers=2, batch_size=64",
              "data": src["origin"], "rounds": args.rounds,
              **{name: summarize(r) for name, r in runs.items()}}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
