"""Scheduler benchmark: how fast one planning step decides, against a naive first-fit baseline.

Cluster: 1,000 nodes x 8 GPUs. Queue: 20,000 waiting jobs from the Philly-shaped generator
(``ffdl.tools.traces``), all queued at once. Two cycles are measured, as the scheduler role
runs them:

* ``cold``: the empty cluster fills up; most jobs are then left waiting, each with its reason;
* ``churn``: a tenth of the running jobs end, and the queue is weighed again (with the reasons and
  reservations the first cycle recorded).

A *decision* is the planner's verdict for one waiting job: GPUs now, or why not. Its latency is
timed around each step of ``Planner.decisions()``. The baseline places each learner on the first
node with room, scanning the node list, in priority-then-FIFO order, without quotas, reasons,
reservations or preemption. Each cycle runs three times from scratch and the fastest run counts
(the machine is shared: the slower runs measure the neighbours); its CPU time is reported beside
the wall time, and the load average with the figures. Peak memory is measured by ``tracemalloc``
in a separate cold cycle (tracing slows the code, so the timed runs go without it).

Last, the simulator's speed (``ffdl simulate``'s engine, ``ffdl.core.simulation``) on the same
cluster, under ffdl's policy as ``ffdl simulate`` runs it by default, the configured one
(``Settings().scheduler_policy()``, least-attained-service bands included): 100,000-job traces
at offered load 0.9 and at 1.3 (overload: queues form and preemptions follow), in simulated jobs
per wall second and per CPU second. The baseline for it, in the same run, is the planner weighing
every waiting job on its own each step (``weigh_all``: the same decisions, checked by the digest
of every job's outcome) on a shorter trace at load 1.3 (``--baseline-jobs``, 20,000 by default;
it grows with the queue, so 100,000 would take many minutes).

With ``--only demands``: one planning step over 3,000 waiting jobs of one tenant on a full cluster,
all of one demand (the baseline) and each of a demand of its own (CPUs stepped by a thousandth), in
CPU seconds and their ratio: what a tenant that varies its demands costs every step; and the same
step with every run's end looked up by demand, as before runs were read job by job.

With ``--only tenants``: a simulation of ``--tenants`` jobs, one a second, each of one GPU for a
minute, on 4 x 8 GPUs (a queue grows to most of them), each job of a tenant of its own, against the
same jobs of one tenant (the baseline), in CPU seconds and their ratio: what the tenants with
waiting jobs cost every step.

With ``--only backlog``: the load-1.3 trace again, each planning step's share of the run (from its
start to the next step's: the simulator's bookkeeping included) and the waiting jobs whose recorded
reason it changed, per tenth of the run's steps: how a step's cost follows the backlog.

Last, with ``--only philly``: the whole Philly trace (``../shared/traces/philly.csv``, 82,247 jobs;
read where it lies, never copied) replayed through ffdl's configured policy (bands included, as
above) on ``--philly-nodes`` x 8 GPUs.

With ``--only compiled``: the Philly replay and the load-1.3 trace, each ``--rounds`` times
compiled (``make native``, ``ffdl.native``) and on the sources (``FFDL_COMPILED=0``), alternately,
each run in a process of its own: the seconds of each, the ratio of the medians, and whether the two
builds decided every job alike. Every other part runs the build the interpreter finds (its JSON
says which: ``compiled``).

Run from the repository root (takes a few minutes):

    .venv/bin/python bench/scheduler_bench.py [--json]
    .venv/bin/python bench/scheduler_bench.py --only simulator [--simulated-jobs 20000 --baseline-jobs 5000]
    .venv/bin/python bench/scheduler_bench.py --only philly [--philly PATH --philly-nodes 64]
    .venv/bin/python bench/scheduler_bench.py --only tenants [--tenants 2000]
    .venv/bin/python bench/scheduler_bench.py --only backlog [--simulated-jobs 100000]
    .venv/bin/python bench/scheduler_bench.py --only compiled [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from unittest.mock import patch

from ffdl import native
from ffdl.core import scheduling, simulation
from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState, Demand, HeldJob
from ffdl.core.scheduling import Plan, Planner, SchedulerPolicy, WaitingJob, WaitingQueue
from ffdl.core.simulation import SimulationResult, TraceJob, percentile, simulate
from ffdl.tools.simulate import homogeneous_cluster
from ffdl.tools.trace_formats import load_trace
from ffdl.tools.traces import generate_trace
from ffdl.wiring.config import Settings

NODES = 1000
GPUS_PER_NODE = 8
QUEUED_JOBS = 20_000
SIMULATED_JOBS = 100_000
SEED = 7
NOW = 1_000_000.0
RUNS = 3
PHILLY = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "philly.csv"


@dataclass(frozen=True, slots=True)
class CycleFigures:
    decisions: int
    placed: int
    seconds: float
    cpu_seconds: float
    latencies: list[float]

    def report(self) -> dict[str, Any]:
        return {
            "decisions": self.decisions,
            "placed": self.placed,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "decisions_per_s": round(self.decisions / self.seconds),
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 4),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 4),
            "max_ms": round(max(self.latencies) * 1000, 3),
        }


def waiting_jobs(trace: Sequence[TraceJob]) -> list[WaitingJob]:
    return [
        WaitingJob(
            job.job_id,
            job.tenant,
            Demand(job.learners, job.gpus_per_learner),
            job.priority,
            (float(index), job.job_id),
        )
        for index, job in enumerate(trace)
    ]


def timed(steps: Iterator[Any], placed: Callable[[Any], bool]) -> CycleFigures:
    latencies = []
    count = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    while True:
        before = time.perf_counter()
        try:
            decision = next(steps)
        except StopIteration:
            break
        latencies.append(time.perf_counter() - before)
        count += placed(decision)
    cpu = time.process_time() - cpu_started
    return CycleFigures(len(latencies), count, time.perf_counter() - started, cpu, latencies)


def fastest(run: Callable[[], tuple[CycleFigures, CycleFigures]]) -> tuple[CycleFigures, CycleFigures]:
    """The fastest of ``RUNS`` runs of both cycles, each cycle judged on its own."""
    runs = [run() for _ in range(RUNS)]
    return min((r[0] for r in runs), key=lambda f: f.seconds), min(
        (r[1] for r in runs), key=lambda f: f.seconds
    )


def planner_cycles(nodes: list[Node], queue: list[WaitingJob]) -> tuple[CycleFigures, CycleFigures]:
    policy = SchedulerPolicy()
    state = ClusterState(nodes)
    decisions: list[Any] = []

    def keep(decision: Any) -> bool:
        decisions.append(decision)
        return decision.allocation is not None

    cold = timed(Planner(state, queue, NOW, policy).decisions(), keep)
    rng = random.Random(SEED)
    for job_id in rng.sample(sorted(state.held), len(state.held) // 10):
        state.release(job_id)
    still_waiting = [
        d.job if d.wait is None else _with_wait(d.job, d.wait) for d in decisions if d.allocation is None
    ]
    churn = timed(
        Planner(state, still_waiting, NOW + 3600, policy).decisions(), lambda d: d.allocation is not None
    )
    return cold, churn


def _with_wait(job: WaitingJob, wait: Any) -> WaitingJob:
    return WaitingJob(job.job_id, job.tenant, job.demand, job.priority, job.queued_order, wait)


class FirstFit:
    """The naive baseline: each learner on the first node with room, scanning the node list."""

    def __init__(self, nodes: list[Node]) -> None:
        self.free = [node.gpus for node in nodes]
        self.held: dict[str, list[tuple[int, int]]] = {}

    def decide(self, job: WaitingJob) -> bool:
        taken: list[tuple[int, int]] = []
        for _ in range(job.demand.learners):
            for index, free in enumerate(self.free):
                if free >= job.demand.gpus:
                    self.free[index] -= job.demand.gpus
                    taken.append((index, job.demand.gpus))
                    break
            else:
                for index, gpus in taken:
                    self.free[index] += gpus
                return False
        self.held[job.job_id] = taken
        return True

    def release(self, job_id: str) -> None:
        for index, gpus in self.held.pop(job_id):
            self.free[index] += gpus

    def decisions(self, queue: list[WaitingJob]) -> Iterator[bool]:
        for job in sorted(queue, key=lambda job: (-job.priority, job.queued_order)):
            yield self.decide(job)


def baseline_cycles(nodes: list[Node], queue: list[WaitingJob]) -> tuple[CycleFigures, CycleFigures]:
    first_fit = FirstFit(nodes)
    cold = timed(first_fit.decisions(queue), bool)
    rng = random.Random(SEED)
    for job_id in rng.sample(sorted(first_fit.held), len(first_fit.held) // 10):
        first_fit.release(job_id)
    waiting = [job for job in queue if job.job_id not in first_fit.held]
    churn = timed(first_fit.decisions(waiting), bool)
    return cold, churn


def peak_memory_mib(nodes: list[Node], queue: list[WaitingJob]) -> float:
    tracemalloc.start()
    Planner(ClusterState(nodes), queue, NOW, SchedulerPolicy()).run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def simulator_speed(nodes: list[Node], jobs: int, load: float, weigh_all: bool = False) -> dict[str, Any]:
    trace = generate_trace(jobs, nodes=NODES, gpus_per_node=GPUS_PER_NODE, load=load, seed=SEED)
    policy = Settings().scheduler_policy()
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = simulate(trace, nodes, policy, weigh_all=weigh_all)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    return {
        "jobs": jobs,
        "load": load,
        "planner": "weighs every job" if weigh_all else "passes over settled jobs",
        "compiled": native.active(),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "jobs_per_s": round(jobs / seconds),
        "jobs_per_cpu_s": round(jobs / cpu_seconds),
        "scheduling_cycles": result.cycles,
        "preemptions": result.preemptions,
        "max_gpus_in_use": result.max_gpus_in_use,
        "outcomes_digest": outcomes_digest(result),
    }


def outcomes_digest(result: SimulationResult) -> str:
    """Every job's start, end and last reason, hashed: two runs that decided alike have the same."""
    digest = hashlib.sha256()
    for outcome in result.outcomes:
        wait = outcome.last_wait
        said = None if wait is None else (wait.code, wait.detail, wait.waiting_for, wait.reserved_nodes)
        digest.update(repr((outcome.job.job_id, outcome.first_start, outcome.end, said)).encode())
    return digest.hexdigest()[:16]


