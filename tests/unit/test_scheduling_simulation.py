"""``ffdl simulate``: the trace format, the Philly-shaped generator, and the report of a virtual-time run."""

from __future__ import annotations

import gc
import json
from collections import Counter
from itertools import pairwise
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ffdl import native
from ffdl.cli.main import app
from ffdl.core.allocator import Node
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.simulation import SimulationResult, TraceJob, offered_load, simulate, summarize
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.tools.traces import TraceError, generate_trace, read_trace, write_trace

#: Each policy's figures, as docs/scheduling.md and the JSON report give them.
REPORT_KEYS = {
    "jct_mean_s",
    "jct_p50_s",
    "jct_p99_s",
    "queue_delay_p50_s",
    "queue_delay_p99_s",
    "utilization",
    "offered_load",
    "makespan_s",
    "preemptions",
    "max_preemptions_per_job",
    "lost_gpu_hours",
    "fairness",
}


def nodes(count: int, gpus: int = 8) -> list[Node]:
    return [Node(f"n{i}", gpus) for i in range(count)]


def test_the_generator_gives_philly_shapes_and_the_same_trace_for_the_same_seed() -> None:
    trace = generate_trace(4000, nodes=64, gpus_per_node=8, tenants=5, seed=11)
    assert trace == generate_trace(4000, nodes=64, gpus_per_node=8, tenants=5, seed=11)
    assert trace != generate_trace(4000, nodes=64, gpus_per_node=8, tenants=5, seed=12)
    sizes = Counter(job.gpus for job in trace)
    assert sum(n for gpus, n in sizes.items() if gpus <= 8) > 0.9 * len(trace)
    assert sizes[1] > len(trace) / 2
    assert {16, 32, 64, 128} <= set(sizes)
    runtimes = sorted(job.runtime for job in trace)
    assert runtimes[len(runtimes) // 2] < 3600 < runtimes[-len(runtimes) // 100]  # a heavy tail
    assert len({job.tenant for job in trace}) == 5
    assert all(a.submit_time <= b.submit_time for a, b in pairwise(trace))


@settings(max_examples=20, deadline=None)
@given(
    nodes=st.integers(1, 300),
    gpus_per_node=st.sampled_from([1, 4, 8]),
    largest=st.none() | st.integers(1, 64),
)
def test_the_generator_scales_job_sizes_to_the_cluster(
    nodes: int, gpus_per_node: int, largest: int | None
) -> None:
    trace = generate_trace(300, nodes=nodes, gpus_per_node=gpus_per_node, seed=3, largest_job=largest)
    capacity = nodes * gpus_per_node
    bound = min(capacity, largest or max(capacity // 4, gpus_per_node))
    assert max(job.gpus for job in trace) <= bound
    assert all(job.gpus_per_learner <= gpus_per_node for job in trace)


def test_a_trace_survives_writing_and_reading(tmp_path: Path) -> None:
    trace = [*generate_trace(50, nodes=4, seed=1), TraceJob("typed", 99.0, "t", 2, 4, 60.0, 5, "h100")]
    path = tmp_path / "trace.jsonl"
    write_trace(trace, path)
    again = read_trace(path)
    assert [(j.job_id, j.learners, j.gpus_per_learner, j.gpu_type, j.priority) for j in again] == [
        (j.job_id, j.learners, j.gpus_per_learner, j.gpu_type, j.priority) for j in trace
    ]


def test_a_bad_trace_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"submit_time": 0, "tenant": "a", "learners": 1, "gpus_per_learner": 1, "runtime": 5}\n'
        '{"submit_time": 1, "tenant": "a", "learners": 0, "gpus_per_learner": 1, "runtime": 5}\n'
    )
    with pytest.raises(TraceError, match=r"trace.jsonl:2: learners"):
        read_trace(path)


@settings(max_examples=30, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.floats(0, 500),
            st.sampled_from("abc"),
            st.integers(1, 4),
            st.sampled_from([1, 2, 4, 8]),
            st.floats(1, 300),
            st.sampled_from([-5, 0, 5]),
        ),
        min_size=1,
        max_size=40,
    ),
    node_count=st.integers(1, 4),
)
def test_a_simulation_never_uses_more_gpus_than_the_cluster_has_and_finishes_every_job_that_fits(
    jobs: list[tuple[float, str, int, int, float, int]], node_count: int
) -> None:
    trace = [TraceJob(f"j{i}", *job) for i, job in enumerate(jobs)]
    result = simulate(trace, nodes(node_count), SchedulerPolicy(min_runtime_s=10.0), halt_s=5.0)
    report = summarize(result)
    assert set(report) >= REPORT_KEYS
    assert report["max_gpus_in_use"] <= node_count * 8
    assert 0.0 <= report["utilization"] <= 1.0 + 1e-9
    never = {entry["job_id"] for entry in report["never_run"]}
    for outcome in result.outcomes:
        if outcome.job.job_id in never:
            assert outcome.job.gpus > node_count * 8 and outcome.first_start is None
        else:
            assert outcome.end is not None and outcome.first_start is not None
            worked = outcome.end - outcome.first_start
            assert worked >= outcome.job.runtime - 1e-6, "a preempted job loses no work, it only waits"


