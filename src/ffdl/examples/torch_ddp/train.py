"""PyTorch DistributedDataParallel, written as a ``torchrun`` user writes it: no ffdl import.

A small MLP learns to classify generated data (a fixed random teacher labels Gaussian points into
ten classes: no download). Every process joins the process group from the environment
(``init_process_group(init_method="env://")``: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, set by torchrun or by ffdl alike), takes its shard through a
``DistributedSampler``, and trains with DDP (gloo on CPUs, NCCL on GPUs, ``LOCAL_RANK`` picking the
GPU).

Checkpoints: every ``--checkpoint-every`` steps rank 0 saves ``ckpt_step_<step>.pt`` into the
checkpoint directory (``--checkpoint-dir``, default ``$CHECKPOINT_DIR`` or ``./checkpoints``),
written under a temporary name and renamed into place, so a reader never sees half a file. On
start every process loads the newest ``ckpt_step_*.pt`` there, if any, and prints ``rank R:
resumed from step N`` (else ``starting from step 0``) with its backend and device.

SIGTERM (a halt, a preemption, a cluster draining) stops training at the next step: the flag goes
through an all-reduce so every rank stops at the same step, rank 0 saves a checkpoint of it, and
every process exits 0, so the job resumes where it stopped. Rank 0 prints ``step N loss L`` every
``--log-every`` steps; the other ranks print nothing more.

    torchrun --nproc-per-node 2 -m ffdl.examples.torch_ddp.train --steps 300
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES = 32
CLASSES = 10
EXAMPLES = 8192
CHECKPOINT = re.compile(r"\Ackpt_step_(\d+)\.pt\Z")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep each step (demos)")
    return parser.parse_args(argv)


def dataset() -> TensorDataset:
    """The same points and labels in every process: a fixed seed, no download."""
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(EXAMPLES, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(points, (points @ teacher).argmax(dim=1))


def newest_checkpoint(directory: Path) -> Path | None:
    found = [
        (int(m.group(1)), path)
        for path in directory.glob("ckpt_step_*.pt")
        if (m := CHECKPOINT.match(path.name))
    ]
    return max(found)[1] if found else None


def save(directory: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    target = directory / f"ckpt_step_{step}.pt"
    partial = target.with_name(target.name + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
    os.replace(partial, target)


class StopFlag:
    """Set by SIGTERM; read at each step through an all-reduce, so every rank stops at the same step."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def restore(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Load the newest checkpoint in ``directory``, if any; the step it was saved at, else 0."""
    latest = newest_checkpoint(directory)
    if latest is None:
        return 0
    state = torch.load(latest, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    stop = StopFlag()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    directory = Path(args.checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    step = restore(directory, model, optimizer, device)
    where = f"{dist.get_backend()} on {torch.cuda.get_device_name() if cuda else 'cpu'}"
    said = f"resumed from step {step}" if step else "starting from step 0"
    print(f"rank {rank}: {said} ({where})", flush=True)
    ddp = DistributedDataParallel(model)

    data = dataset()
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    loss_fn = nn.CrossEntropyLoss()
    epoch = step // len(loader)
    last_loss = float("nan")
    while step < args.steps:
        sampler.set_epoch(epoch)
        for points, labels in loader:
            if stop.agreed(device):
                if rank == 0:
                    save(directory, step, model, optimizer)
                    print(f"stopped at step {step}: checkpoint saved", flush=True)
                dist.destroy_process_group()
                return 0
            optimizer.zero_grad()
            loss = loss_fn(ddp(points.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            last_loss = loss.item()
            step += 1
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step} loss {last_loss:.4f}", flush=True)
            if rank == 0 and step % args.checkpoint_every == 0:
                save(directory, step, model, optimizer)
            if args.step_delay:
                time.sleep(args.step_delay)
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0:
        print(f"done: {step} steps, final loss {last_loss:.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