class _NotingPlanner(Planner):
    """The planner, noting when each step starts, the jobs waiting then, and how many of them the
    step gives a reason other than the one recorded (what the simulator then records again)."""

    noted: ClassVar[list[tuple[float, int, int]]] = []  # (start, jobs waiting, reasons changed)

    def run(self) -> Plan:
        started = time.perf_counter()
        plan = super().run()
        queue = self._queue
        changed = 0
        for job_id, wait in plan.waits.items():
            job = queue.get(job_id)
            changed += job is None or not wait.same_as(job.wait)
        self.noted.append((started, len(queue), changed))
        return plan


def backlog_run(nodes: list[Node], jobs: int, tenths: int = 10) -> dict[str, Any]:
    """The load-1.3 trace with every step noted (:class:`_NotingPlanner`), summed per tenth of its
    steps: the jobs waiting, the microseconds from a step's start to the next one's, and the
    reasons it changed."""
    trace = generate_trace(jobs, nodes=NODES, gpus_per_node=GPUS_PER_NODE, load=1.3, seed=SEED)
    noted: list[tuple[float, int, int]] = []
    _NotingPlanner.noted = noted
    with patch.object(simulation, "Planner", _NotingPlanner):  # the planner the simulator runs
        started = time.perf_counter()
        simulate(trace, nodes, Settings().scheduler_policy())
        ended = time.perf_counter()
    starts = [at for at, _, _ in noted] + [ended]
    rows = []
    tenths = min(tenths, len(noted))  # a short trace plans fewer steps than that
    for tenth in range(tenths):
        low, high = tenth * len(noted) // tenths, (tenth + 1) * len(noted) // tenths
        steps = high - low
        rows.append(
            {
                "steps": steps,
                "waiting_mean": round(sum(waiting for _, waiting, _ in noted[low:high]) / steps),
                "us_per_step": round((starts[high] - starts[low]) / steps * 1e6),
                "reasons_changed_per_step": round(sum(changed for *_, changed in noted[low:high]) / steps, 1),
            }
        )
    return {"jobs": jobs, "load": 1.3, "seconds": round(ended - started, 2), "tenths": rows}