def test_a_job_that_can_never_fit_or_never_be_allowed_is_reported_not_waited_for() -> None:
    trace = [
        TraceJob("too-wide", 0.0, "a", 1, 16, 10.0),
        TraceJob("over-quota", 0.0, "capped", 1, 8, 10.0),
        TraceJob("fine", 0.0, "a", 1, 8, 10.0),
    ]
    policy = SchedulerPolicy(
        TenancyPolicy({"capped": TenantQuota(guaranteed_gpus=4, borrowing_limit_gpus=0)})
    )
    report = summarize(simulate(trace, nodes(2), policy))
    assert {entry["job_id"] for entry in report["never_run"]} == {"too-wide", "over-quota"}
    assert report["completed"] == 1 and report["makespan_s"] == 10.0


def test_each_policy_reports_the_jobs_it_can_never_run_and_the_report_leads_with_ffdls(
    tmp_path: Path,
) -> None:
    """The baselines know no quotas: a job over its tenant's limit never runs under ffdl alone. Each
    policy's own list once gave way to the last baseline's, in the JSON, the table and the page."""
    config = tmp_path / "ffdl.yaml"
    config.write_text("tenant_quotas:\n  small: {guaranteed_gpus: 2, borrowing_limit_gpus: 0}\n")
    trace = tmp_path / "quota.jsonl"
    write_trace(
        [TraceJob("toobig", 0.0, "small", 1, 4, 100.0), TraceJob("ok", 10.0, "other", 1, 4, 100.0)], trace
    )
    page = tmp_path / "report.html"
    runner = CliRunner(env={"FFDL_CONFIG": str(config)})
    args = ["simulate", str(trace), "--nodes", "1", "--compare", "fifo,las"]
    made = runner.invoke(app, [*args, "--json", "--html", str(page)])
    assert made.exit_code == 0, made.output
    report = json.loads(made.output)
    over = [{"job_id": "toobig", "reason": "needs 4; tenant small may hold at most 2 GPUs"}]
    assert report["never_run"] == over  # ffdl's: the configured cluster and quotas' verdict
    policies = report["policies"]
    assert {name: (figures["never_run"], figures["completed"]) for name, figures in policies.items()} == {
        "ffdl": (over, 1),
        "fifo": ([], 2),
        "las": ([], 2),
    }
    label = "never run (cannot fit or over quota)"
    assert f'<th scope="row">{label}</th><td>1</td><td>0</td><td>0</td>' in page.read_text()
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    [row] = [line for line in table.output.splitlines() if label in line]
    assert [cell.strip() for cell in row.split("│")[2:5]] == ["1", "0", "0"]


def test_a_trace_whose_jobs_all_arrive_at_one_instant_has_no_offered_load(tmp_path: Path) -> None:
    """Over no span of arrivals the load (and the utilisation over that span) is undefined: it read
    0.00, as if the cluster had been asked for nothing."""
    trace = [TraceJob("a", 0.0, "a", 1, 8, 100.0), TraceJob("b", 0.0, "b", 1, 4, 50.0)]
    assert offered_load(trace, 8) is None
    figures = summarize(simulate(trace, nodes(1)))
    assert figures["offered_load"] is None and figures["utilization_while_arriving"] is None
    assert figures["utilization"] == (800 + 200) / (8 * 150.0)  # the whole run's is still measured
    path = tmp_path / "batch.jsonl"
    write_trace(trace, path)
    page = tmp_path / "report.html"
    runner = CliRunner()
    made = runner.invoke(app, ["simulate", str(path), "--nodes", "1", "--json", "--html", str(page)])
    assert made.exit_code == 0, made.output
    report = json.loads(made.output)
    assert report["offered_load"] is None and report["policies"]["ffdl"]["utilization_while_arriving"] is None
    why = "n/a (every job arrives at one instant: no span to spread the work over)"
    assert f"offered load\n{why}." in page.read_text()
    assert '<th scope="row">GPU utilisation while jobs arrive</th><td>n/a</td>' in page.read_text()
    table = runner.invoke(app, ["simulate", str(path), "--nodes", "1"])
    assert table.exit_code == 0, table.output
    assert why in " ".join(table.output.split())  # the title, however it is wrapped
    [row] = [line for line in table.output.splitlines() if "GPU utilisation while jobs arrive" in line]
    assert row.split("│")[2].strip() == "n/a"


