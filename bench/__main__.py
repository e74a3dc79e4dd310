"""Run the whole benchmark suite and print one JSON document (plus a markdown table on stderr).

    python -m bench [--data bench/data] [--quick] [--json OUT] [--plot OUT.png]
                    [--pipeline-json FILE | --skip-pipeline]

Runs ``bench.bench_pipeline`` in this interpreter (the dev venv: parrecio + Pillow-SIMD), then each peer
of ``bench/peers.py`` as a subprocess with its own interpreter: parrecio (dev venv), PyTorch DataLoader
and a one-process stock-Pillow loop (``bench/.venvs/torch``, made by ``bench/setup_peers.sh``), MXNet
``ImageRecordIter`` uint8 and float32 (``bench/.venvs/mx``).  A peer whose venv is missing is reported as
skipped.  ``--plot`` draws images/s against workers with matplotlib in the imgdata venv (matplotlib pulls
plain Pillow, which must stay out of the dev venv).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_PY = os.path.join(HERE, ".venvs", "torch", "bin", "python")
MX_PY = os.environ.get("PARRECIO_BENCH_MX_PY", os.path.join(HERE, ".venvs", "mx", "bin", "python"))
PLOT_PY = os.environ.get("PARRECIO_BENCH_PLOT_PY", os.path.join(HERE, ".venvs", "imgdata", "bin", "python"))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_flags() -> List[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return [x for x in ("sse4_2", "avx2", "avx512f") if x in flags]
    except OSError:
        pass
    return []


def versions() -> Dict[str, Any]:
    import importlib.metadata as md
    import numpy
    import PIL
    import parrecio
    from bench.peers import _pil_build
    out = {"python": platform.python_version(), "parrecio": parrecio.__version__, "numpy": numpy.__version__,
           "pil_dev_venv": _pil_build(), "pil_module": PIL.__file__}
    names = {d.metadata["Name"].lower() for d in md.distributions()}
    out["pillow_simd_loaded"] = "pillow-simd" in names and "pillow" not in names
    return out


def run_peer(py: str, args: List[str], timeout: int = 300) -> Dict[str, Any]:
    if not os.path.exists(py):
        return {"skipped": f"{py} missing (run bench/setup_peers.sh)"}
    res = subprocess.run([py, os.path.join(HERE, "peers.py")] + args, capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    if res.returncode != 0:
        return {"error": res.stderr[-2000:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_peers(data: str, quick: bool) -> Dict[str, Any]:
    ep = ["--epochs", "2" if quick else "3"]
    d = ["--data", data]
    peers: Dict[str, Any] = {}
    peers["parrecio_w2"] = run_peer(sys.executable, ["parrecio", "--workers", "2"] + d + ep)
    peers["torch_w2"] = run_peer(TORCH_PY, ["torch", "--workers", "2"] + d + ep)
    peers["mxnet_uint8"] = run_peer(MX_PY, ["mxnet", "--dtype", "uint8", "--workers", "2"] + d + ep)
    peers["mxnet_float32"] = run_peer(MX_PY, ["mxnet", "--dtype", "float32", "--workers", "2"] + d + ep)
    peers["pillow_loop"] = run_peer(TORCH_PY, ["pillow", "--limit", "500" if quick else "1000"] + d)
    if not quick:  # more points for the curve
        for w in (1, 4):
            peers[f"torch_w{w}"] = run_peer(TORCH_PY, ["torch", "--workers", str(w), "--epochs", "2"] + d)
            peers[f"parrecio_w{w}"] = run_peer(sys.executable, ["parrecio", "--workers", str(w), "--epochs", "2"] + d)
    return peers


def _rate(x: Optional[Dict[str, Any]]) -> Optional[float]:
    return None if not x or "images_per_s" not in x else x["images_per_s"]


def summary(doc: Dict[str, Any]) -> Dict[str, Any]:
    p = doc["peers"]
    par, tor = _rate(p.get("parrecio_w2")), _rate(p.get("torch_w2"))
    mx8, mx32 = _rate(p.get("mxnet_uint8")), _rate(p.get("mxnet_float32"))
    s = {}
    if par and tor:
        s["parrecio_vs_dataloader"] = round(par / tor, 2)
        s["target_1.5x_dataloader_met"] = par / tor >= 1.5
    mx = max([x for x in (mx8, mx32) if x] or [0])
    if par and mx:
        s["parrecio_vs_imagerecorditer"] = round(par / mx, 2)
        s["target_1.8x_imagerecorditer_met"] = par / mx >= 1.8
    return s


def table(doc: Dict[str, Any]) -> str:
    rows = ["| loader (same images.rec, 224x224 RGB uint8, batch 64) | workers | images/s |",
            "|---|---|---|"]
    names = {"parrecio_w2": "parrecio ParallelReader (Pillow-SIMD)", "torch_w2": "PyTorch DataLoader (stock Pillow)",
             "mxnet_uint8": "MXNet ImageRecordIter uint8", "mxnet_float32": "MXNet ImageRecordIter float32",
             "pillow_loop": "one-process stock Pillow loop"}
    for key, name in names.items():
        r = doc["peers"].get(key, {})
        w = r.get("workers", r.get("num_workers", r.get("preprocess_threads_requested", 1)))
        if key.startswith("mxnet") and "preprocess_threads_effective" in r:
            w = f"{w} (effective {r['preprocess_threads_effective']} thread)"
        rows.append(f"| {name} | {w} | {r.get('images_per_s', r.get('skipped', r.get('error', '?')[:60]))} |")
    sc = (doc.get("pipeline") or {}).get("scaling")
    if sc:
        rows.append(f"| parrecio on aug.rec [JPEG][boxes JSON], 1 process, no pipeline | 1 | "
                    f"{sc['single_process']['images_per_s']} |")
        for w, r in sc["workers"].items():
            rows.append(f"| parrecio on aug.rec, Image + BoundingBoxes | {w} | {r['images_per_s']} "
                        f"(eff. {sc['efficiency'][w]}) |")
    return "\n".join(rows)


_PLOT = r"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
doc = json.load(open(sys.argv[1]))
p = doc["peers"]
fig, ax = plt.subplots(figsize=(7, 4.5))
def series(prefix):
    pts = sorted((int(k.rsplit("_w", 1)[1]), v["images_per_s"]) for k, v in p.items()
                 if k.startswith(prefix + "_w") and "images_per_s" in v)
    return [x for x, _ in pts], [y for _, y in pts]
for prefix, label in (("parrecio", "parrecio (images.rec)"), ("torch", "PyTorch DataLoader + stock Pillow")):
    xs, ys = series(prefix)
    if xs:
        ax.plot(xs, ys, "o-", label=label)
sc = (doc.get("pipeline") or {}).get("scaling")
if sc:
    xs = [int(w) for w in sc["workers"]]
    ax.plot(xs, [sc["workers"][str(w)]["images_per_s"] for w in xs], "s--", label="parrecio (aug.rec, + boxes)")
for key, label, m in (("mxnet_uint8", "MXNet ImageRecordIter uint8", "^"),
                      ("mxnet_float32", "MXNet ImageRecordIter float32", "v"),
                      ("pillow_loop", "1-process stock Pillow loop", "x")):
    v = p.get(key, {})
    if "images_per_s" in v:
        x = 1 if key == "pillow_loop" else v.get("preprocess_threads_requested", 2)
        ax.plot([x], [v["images_per_s"]], m, markersize=9, label=label)
ax.set_xscale("log", base=2)
ax.set_xlabel("workers (decoder processes / threads)")
ax.set_ylabel("images/s (224x224 RGB uint8)")
ax.set_title(f"{doc['cpu']['model']}, {doc['cpu']['cores']} cores, load {doc['load_before'][0]}")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
"""


