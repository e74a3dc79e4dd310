"""Distributed data-parallel training fed by parrecio: every rank runs the same number of steps.

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --data /tmp/ddp-demo [--epochs 3]

What it shows (see the README, "Distributed training"):

- ``num_shards="env"``: each rank reads its part (``WORLD_SIZE``/``RANK``, set by torchrun);
- ``shuffle=True`` with an ``.idx`` file: a global permutation of epoch ``e`` (``set_epoch(e)`` on every
  rank), sliced per rank, so the ranks together see every sample once per epoch, and each rank sees
  another part of the data every epoch;
- ``even_shards="pad"``: equal lengths, so no rank waits forever in the last gradient all-reduce;
- ``workers`` left at its default: the CPUs divided by ``LOCAL_WORLD_SIZE`` (the ranks of this host);
- ``DataLoader(ds, batch_size=None)``: parrecio batches; ``state_dict()`` is saved with the model.

The data (``--data`` is created when missing): ``--samples`` groups ``[features JSON][class id]``. Rank 0
prints one JSON line: the steps of every rank in every epoch, and the samples each epoch covered.
"""

from __future__ import annotations

import argparse
import json
import os

import orjson
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from parrecio import RecordWriter
from parrecio.decoders import ClassLabel, Json
from parrecio.integrations.torch import ParallelIterableDataset


def make_data(path: str, samples: int) -> None:
    """``samples`` groups of [4 features as JSON][class id], with an .idx beside the .rec."""
    g = torch.Generator().manual_seed(0)
    with RecordWriter(path, index=path[:-4] + ".idx") as w:
        for i in range(samples):
            w.write(orjson.dumps([i] + torch.randn(3, generator=g).tolist()), key=2 * i)
            w.write(str(i % 3).encode(), key=2 * i + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a folder; its train.rec is made when missing")
    ap.add_argument("--samples", type=int, default=101)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(args.data, "train.rec")
    if rank == 0 and not os.path.exists(path):
        os.makedirs(args.data, exist_ok=True)
        make_data(path, args.samples)
    dist.barrier()

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report = {"world": world, "steps": [], "samples_seen": []}
    with ParallelIterableDataset(path, fields=[Json(), ClassLabel()], batch_size=args.batch_size,
                                 shuffle=True, seed=1, num_shards="env", even_shards="pad") as ds:
        loader = DataLoader(ds, batch_size=None)
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            steps, seen = 0, []
            for features, labels in loader:
                x = torch.tensor([f[1:] for f in features])
                seen += [int(f[0]) for f in features]
                loss = torch.nn.functional.cross_entropy(model(x), labels)
                opt.zero_grad()
                loss.backward()  # the all-reduce every rank must reach
                opt.step()
                steps += 1
            counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(counts, torch.tensor([steps]))
            everyone = [None] * world
            dist.all_gather_object(everyone, seen)
            report["steps"].append([int(c) for c in counts])
            report["samples_seen"].append(sorted(set(i for s in everyone for i in s)) == list(range(args.samples)))
        report["workers_per_rank"] = ds.reader.workers
        report["state"] = ds.state_dict()
    if rank == 0:
        print(json.dumps(report), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