def philly_replay(path: Path, nodes: int) -> dict[str, Any]:
    """ffdl's configured policy over the whole Philly trace on ``nodes`` x 8 GPUs: wall and CPU time."""
    trace = load_trace(path, GPUS_PER_NODE).jobs
    policy = Settings().scheduler_policy()
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = simulate(trace, homogeneous_cluster(nodes, GPUS_PER_NODE), policy)
    seconds = time.perf_counter() - started
    return {
        "trace": str(path),
        "jobs": len(trace),
        "nodes": nodes,
        "compiled": native.active(),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "jobs_per_s": round(len(trace) / seconds),
        "scheduling_cycles": result.cycles,
        "preemptions": result.preemptions,
        "outcomes_digest": outcomes_digest(result),
    }


def compiled_runs(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    """The Philly replay and the generated load-1.3 trace, each run ``rounds`` times compiled and on
    the sources (``FFDL_COMPILED=0``), alternately, each run in a process of its own (the baseline
    in the same run): the seconds of each, the median ratio, and whether the two decided alike."""
    parts = {
        "philly": [
            "--only",
            "philly",
            "--philly",
            str(args.philly),
            "--philly-nodes",
            str(args.philly_nodes),
        ],
        "simulator": ["--only", "simulator", "--simulated-jobs", str(args.simulated_jobs)],
    }
    figures: dict[str, Any] = {}
    for part, part_args in parts.items():
        runs: dict[str, list[dict[str, Any]]] = {"compiled": [], "sources": []}
        for _ in range(rounds):
            for build, switch in (("compiled", "1"), ("sources", "0")):
                ran = subprocess.run(
                    [sys.executable, __file__, *part_args, "--baseline-jobs", "0", "--json"],
                    env={**os.environ, native.SWITCH: switch},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                run = json.loads(ran.stdout)
                run = run["simulator"][1] if part == "simulator" else run  # the load-1.3 run
                if run["compiled"] != (build == "compiled"):
                    raise SystemExit(f"{part}: asked for the {build} build, another one ran")
                runs[build].append(run)
        seconds = {build: sorted(run["seconds"] for run in done) for build, done in runs.items()}
        compiled, sources = seconds["compiled"], seconds["sources"]
        figures[part] = {
            "compiled_s": compiled,
            "sources_s": sources,
            "sources_over_compiled": round(sources[rounds // 2] / compiled[rounds // 2], 2),
            "decided_alike": len({run["outcomes_digest"] for done in runs.values() for run in done}) == 1,
        }
    return figures


def demand_runs(jobs: int = 3000) -> dict[str, Any]:
    """One planning step over ``jobs`` waiting jobs of one tenant on a full cluster (128 x 8 GPUs),
    their reasons recorded by the step before: all of one demand (the baseline), then each of a
    demand of its own (CPUs stepped by a thousandth), as a tenant may submit them."""

    def step(distinct: bool) -> float:
        def cluster() -> ClusterState:
            state = ClusterState(homogeneous_cluster(128, GPUS_PER_NODE))
            for index in range(128):
                gang = state.room.find(Demand(1, 8))
                assert gang is not None
                state.hold(HeldJob(f"held-{index}", "b", Demand(1, 8), 0, gang, 0.0))
            return state

        queue = WaitingQueue(
            WaitingJob(
                f"a{i:05d}",
                "a",
                Demand(2, 8, None, 1000 + (i if distinct else 0)),
                0,
                (float(i), f"a{i:05d}"),
            )
            for i in range(jobs)
        )
        for job_id, wait in Planner(cluster(), queue, NOW, SchedulerPolicy()).run().waits.items():
            job = queue.get(job_id)
            assert job is not None
            queue.put(job.with_wait(wait))
        state = cluster()
        started = time.process_time()
        Planner(state, queue, NOW + 1, SchedulerPolicy()).run()
        return time.process_time() - started

    alike, distinct = min(step(False) for _ in range(RUNS)), min(step(True) for _ in range(RUNS))
    configured = scheduling.SHORT_RUN
    scheduling.SHORT_RUN = jobs + 1  # no run read job by job: each end looked up by demand, as before
    try:
        looked_up = min(step(True) for _ in range(RUNS))
    finally:
        scheduling.SHORT_RUN = configured
    return {
        "jobs": jobs,
        "step_cpu_s_one_demand": round(alike, 4),
        "step_cpu_s_a_demand_each": round(distinct, 4),
        "step_cpu_s_a_demand_each_looked_up_by_demand": round(looked_up, 3),
        "a_demand_each_over_one_demand": round(distinct / max(alike, 1e-6), 1),
    }


def tenant_runs(jobs: int) -> dict[str, Any]:
    """``jobs`` one-GPU jobs, one a second, on 4 x 8 GPUs: each of a tenant of its own, and (the
    baseline) all of one tenant; the same decisions but for whose jobs go first."""

    def run(tenant: Callable[[int], str]) -> float:
        trace = [TraceJob(f"job-{i}", float(i), tenant(i), 1, 1, 60.0) for i in range(jobs)]
        started = time.process_time()
        simulate(trace, homogeneous_cluster(4, GPUS_PER_NODE), Settings().scheduler_policy())
        return time.process_time() - started

    one, each = run(lambda _: "one"), run(lambda i: f"tenant-{i}")
    return {
        "jobs": jobs,
        "cpu_s_one_tenant": round(one, 2),
        "cpu_s_a_tenant_each": round(each, 2),
        "a_tenant_each_over_one_tenant": round(each / max(one, 1e-6), 1),
    }


def simulator_runs(nodes: list[Node], jobs: int, baseline_jobs: int) -> list[dict[str, Any]]:
    runs = [simulator_speed(nodes, jobs, 0.9), simulator_speed(nodes, jobs, 1.3)]
    if baseline_jobs:
        runs.append(simulator_speed(nodes, baseline_jobs, 1.3))
        runs.append(simulator_speed(nodes, baseline_jobs, 1.3, weigh_all=True))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--only",
        choices=["simulator", "philly", "demands", "tenants", "backlog", "compiled"],
        help="run only that part",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each build with --only compiled")
    parser.add_argument("--tenants", type=int, default=2000, help="jobs (and tenants) of --only tenants")
    parser.add_argument("--philly", type=Path, default=PHILLY, help="the Philly job table (philly.csv)")
    parser.add_argument("--philly-nodes", type=int, default=64, help="8-GPU nodes of the Philly replay")
    parser.add_argument("--simulated-jobs", type=int, default=SIMULATED_JOBS, help="jobs per simulated trace")
    parser.add_argument(
        "--baseline-jobs", type=int, default=20_000, help="jobs of the load-1.3 baseline trace (0: none)"
    )
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    nodes = homogeneous_cluster(NODES, GPUS_PER_NODE)
    if args.only == "philly":
        replay = philly_replay(args.philly, args.philly_nodes)
        replay["load_average"] = [load_at_start, os.getloadavg()[0]]
        print(json.dumps(replay, indent=2) if args.json else replay)
        return
    if args.only == "tenants":
        figures = tenant_runs(args.tenants)
        print(json.dumps(figures, indent=2) if args.json else figures)
        return
    if args.only == "compiled":
        figures = compiled_runs(args, args.rounds)
        print(json.dumps(figures, indent=2) if args.json else figures)
        return
    if args.only == "backlog":
        if native.active():  # it notes each step through a planner patched in: on the sources
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, native.SWITCH: "0"})
        print_backlog(backlog_run(nodes, args.simulated_jobs), args.json)
        return
    if args.only == "demands":
        figures = demand_runs()
        print(json.dumps(figures, indent=2) if args.json else figures)
        return
    if args.only == "simulator":
        runs = simulator_runs(nodes, args.simulated_jobs, args.baseline_jobs)
        load = {"load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0]}
        if args.json:  # one JSON object, as without --only
            print(json.dumps({"simulator": runs, **load}, indent=2))
        else:
            print_simulator(runs)
            print(f"load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
        return
    queue = waiting_jobs(generate_trace(QUEUED_JOBS, nodes=NODES, gpus_per_node=GPUS_PER_NODE, seed=SEED))
    cold, churn = fastest(lambda: planner_cycles(nodes, queue))
    naive_cold, naive_churn = fastest(lambda: baseline_cycles(nodes, queue))
    report: dict[str, Any] = {
        "machine": f"{platform.python_implementation()} {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
        "cluster": f"{NODES} nodes x {GPUS_PER_NODE} GPUs",
        "queued_jobs": QUEUED_JOBS,
        "planner": {"cold": cold.report(), "churn": churn.report()},
        "first_fit_baseline": {"cold": naive_cold.report(), "churn": naive_churn.report()},
        "speedup_over_baseline": {
            "cold": round(naive_cold.seconds / cold.seconds, 1),
            "churn": round(naive_churn.seconds / churn.seconds, 1),
        },
        "planner_peak_memory_mib": round(peak_memory_mib(nodes, queue), 1),
        "simulator": simulator_runs(nodes, args.simulated_jobs, args.baseline_jobs),
    }
    report["machine"] += f" (at the start: {load_at_start:.1f})"
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name in ("planner", "first_fit_baseline"):
        for cycle, figures in report[name].items():
            print(
                f"{name:>18} {cycle:>5}: {figures['decisions']} decisions ({figures['placed']} placed) in "
                f"{figures['seconds']} s ({figures['cpu_seconds']} s CPU) = {figures['decisions_per_s']}/s; "
                f"p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms, max {figures['max_ms']} ms"
            )
    print(f"speed-up over first fit: {report['speedup_over_baseline']}")
    print(f"planner peak memory (tracemalloc, cold cycle): {report['planner_peak_memory_mib']} MiB")
    print_simulator(report["simulator"])
    print(report["machine"])


def print_backlog(figures: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{figures['jobs']} jobs at load 1.3 in {figures['seconds']} s; per tenth of the steps:")
    for tenth, row in enumerate(figures["tenths"], 1):
        print(
            f"{tenth:>3}: {row['steps']} steps, {row['waiting_mean']} waiting, "
            f"{row['us_per_step']} µs a step, {row['reasons_changed_per_step']} reasons changed a step"
        )


def print_simulator(runs: list[dict[str, Any]]) -> None:
    for sim in runs:
        print(
            f"simulator, load {sim['load']}, {sim['planner']}: {sim['jobs']} jobs in {sim['seconds']} s "
            f"({sim['cpu_seconds']} s CPU) = {sim['jobs_per_s']} jobs/s, {sim['jobs_per_cpu_s']} per CPU s "
            f"({sim['scheduling_cycles']} cycles, {sim['preemptions']} preemptions, "
            f"outcomes {sim['outcomes_digest']})"
        )


if __name__ == "__main__":
    main()
