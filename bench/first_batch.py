"""Time to the first batch: a fresh interpreter per trial, loader construction to the first batch of 64
224x224 images of ``bench/data/images.rec`` in hand (the import of the library is timed apart and not
counted, as for the peers).  Peers and parrecio alternate trial by trial, so that they share the
machine's state of the moment::

    .venv/bin/python bench/first_batch.py [--rounds 7] [--data bench/data]

- ``parrecio_wW``: ``ParallelReader(images.rec, fields=ImageRecord(Image(size=(224, 224))), workers=W,
  batch_size=64)``, default tuning (forkserver start method).
- ``torch_dataloader_w2``: ``DataLoader(..., batch_size=64, num_workers=2)`` over bench/peers.py's
  dataset (stock Pillow, fork start method), run with ``bench/.venvs/torch`` when it exists
  (``bench/setup_peers.sh``); left out otherwise.

Trials run from bytecode, as an installed package does (``PYTHONDONTWRITEBYTECODE`` is dropped from
their environment); round 0 writes the caches and is not counted.

``--baseline PATH``: also ``parrecio_w2`` from the checkout at PATH (an earlier commit, its C extensions
built or copied in), imported through ``PYTHONPATH``: before and after in one run.

Prints one JSON object: per loader the median and the best of its trials, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_PY = os.path.join(HERE, ".venvs", "torch", "bin", "python")

_PARRECIO = r"""
import json, os, sys, time
t_import = time.perf_counter()
from parrecio import ParallelReader
from parrecio.decoders import Image, ImageRecord
t0 = time.perf_counter()
r = ParallelReader(os.path.join(sys.argv[1], "images.rec"), fields=ImageRecord(Image(size=(224, 224))),
                   workers=int(sys.argv[2]), batch_size=64)
it = iter(r)  # (held: a dropped iterator ends its pass before t1 is read)
images, labels = next(it)
t1 = time.perf_counter()
assert images.shape == (64, 224, 224, 3), images.shape
r.close()
print(json.dumps({"seconds": t1 - t0, "import_s": t0 - t_import}))
"""

_TORCH = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
t_import = time.perf_counter()
import torch
from torch.utils.data import DataLoader, Dataset
from bench.peers import RecFile, decode_pil, read_index
class RecDataset(Dataset):
    def __init__(self, data):
        self.offsets = read_index(os.path.join(data, "images.idx"))
        self.rec = RecFile(os.path.join(data, "images.rec"))
    def __len__(self):
        return len(self.offsets)
    def __getitem__(self, i):
        return decode_pil(self.rec.read(self.offsets[i]))
if __name__ == "__main__":
    t0 = time.perf_counter()
    loader = DataLoader(RecDataset(sys.argv[1]), batch_size=64, num_workers=int(sys.argv[2]))
    it = iter(loader)
    images, labels = next(it)
    t1 = time.perf_counter()
    assert tuple(images.shape) == (64, 224, 224, 3), images.shape
    print(json.dumps({"seconds": t1 - t0, "import_s": t0 - t_import}))
"""


def _trial(python: str, code: str, *args: str, path: str = "") -> Dict[str, float]:
    env = dict(os.environ)
    # As an installed package runs: from bytecode (pip compiles it at install).  Without this, a shell
    # with PYTHONDONTWRITEBYTECODE=1 compiles every module of a source checkout at each start, in the
    # fork server too: +60 ms here, none of it a user's.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if path:
        env["PYTHONPATH"] = path
    res = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env,
                         cwd="/")  # not this checkout: `python -c` puts the working directory first on sys.path
    if res.returncode != 0:
        raise RuntimeError(f"first-batch probe failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--rounds", type=int, default=7, help="trials per loader (interleaved)")
    ap.add_argument("--baseline", default="", help="a checkout of an earlier parrecio, timed beside this one")
    args = ap.parse_args(argv)
    loaders = {"parrecio_w2": (sys.executable, _PARRECIO, args.data, "2"),
               "parrecio_w8": (sys.executable, _PARRECIO, args.data, "8")}
    if args.baseline:
        loaders["baseline_parrecio_w2"] = (sys.executable, _PARRECIO, args.data, "2")
    if os.path.exists(TORCH_PY):
        loaders["torch_dataloader_w2"] = (TORCH_PY, _TORCH, args.data, "2", os.path.dirname(HERE))
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in loaders}
    for round_ in range(args.rounds + 1):  # (round 0 writes the bytecode caches, and is left out)
        for name, (python, code, *rest) in loaders.items():
            path = os.path.abspath(args.baseline) if name.startswith("baseline") else ""
            trial = _trial(python, code, *rest, path=path)
            if round_:
                runs[name].append(trial)
    out: Dict[str, object] = {"cpus": os.cpu_count(), "rounds": args.rounds}
    for name, trials in runs.items():
        secs = [t["seconds"] for t in trials]
        out[name] = {"median_s": round(statistics.median(secs), 3), "best_s": round(min(secs), 3),
                     "trials_s": [round(s, 3) for s in secs],
                     "import_median_s": round(statistics.median(t["import_s"] for t in trials), 3)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