def plot(doc_path: str, out: str) -> Optional[str]:
    if not os.path.exists(PLOT_PY):
        return f"{PLOT_PY} missing"
    res = subprocess.run([PLOT_PY, "-c", _PLOT, doc_path, out], capture_output=True, text=True, timeout=120)
    return None if res.returncode == 0 else res.stderr[-1500:]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="parrecio benchmark suite")
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--pipeline-json", default=None, help="reuse a stored bench_pipeline document")
    ap.add_argument("--skip-pipeline", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from bench import bench_pipeline, data as bench_data
    meta = bench_data.ensure(args.data)
    doc: Dict[str, Any] = {"benchmark": "parrecio suite", "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "load_before": [round(x, 2) for x in os.getloadavg()],
                           "cpu": {"model": cpu_model(), "cores": bench_pipeline._cores(), "flags": cpu_flags()},
                           "versions": versions(), "data": meta}
    if args.pipeline_json:
        doc["pipeline"] = json.load(open(args.pipeline_json))
        doc["pipeline"]["reused_from"] = args.pipeline_json
    elif not args.skip_pipeline:
        doc["pipeline"] = bench_pipeline.run(args.data, args.quick)
    doc["peers"] = run_peers(args.data, args.quick)
    v = doc["versions"]
    for key in ("torch_w2", "mxnet_uint8"):
        r = doc["peers"].get(key, {})
        for k in ("torch", "mxnet", "pil"):
            if k in r:
                v[f"{k}_{key.split('_')[0]}_venv"] = r[k]
    doc["summary"] = summary(doc)
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    doc["table_md"] = table(doc)
    text = json.dumps(doc, indent=2)
    if args.json or args.plot:
        path = args.json or os.path.join(HERE, "out", "suite.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
        if args.plot:
            err = plot(path, args.plot)
            doc["plot"] = args.plot if err is None else {"error": err}
            text = json.dumps(doc, indent=2)
            with open(path, "w") as f:
                f.write(text + "\n")
    print(text)
    print(doc["table_md"], file=sys.stderr)


if __name__ == "__main__":
    main()
