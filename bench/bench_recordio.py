"""Benchmark of the RecordIO reader against MXNet's ``MXRecordIO.read()``; prints one JSON document.

Usage (from the repository root)::

    .venv/bin/python bench/bench_recordio.py [--big-mb 200] [--small-count 1000000] [--repeat 3]

It writes two files in a temporary directory (``--dir`` to choose it, ``--keep`` to keep them): ``--big-mb``
MB of 100 KB records and ``--small-count`` records of 100 B.  For each it reads the whole file once to warm
the page cache, then times (best of ``--repeat``):

- ``parrecio_iter_views``: ``for _ in RecordReader(path).iter_views()`` (zero-copy memoryviews);
- ``parrecio_iter_bytes``: ``for _ in RecordReader(path)`` (``Record`` with a ``bytes`` payload);
- ``mxnet_read``: a ``while MXRecordIO.read() is not None`` loop, run in a subprocess with the interpreter
  named by ``$PARRECIO_MXNET_PYTHON``, else ``bench/.venvs/mx/bin/python`` when it exists, else this one --
  whichever can import mxnet; skipped (with the reason) when none can.

``records_per_s`` counts records, ``MB_per_s`` payload bytes (1 MB = 10**6 bytes) per second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

MX_VENV_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venvs", "mx", "bin", "python")
SIZES = {"100KB": 100_000, "100B": 100}


def _warm(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def _mxnet_worker(path: str, repeat: int) -> None:
    """Run in the MXNet interpreter: time a plain read loop, print ``{"seconds", "records"}``."""
    import mxnet as mx

    best, n = float("inf"), 0
    for _ in range(repeat):
        r = mx.recordio.MXRecordIO(path, "r")
        n = 0
        t = time.perf_counter()
        while True:
            s = r.read()
            if s is None:
                break
            n += 1
        best = min(best, time.perf_counter() - t)
        r.close()
    print(json.dumps({"seconds": best, "records": n, "mxnet": mx.__version__}))


def _mxnet_python() -> tuple:
    """(interpreter that can import mxnet, None) or (None, reason)."""
    candidates = [os.environ.get("PARRECIO_MXNET_PYTHON"), MX_VENV_PYTHON, sys.executable]
    tried = []
    for py in candidates:
        if not py or py in tried or not os.path.exists(py):
            continue
        tried.append(py)
        ok = subprocess.run([py, "-c", "import mxnet"], capture_output=True).returncode == 0
        if ok:
            return py, None
    return None, f"mxnet not importable by {tried or 'any interpreter'}"


def _write(path: str, size: int, count: int) -> int:
    from parrecio import RecordWriter

    payload = (os.urandom(size // 2 + 1) * 2)[:size]
    with RecordWriter(path) as w:
        for _ in range(count):
            w.write(payload)
    return size * count


def _time_parrecio(path: str, mode: str, repeat: int) -> tuple:
    from parrecio import RecordReader

    best, n = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        with RecordReader(path) as r:
            n = 0
            for _ in (r.iter_views() if mode == "views" else r):
                n += 1
        best = min(best, time.perf_counter() - t)
    return best, n


def _figures(seconds: float, records: int, payload_bytes: int) -> dict:
    return {"records_per_s": round(records / seconds), "MB_per_s": round(payload_bytes / seconds / 1e6, 1),
            "seconds": round(seconds, 4), "records": records}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where to write the test files (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the test files")
    ap.add_argument("--big-mb", type=float, default=200, help="MB of 100 KB records (default 200)")
    ap.add_argument("--small-count", type=int, default=1_000_000, help="number of 100 B records")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per case, best kept (default 3)")
    ap.add_argument("--mxnet-worker", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mxnet_worker:
        _mxnet_worker(args.mxnet_worker, args.repeat)
        return

    import parrecio
    from parrecio.recordio import DEFAULT_CHUNK_SIZE

    workdir = args.dir or tempfile.mkdtemp(prefix="parrecio-bench-")
    os.makedirs(workdir, exist_ok=True)
    counts = {"100KB": max(1, int(args.big_mb * 1e6 // SIZES["100KB"])), "100B": args.small_count}
    mx_python, mx_reason = _mxnet_python()
    out = {
        "benchmark": "bench/bench_recordio.py",
        "env": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                "parrecio": parrecio.__version__, "chunk_size": DEFAULT_CHUNK_SIZE, "repeat": args.repeat,
                "mxnet_python": mx_python},
        "results": {},
    }
    try:
        for name, size in SIZES.items():
            path = os.path.join(workdir, f"bench_{name}.rec")
            payload_bytes = _write(path, size, counts[name])
            _warm(path)
            res = {"file_bytes": os.path.getsize(path), "payload_bytes": payload_bytes}
            for mode in ("views", "bytes"):
                res[f"parrecio_iter_{mode}"] = _figures(*_time_parrecio(path, mode, args.repeat), payload_bytes)
            if mx_python:
                _warm(path)
                proc = subprocess.run([mx_python, os.path.abspath(__file__), "--mxnet-worker", path,
                                       "--repeat", str(args.repeat)], capture_output=True, text=True)
                if proc.returncode == 0:
                    got = json.loads(proc.stdout.strip().splitlines()[-1])
                    res["mxnet_read"] = _figures(got["seconds"], got["records"], payload_bytes)
                    res["mxnet_read"]["mxnet"] = got["mxnet"]
                    for mode in ("views", "bytes"):
                        res[f"speedup_{mode}_vs_mxnet"] = round(
                            got["seconds"] / res[f"parrecio_iter_{mode}"]["seconds"], 2)
                else:
                    res["mxnet_read"] = {"skipped": proc.stderr.strip().splitlines()[-1:]}
            else:
                res["mxnet_read"] = {"skipped": mx_reason}
            out["results"][name] = res
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
