"""Data-parallel softmax regression on scikit-learn's digits: a real learner for ffdl.

Every rank loads the bundled digits data set (no download), holds out the same test split (fixed
seed) and trains on its own shard of the rest (every ``WORLD_SIZE``-th example from ``RANK`` on).
Training is synchronous data-parallel SGD: each step every rank computes the gradient of the
cross-entropy on a mini-batch of its shard, and the ranks average their gradients through a small
TCP allreduce. Rank 0 listens on ``MASTER_ADDR:MASTER_PORT``; the others connect (retrying until it
is up, within a bound), send their gradient, and get the mean back, so all ranks apply the same
update and stay in sync. The mini-batches are drawn from a generator seeded with (seed, rank,
step), so a resumed run draws what the original run would have drawn.

Checkpoints: every ``--checkpoint-every`` steps rank 0 writes the weights and the step into
``FFDL_CHECKPOINT_DIR`` (written to a temporary file, then renamed into place) and reports it with
:func:`ffdl.learner.report_checkpoint`. On start every rank loads ``ffdl.learner.resume_from()`` if
it is set and prints ``resumed from step N`` (else ``starting from step 0``).

Stopping: SIGTERM (or SIGINT) is a halt. The rank that sees it first at a step boundary tells the
others (a stop message through the allreduce), rank 0 writes a checkpoint of the last completed
step, and every rank exits with status 0, so a halted job resumes exactly where it stopped. A rank
that loses a peer without a stop (the peer was killed) exits with status 1.

The end: rank 0 prints ``final test accuracy: 0.9xx``, reports it as the metric ``accuracy`` and
writes the final weights to ``RESULT_DIR/model.npz``.

Outside the platform it runs as a single rank: ``python -m ffdl.examples.digits.train``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

import numpy as np
import numpy.typing as npt
from sklearn.datasets import load_digits

from ffdl import learner

Array = npt.NDArray[np.float64]

SEED = 7
TEST_FRACTION = 0.2
BATCH_PER_RANK = 64
CLASSES = 10
CONNECT_TIMEOUT_S = 60.0
EXCHANGE_TIMEOUT_S = 120.0
ACCEPT_POLL_S = 0.5
CONNECT_RETRY_S = 0.1

# One message of the allreduce: the step it belongs to (or STOP) and the payload's length in bytes,
# then the payload (little-endian float64). A peer's first message is its rank.
HEADER = struct.Struct("!qQ")
HELLO = struct.Struct("!q")
STOP = -1
WIRE_DTYPE = np.dtype("<f8")


class GangStopError(Exception):
    """The gang is halting: this rank got SIGTERM or a peer said so."""


class PeerLostError(Exception):
    """A peer went away without saying it was stopping."""


class StopFlag:
    """Set by SIGTERM and SIGINT; checked at step boundaries (the handler only sets the flag)."""

    def __init__(self) -> None:
        self.requested = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


@dataclass(frozen=True)
class Data:
    train_x: Array
    train_y: npt.NDArray[np.int64]
    test_x: Array
    test_y: npt.NDArray[np.int64]


def load_data(rank: int, world_size: int) -> Data:
    """The same test split on every rank, and this rank's shard of the training examples."""
    digits = load_digits()
    features = np.hstack([digits.data / 16.0, np.ones((len(digits.data), 1))])  # pixels in [0, 1], bias
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(features))
    test_size = int(len(features) * TEST_FRACTION)
    test, train = order[:test_size], order[test_size:]
    shard = train[rank::world_size]
    return Data(features[shard], labels[shard], features[test], labels[test])


def loss_and_gradient(weights: Array, x: Array, y: npt.NDArray[np.int64]) -> tuple[float, Array]:
    """Mean cross-entropy of softmax(x @ weights) and its gradient with respect to the weights."""
    logits = x @ weights
    logits -= logits.max(axis=1, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(probabilities[rows, y] + 1e-12).mean())
    probabilities[rows, y] -= 1.0
    return loss, x.T @ probabilities / len(y)