def test_a_high_priority_arrival_preempts_and_the_victim_finishes_its_work_later() -> None:
    trace = [
        TraceJob("long-low", 0.0, "a", 1, 8, 1000.0, priority=0),
        TraceJob("urgent", 200.0, "b", 1, 8, 100.0, 10),
    ]
    result = simulate(trace, nodes(1), SchedulerPolicy(min_runtime_s=60.0), halt_s=30.0)
    low, urgent = result.outcomes
    assert result.preemptions == 1 and low.preemptions == 1
    assert result.lost_gpu_seconds == 30.0 * 8  # it held its 8 GPUs through the halt, working on nothing
    assert urgent.first_start == 230.0  # once the victim has written its checkpoint and stopped
    assert low.end == 230.0 + 100.0 + 800.0  # resumed after urgent, with the 800 s of work it had left


def test_with_service_bands_a_short_arrival_preempts_a_job_past_its_threshold() -> None:
    trace = [
        TraceJob("long", 0.0, "a", 1, 8, 10_000.0),
        TraceJob("short", 1000.0, "b", 1, 8, 100.0),
    ]
    fifo = simulate(trace, nodes(1), SchedulerPolicy(), halt_s=30.0)
    assert fifo.outcomes[1].end == 10_100.0  # without bands it waits for the long job
    policy = SchedulerPolicy(service_queues=(3600.0,))  # 1 GPU-hour: 450 s on 8 GPUs
    long, short = simulate(trace, nodes(1), policy, halt_s=30.0).outcomes
    assert short.first_start == 1030.0 and short.end == 1130.0  # after the long job's checkpoint
    assert long.preemptions == 1 and long.end == 1130.0 + 9000.0  # resumed with its 9,000 s left


def test_with_service_bands_a_job_below_its_threshold_is_not_preempted_by_a_new_one() -> None:
    trace = [TraceJob("first", 0.0, "a", 1, 8, 400.0), TraceJob("second", 100.0, "b", 1, 8, 10.0)]
    policy = SchedulerPolicy(service_queues=(3600.0,))
    first, second = simulate(trace, nodes(1), policy).outcomes
    assert first.preemptions == 0 and second.first_start == 400.0  # both in the top band: FIFO


def test_aging_lifts_a_starved_job_and_the_cap_ends_the_ping_pong() -> None:
    trace = [TraceJob("a", 0.0, "t", 1, 8, 5000.0), TraceJob("b", 0.0, "u", 1, 8, 5000.0)]
    policy = SchedulerPolicy(service_queues=(3600.0,), starve_after_s=600.0, max_service_preemptions=2)
    result = simulate(trace, nodes(1), policy, halt_s=30.0)
    a, b = result.outcomes
    # a runs first; past 450 s it is in the lower band and b (top band) halts it; a then waits
    # 600 s, is lifted to the top band and halts b, which by then has attained its threshold
    assert b.first_start == 480.0
    assert a.preemptions == 2 and b.preemptions >= 1
    assert result.preemptions == a.preemptions + b.preemptions
    assert max(a.preemptions, b.preemptions) <= 2
    assert {a.end, b.end} == {result.last_end, min(a.end or 0, b.end or 0)}


