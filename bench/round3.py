"""The figures of "Performance, round 3" (issue #27), each beside its baseline, in one run.

    python -m bench.round3 --before PATH [--data bench/data] [--data98 /tmp/q97] [--out bench/out/round3]

``--before``: a checkout of parrecio from before the round (its C extensions built or copied in).  The
run calls the scripts of ``bench/`` one after the other, each measuring side by side within itself, and
prints one table (JSON too, with every script's whole document under ``--out``):

1. raw records (``fields=None``, unbatched) against a one-process ``RecordReader`` loop over the same
   file, 100 B and 100 KB records, 2 workers and ``workers=0``: ``bench_pipeline.py --only raw`` of each
   checkout (each script times its own loop in the same rounds);
2. per-core decode + resize to 224 (and the fused RandomResizedCrop) against Pillow-SIMD's own path, image
   by image (``fast_decode.py``; before the round the exact path was the only one: 1.00x);
3. Pipe mode: raw passthrough from FIFOs fed by ``cat`` against a plain FIFO loop, per round
   (``stages.py --cases pipe`` of each checkout), and the consumer's CPU per sample over epochs of ~5000
   ~100 KB photos with ``[Image(224), BoundingBoxes(max_boxes=16)]`` (``pass_cost.py --baseline``, both
   checkouts interleaved);
4. the first batch, constructor to batch 1 in fresh interpreters (``first_batch.py --baseline``, both
   checkouts interleaved; PyTorch's ``DataLoader`` beside them when ``bench/.venvs/torch`` exists).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(args: List[str], out: str, cwd: str = ROOT, env: Any = None) -> Dict[str, Any]:
    """Run a bench script, keep its stdout (one JSON document) in ``out`` and return it parsed."""
    print("#", " ".join(args), file=sys.stderr, flush=True)
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    text = proc.stdout[proc.stdout.index("{"):]
    with open(out, "w") as f:
        f.write(text)
    return json.loads(text)


def _raw(doc: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """records/s of each size, and the ratios to the loop of the same run."""
    out = {}
    for label, c in doc["raw"].items():
        if not isinstance(c, dict) or "record_reader_1proc" not in c:
            continue
        loop = c["record_reader_1proc"]["best_s"]
        w0 = c.get("parallel_reader_w0")  # (not measured before the round)
        out[label] = {"w2_vs_loop": round(loop / c["parallel_reader_w2"]["best_s"], 2),
                      "w0_vs_loop": round(loop / w0["best_s"], 2) if w0 else None,
                      "w2_records_per_s": c["parallel_reader_w2"]["records_per_s"],
                      "loop_records_per_s": c["record_reader_1proc"]["records_per_s"]}
    return out


def _pipe(doc: Dict[str, Any]) -> Dict[str, Any]:
    p = doc.get("pipe", doc)
    if "bytes" in p:  # per-round ratios (this checkout): as bytes, and as views (iter_views())
        out = {"ratio_by_round": p["bytes"]["ratio_by_round"], "gb_s": p["bytes"]["gb_s"],
               "plain_gb_s": p["plain_fifo_loop_gb_s"],
               "views_ratio_by_round": p["views"]["ratio_by_round"],
               "reader_cpu_s_per_gb": p["bytes"]["reader_process_cpu_s_per_gb"],
               "views_reader_cpu_s_per_gb": p["views"]["reader_process_cpu_s_per_gb"]}
        if "inline" in p:  # as bytes with workers=0
            out["workers_0_ratio_by_round"] = p["inline"]["ratio_by_round"]
        return out
    return {"ratio_by_round": [p["ratio"]], "gb_s": [p["parallel_reader_raw_gb_s"]],
            "plain_gb_s": [p["plain_fifo_loop_gb_s"]]}


def main(argv: Any = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout of parrecio from before the round")
    ap.add_argument("--data", default=os.path.join(HERE, "data"), help="bench/data.py's folder (50 KB photos)")
    ap.add_argument("--data98", default="", help="a folder of ~100 KB photos (bench.data build --quality 97); "
                                                 "default: --data")
    ap.add_argument("--pipe-runs", type=int, default=5,
                    help="rounds of the pipe case (of the older stages.py: runs, one ratio each)")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "round3"))
    args = ap.parse_args(argv)
    before = os.path.abspath(args.before)
    data98 = args.data98 or args.data
    os.makedirs(args.out, exist_ok=True)
    py = sys.executable
    o = lambda name: os.path.join(args.out, name)  # noqa: E731
    res: Dict[str, Any] = {"before": before}
    # the older scripts import the older package: first on the path, for them and for their children
    # (an editable install of this checkout would win otherwise)
    env_before = dict(os.environ, PYTHONPATH=before)

    # 1. raw records
    res["raw"] = {"before": _raw(_run([py, os.path.join(before, "bench", "bench_pipeline.py"), "--only", "raw",
                                       "--data", args.data],
                                      o("raw_before.json"), cwd=before, env=env_before)),
                  "now": _raw(_run([py, "-m", "bench.bench_pipeline", "--only", "raw", "--data", args.data],
                                   o("raw_now.json")))}
    # 2. decode + resize per core
    doc = _run([py, "-m", "bench.fast_decode", "--rec", os.path.join(args.data, "aug.rec"), "--rounds", "3",
                "--count", "300"], o("fast_decode.json"))
    res["decode"] = {"summary": doc["summary"], "quality_vs_exact": doc.get("quality_vs_exact")}
    # 3. Pipe mode and the consumer
    pipe_before: Dict[str, List[float]] = {"ratio_by_round": [], "gb_s": [], "plain_gb_s": []}
    for i in range(args.pipe_runs):
        p = _pipe(_run([py, os.path.join(before, "bench", "stages.py"), "--cases", "pipe", "--data", args.data],
                       o(f"pipe_before_{i}.json"), cwd=before, env=env_before))
        for k in pipe_before:
            pipe_before[k] += p[k]
    res["pipe"] = {"before": pipe_before,
                   "now": _pipe(_run([py, "-m", "bench.stages", "--cases", "pipe", "--passes", str(args.pipe_runs)],
                                       o("pipe_now.json")))}
    res["consumer"] = _run([py, "-m", "bench.pass_cost", "--data", data98, "--sizes", "256,4800", "--rounds", "2",
                            "--baseline", before], o("pass_cost.json"))
    # 4. first batch
    res["first_batch"] = _run([py, "-m", "bench.first_batch", "--rounds", "5", "--baseline", before,
                               "--data", args.data], o("first_batch.json"))
    with open(o("round3.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