def accuracy(weights: Array, x: Array, y: npt.NDArray[np.int64]) -> float:
    return float(((x @ weights).argmax(axis=1) == y).mean())


# --------------------------------------------------------------------------- the allreduce


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        chunk = connection.recv(size - len(buffer))
        if not chunk:
            raise PeerLostError("connection closed")
        buffer += chunk
    return bytes(buffer)


def _send(connection: socket.socket, step: int, vector: Array | None) -> None:
    payload = b"" if vector is None else vector.astype(WIRE_DTYPE).tobytes()
    connection.sendall(HEADER.pack(step, len(payload)) + payload)


def _receive(connection: socket.socket, step: int) -> Array:
    received_step, size = HEADER.unpack(_receive_exactly(connection, HEADER.size))
    if received_step == STOP:
        raise GangStopError("a peer is stopping")
    if received_step != step:
        raise PeerLostError(f"peer is at step {received_step}, this rank at {step}")
    return np.frombuffer(_receive_exactly(connection, size), dtype=WIRE_DTYPE).astype(np.float64)


class GradientAverager:
    """Synchronous allreduce over TCP: rank 0 gathers every rank's vector and sends back the mean."""

    def __init__(self, rank: int, world_size: int, address: str, port: int, stop: StopFlag) -> None:
        self.rank = rank
        self.world_size = world_size
        self._address = address
        self._port = port
        self._stop = stop
        self._peers: dict[int, socket.socket] = {}

    def __enter__(self) -> GradientAverager:
        if self.world_size > 1 and self.rank == 0:
            self._listen_for_peers()
        elif self.world_size > 1:
            self._connect_to_rank_0()
        for connection in self._peers.values():
            connection.settimeout(EXCHANGE_TIMEOUT_S)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for connection in self._peers.values():
            connection.close()
        self._peers.clear()

    def average(self, step: int, vector: Array) -> Array:
        """The mean of every rank's ``vector`` for ``step``; raises :class:`GangStopError` on a halt."""
        if self.world_size == 1:
            return vector
        try:
            if self.rank != 0:
                _send(self._peers[0], step, vector)
                return _receive(self._peers[0], step)
            total = vector.copy()
            for connection in self._peers.values():
                total += _receive(connection, step)
            mean = total / self.world_size
            for connection in self._peers.values():
                _send(connection, step, mean)
            return mean
        except (PeerLostError, OSError) as error:
            if self._stop.requested:
                raise GangStopError("stopping") from error
            raise PeerLostError(f"lost a peer at step {step}: {error}") from error

    def announce_stop(self) -> None:
        """Tell the peers this rank is stopping (best effort: a peer may be gone already)."""
        for connection in self._peers.values():
            try:
                _send(connection, STOP, None)
            except OSError:
                continue

    def _listen_for_peers(self) -> None:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        with socket.create_server((self._address, self._port), reuse_port=False) as server:
            server.settimeout(ACCEPT_POLL_S)
            while len(self._peers) < self.world_size - 1:
                if self._stop.requested:
                    raise GangStopError("stopped while waiting for peers")
                if time.monotonic() > deadline:
                    raise PeerLostError(f"only {len(self._peers)} of {self.world_size - 1} peers connected")
                try:
                    connection, _ = server.accept()
                except TimeoutError:
                    continue
                connection.settimeout(CONNECT_TIMEOUT_S)
                (peer_rank,) = HELLO.unpack(_receive_exactly(connection, HELLO.size))
                self._peers[peer_rank] = connection
        self._peers = dict(sorted(self._peers.items()))

    def _connect_to_rank_0(self) -> None:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            if self._stop.requested:
                raise GangStopError("stopped while connecting to rank 0")
            try:
                connection = socket.create_connection((self._address, self._port), timeout=CONNECT_TIMEOUT_S)
                break
            except OSError as error:
                if time.monotonic() > deadline:
                    raise PeerLostError(
                        f"rank 0 at {self._address}:{self._port} is unreachable: {error}"
                    ) from error
                time.sleep(CONNECT_RETRY_S)
        connection.sendall(HELLO.pack(self.rank))
        self._peers[0] = connection