@settings(max_examples=30, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.floats(0, 500),
            st.sampled_from("abc"),
            st.integers(1, 2),
            st.sampled_from([2, 8]),
            st.floats(1, 900),
        ),
        min_size=1,
        max_size=30,
    ),
    cap=st.integers(0, 3),
)
def test_service_bands_lose_no_work_and_no_job_is_halted_past_the_cap(
    jobs: list[tuple[float, str, int, int, float]], cap: int
) -> None:
    """Each job its own tenant's: every preemption counts towards the cap (one made for a job of the
    victim's own tenant does not, so a tenant cannot halt its own job into the guard)."""
    trace = [
        TraceJob(f"j{i}", submit, f"{tenant}{i}", learners, gpus, runtime)
        for i, (submit, tenant, learners, gpus, runtime) in enumerate(jobs)
    ]
    policy = SchedulerPolicy(
        min_runtime_s=10.0, service_queues=(600.0, 3000.0), starve_after_s=300.0, max_service_preemptions=cap
    )
    result = simulate(trace, nodes(2), policy, halt_s=5.0)
    for outcome in result.outcomes:
        assert outcome.end is not None and outcome.first_start is not None
        assert outcome.end - outcome.first_start >= outcome.job.runtime - 1e-6
        assert outcome.preemptions <= cap  # one class: only the bands preempt, and not past the cap


def test_the_cli_generates_a_trace_and_prints_the_report_as_json(tmp_path: Path) -> None:
    out = tmp_path / "philly.jsonl"
    runner = CliRunner()
    made = runner.invoke(app, ["simulate", "--generate", "150", "--out", str(out), "--nodes", "8", "--json"])
    assert made.exit_code == 0, made.output
    report = json.loads(made.output)
    assert set(report["policies"]) == {"ffdl"} and report["jobs"] == 150
    assert set(report["policies"]["ffdl"]) >= REPORT_KEYS
    assert report["policies"]["ffdl"]["max_gpus_in_use"] <= 64
    assert report["offered_load"] == report["policies"]["ffdl"]["offered_load"] > 0
    # the file run again gives the same figures: the jobs simulated are those written (to the ms)
    rerun = runner.invoke(app, ["simulate", str(out), "--nodes", "8", "--json"])
    figures = {
        key: value for key, value in json.loads(rerun.output)["policies"]["ffdl"].items() if "wall" not in key
    }
    assert figures == {key: value for key, value in report["policies"]["ffdl"].items() if "wall" not in key}
    again = runner.invoke(app, ["simulate", str(out), "--nodes", "8", "--policy", "spread", "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["cluster"]["placement"] == "spread"
    table = runner.invoke(app, ["simulate", str(out), "--nodes", "8"])
    assert table.exit_code == 0 and "queueing delay p50" in table.output
    banded = runner.invoke(app, ["simulate", str(out), "--nodes", "8", "--service-queues", "1,16", "--json"])
    assert banded.exit_code == 0, banded.output
    assert json.loads(banded.output)["jobs"] == 150
    unsorted = runner.invoke(app, ["simulate", str(out), "--service-queues", "16,1"])
    assert unsorted.exit_code == 2 and "rising GPU-hours" in unsorted.output
    wrong = runner.invoke(app, ["simulate", str(out), "--policy", "random"])
    assert wrong.exit_code == 2 and "pack or spread" in wrong.output


def test_the_figures_of_a_run_worked_out_by_hand() -> None:
    trace = [
        TraceJob("a1", 0.0, "a", 1, 8, 100.0),
        TraceJob("b1", 0.0, "b", 1, 8, 100.0),  # waits 100 s for a1: slowdown 2
        TraceJob("c1", 100.0, "c", 1, 4, 50.0),  # waits 100 s (until b1 ends at 200 s): slowdown 3
    ]
    assert offered_load(trace, 8) == (800 + 800 + 200) / (8 * 100.0)
    report = summarize(simulate(trace, nodes(1)))
    assert report["jct_mean_s"] == (100.0 + 200.0 + 150.0) / 3
    assert report["queue_delay_p50_s"] == 100.0 and report["makespan_s"] == 250.0
    assert report["utilization"] == (800 + 800 + 200) / (8 * 250.0)
    assert report["preemptions"] == report["max_preemptions_per_job"] == 0 and report["lost_gpu_hours"] == 0.0
    assert [report["tenants"][t]["slowdown_p50"] for t in "abc"] == [1.0, 2.0, 3.0]
    assert report["tenant_slowdown_spread"] == 3.0 / 2.0


def test_the_cli_applies_the_configured_service_bands_unless_told_off(tmp_path: Path) -> None:
    out = tmp_path / "two.jsonl"
    write_trace(
        [TraceJob("long", 0.0, "a", 1, 8, 10_000.0), TraceJob("short", 1000.0, "b", 1, 8, 100.0)], out
    )
    runner = CliRunner()
    figures = {}
    for bands in ("", "off", "1"):
        made = runner.invoke(app, ["simulate", str(out), "--nodes", "1", "--json", "--service-queues", bands])
        assert made.exit_code == 0, made.output
        figures[bands] = json.loads(made.output)["policies"]["ffdl"]
    assert figures[""]["preemptions"] == figures["1"]["preemptions"] == 1  # the default: 1 and 16 GPU-hours
    assert figures["off"]["preemptions"] == 0 and figures["off"]["jct_mean_s"] > figures[""]["jct_mean_s"]
    refused = runner.invoke(app, ["simulate", str(out), "--nodes", "1", "--service-queues", "16,1"])
    assert refused.exit_code != 0 and "rising GPU-hours" in refused.output


def planning_at_every_instant(trace: list[TraceJob], policy: SchedulerPolicy) -> SimulationResult:
    """The run with a step at every instant something was due, those that repeat a step which
    decided nothing included (``halts_allowed`` never the same twice: no step is passed over)."""
    assert not native.active(), "compiled, the simulator calls it directly"
    with patch("ffdl.core.simulation.halts_allowed", side_effect=lambda *_: object()):
        return simulate(trace, nodes(2), policy, halt_s=20.0)


def decided(result: SimulationResult) -> list[object]:
    return [(o.job.job_id, o.first_start, o.end, o.preemptions, o.last_wait) for o in result.outcomes] + [
        result.busy_gpu_seconds,
        result.lost_gpu_seconds,
        result.usage,
    ]


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.floats(0, 2000).map(round),
            st.sampled_from("abc"),
            st.integers(1, 2),
            st.sampled_from([1, 2, 8]),
            st.floats(1, 3000),
            st.sampled_from([0, 0, 5]),
        ),
        min_size=1,
        max_size=25,
    ),
    min_runtime_s=st.sampled_from([0.0, 10.0, 60.0]),
    bands=st.booleans(),
)
@pytest.mark.interpreted  # patches what the simulator calls (planning_at_every_instant)
def test_a_step_passed_over_would_have_decided_nothing(
    jobs: list[tuple[float, str, int, int, float, int]], min_runtime_s: float, bands: bool
) -> None:
    """A step whose inputs are those of the last step, which decided nothing (the same jobs held,
    waiting and allowed to be halted: a stale entry of the timeline woke it), is passed over, and
    the run is the run that planned it: the same starts, ends, preemptions, last reasons and
    figures."""
    trace = [
        TraceJob(f"j{i}", submit, tenant, learners, gpus, runtime, priority)
        for i, (submit, tenant, learners, gpus, runtime, priority) in enumerate(jobs)
    ]
    policy = SchedulerPolicy(
        min_runtime_s=min_runtime_s, service_queues=(600.0, 6000.0) if bands else (), starve_after_s=900.0
    )
    passing_over = simulate(trace, nodes(2), policy, halt_s=20.0)
    everywhere = planning_at_every_instant(trace, policy)
    assert decided(passing_over) == decided(everywhere)
    assert passing_over.cycles <= everywhere.cycles


