"""A test learner: counts steps, checkpoints, resumes, and misbehaves on request.

--hang-at STEP     stop making progress at STEP (first attempt only) while staying alive
--fail-at STEP     exit with --exit-code at STEP (every attempt, or the first with --once)
SIGTERM            write a checkpoint and exit 0 (a clean halt)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from ffdl import learner


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("FFDL_ATTEMPT", "1"))
    directory = learner.checkpoint_dir()
    directory.mkdir(parents=True, exist_ok=True)
    step = 0
    resume = learner.resume_from()
    if resume is not None:
        step = json.loads(Path(resume).read_text())["step"]
        print(f"resumed from step {step}", flush=True)
    else:
        print("starting from step 0", flush=True)

    def checkpoint() -> None:
        if rank != 0:
            return
        path = directory / f"step-{step:06d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step}))
        tmp.replace(path)
        learner.report_checkpoint(path, step)

    def on_term(signum: int, frame: object) -> None:
        checkpoint()
        print(f"halted at step {step}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while step < args.steps:
        if step == args.hang_at and attempt == 1:
            print(f"hanging at step {step}", flush=True)
            while True:
                time.sleep(3600)
        if step == args.fail_at and (attempt == 1 or not args.once):
            print(f"failing at step {step}", flush=True)
            return args.exit_code
        time.sleep(args.delay)
        step += 1
        learner.report_progress(step, loss=1.0 / step)
        if step % args.checkpoint_every == 0:
            checkpoint()
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