# --------------------------------------------------------------------------- checkpoints


def save_atomically(path: Path, weights: Array, step: int) -> None:
    """Write the weights and the step to ``path`` so that a reader never sees half a file."""
    partial = path.with_name(path.name + ".tmp")
    with partial.open("wb") as stream:
        np.savez(stream, weights=weights, step=np.int64(step))
        stream.flush()
        os.fsync(stream.fileno())
    partial.replace(path)


def write_checkpoint(weights: Array, step: int) -> Path:
    path = learner.checkpoint_dir() / f"step-{step:06d}.npz"
    save_atomically(path, weights, step)
    learner.report_checkpoint(path, step)
    return path


def load_checkpoint(path: Path) -> tuple[Array, int]:
    with np.load(path) as checkpoint:
        return np.asarray(checkpoint["weights"], dtype=np.float64), int(checkpoint["step"])


# --------------------------------------------------------------------------- training


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=300, help="train until this step (default 300)")
    parser.add_argument("--lr", type=float, default=1.0, help="learning rate (default 1.0)")
    parser.add_argument("--step-delay", type=float, default=0.05, help="seconds to pause after each step")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    return parser.parse_args(argv)


def train(
    args: argparse.Namespace,
    data: Data,
    averager: GradientAverager,
    *,
    stop: StopFlag,
    weights: Array,
    step: int,
) -> None:
    """Train from ``step`` to ``args.steps``; raises :class:`GangStopError` when the gang halts."""
    last_checkpoint = step
    try:
        while step < args.steps:
            if stop.requested:
                raise GangStopError("SIGTERM")
            batch = np.random.default_rng([SEED, averager.rank, step]).choice(
                len(data.train_y), size=min(BATCH_PER_RANK, len(data.train_y)), replace=False
            )
            loss, gradient = loss_and_gradient(weights, data.train_x[batch], data.train_y[batch])
            mean = averager.average(step, np.append(gradient.ravel(), loss))
            weights = weights - args.lr * mean[:-1].reshape(weights.shape)
            step += 1
            metrics = {"loss": float(mean[-1])}
            if step % args.checkpoint_every == 0:
                metrics["accuracy"] = accuracy(weights, data.test_x, data.test_y)
                print(
                    f"step {step} loss {metrics['loss']:.4f} test accuracy {metrics['accuracy']:.3f}",
                    flush=True,
                )
                if averager.rank == 0:
                    write_checkpoint(weights, step)
                    last_checkpoint = step
            learner.report_progress(step, **metrics)
            time.sleep(args.step_delay)
    except GangStopError:
        averager.announce_stop()
        if averager.rank == 0 and step > last_checkpoint:
            write_checkpoint(weights, step)
        print(f"halted at step {step}", flush=True)
        raise
    if averager.rank != 0:
        print(f"rank {averager.rank} finished at step {step}", flush=True)
        return
    final_accuracy = accuracy(weights, data.test_x, data.test_y)
    result_dir = Path(os.environ.get("RESULT_DIR") or "results")
    result_dir.mkdir(parents=True, exist_ok=True)
    save_atomically(result_dir / "model.npz", weights, step)
    learner.report_progress(step, accuracy=final_accuracy)
    print(f"final test accuracy: {final_accuracy:.3f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    stop = StopFlag()
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    data = load_data(rank, world_size)
    weights: Array = np.zeros((data.train_x.shape[1], CLASSES))
    step = 0
    resume = learner.resume_from()
    if resume is not None:
        weights, step = load_checkpoint(resume)
        print(f"resumed from step {step}", flush=True)
    else:
        print("starting from step 0", flush=True)
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    try:
        with GradientAverager(rank, world_size, address, port, stop) as averager:
            train(args, data, averager, stop=stop, weights=weights, step=step)
    except GangStopError:
        return 0
    except PeerLostError as error:
        print(f"rank {rank}: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