@pytest.mark.interpreted  # patches what the simulator calls (planning_at_every_instant)
def test_a_preempted_jobs_first_end_wakes_no_step_that_would_decide_nothing() -> None:
    trace = generate_trace(300, nodes=2, gpus_per_node=8, load=1.3, seed=3)
    policy = SchedulerPolicy(service_queues=(3600.0, 57_600.0))
    passing_over = simulate(trace, nodes(2), policy, halt_s=20.0)
    everywhere = planning_at_every_instant(trace, policy)
    assert passing_over.preemptions > 0 and passing_over.cycles < everywhere.cycles
    assert decided(passing_over) == decided(everywhere)


def test_a_run_leaves_no_reference_cycle_for_the_paused_collector_and_turns_it_back_on() -> None:
    """A run pauses the cyclic collector, which is safe only while it makes no reference cycle:
    preemption searches, service bands and aging all taken (a victim pool whose memo held a
    listing that held the pool was one, and a whole replay left every step's pool behind)."""
    trace = generate_trace(300, nodes=2, gpus_per_node=8, load=1.3, seed=3)
    policy = SchedulerPolicy(service_queues=(3600.0, 57_600.0), starve_after_s=3600.0)
    gc.collect()
    gc.disable()
    try:
        result = simulate(trace, nodes(2), policy, halt_s=20.0)
        assert not gc.isenabled()  # left as it was found
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert result.preemptions > 0
    assert unreachable == 0
    simulate(trace[:20], nodes(2), policy)
    assert gc.isenabled()
