"""``ffdl simulate`` reads the public GPU-cluster traces: each format found by its contents and
mapped to gangs, tenants and runtimes as docs/scheduling.md says. The fixtures (tests/traces) are
written by hand in each format; no trace data is copied into the repository."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ffdl.cli.main import app
from ffdl.core.simulation import TraceJob
from ffdl.tools.trace_formats import gang_shape, load_trace
from ffdl.tools.traces import TraceError

TRACES = Path(__file__).parent.parent / "traces"


def shapes(jobs: list[TraceJob]) -> list[tuple[str, str, int, int, float, int]]:
    return [(j.job_id, j.tenant, j.learners, j.gpus_per_learner, j.runtime, j.priority) for j in jobs]


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_the_philly_derived_csv_is_known_by_its_header_and_its_odd_sizes_split_into_equal_learners() -> None:
    jobs = load_trace(TRACES / "philly.csv")
    assert shapes(jobs) == [
        ("philly-2", "vc-a", 1, 1, 66.0, 0),
        ("philly-3", "vc-b", 1, 4, 2951.0, 0),
        ("philly-4", "vc-a", 2, 8, 600.0, 0),  # bigger than a node: whole nodes
        ("philly-5", "vc-c", 2, 6, 100.0, 0),  # 12 GPUs on 8-GPU nodes
    ]  # the job that ran 0 s is left out
    assert jobs[0].submit_time == at("2017-10-09 07:01:55")


def test_philly_cluster_job_log_counts_every_attempt_and_leaves_out_jobs_that_never_ran() -> None:
    jobs = load_trace(TRACES / "cluster_job_log.json")
    assert shapes(jobs) == [
        ("application_1", "vc-a", 2, 8, 600.0 + 3600.0, 0),  # two attempts on two machines each
        ("application_2", "vc-b", 1, 1, 600.0, 0),  # killed: kept for as long as it ran
    ]
    assert jobs[0].submit_time == at("2017-10-03 01:00:00")


def test_alibaba_pai_joins_its_two_headerless_tables_and_takes_a_whole_gpu_for_a_share() -> None:
    for path in (TRACES / "pai", TRACES / "pai" / "pai_task_table.csv", TRACES / "pai" / "pai_job_table.csv"):
        jobs = load_trace(path)
        assert shapes(jobs) == [
            ("job_a", "alice", 4, 1, 5000.0 - 1010.0, 0),  # the ps task plans no GPU: not counted
            ("job_b", "bob", 1, 1, 550.0, 0),  # half a GPU takes one; failed, kept as long as it ran
        ]  # job_c plans no GPU, job_d never ended
        assert jobs[0].submit_time == 1000.0


def test_alibaba_openb_pods_are_jobs_with_tenant_and_priority_from_their_qos() -> None:
    jobs = load_trace(TRACES / "openb_pod_list.csv")
    assert shapes(jobs) == [
        ("openb-pod-0001", "LS", 1, 1, 8900.0, 10),
        ("openb-pod-0002", "BE", 1, 1, 640.0, -10),
        ("openb-pod-0003", "Burstable", 1, 8, 3920.0, 0),
    ]  # a CPU pod and a pod never scheduled are left out


def test_helios_cluster_log_spreads_a_job_over_its_nodes_and_leaves_out_cpu_and_unstarted_jobs() -> None:
    jobs = load_trace(TRACES / "cluster_log.csv")
    assert shapes(jobs) == [
        ("1", "vc1", 2, 8, 3600.0, 0),
        ("2", "vc2", 1, 1, 120.0, 0),
        ("4", "vc3", 3, 4, 600.0, 0),  # cancelled after 10 minutes: kept
    ]


def test_a_broken_trace_names_where(tmp_path: Path) -> None:
    bad = tmp_path / "philly.csv"
    bad.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,soon,1,1,vc\n")
    with pytest.raises(TraceError, match=r"philly.csv:2: duration"):
        load_trace(bad)
    bad.write_text("timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,5,1,5,vc\n")
    with pytest.raises(TraceError, match=r"philly.csv:2: timestamp: not a time"):
        load_trace(bad)
    orphan = tmp_path / "pai_task_table.csv"
    orphan.write_text("job_z,worker,1,Terminated,1,2,600.0,29.0,100.0,V100\n")
    (tmp_path / "pai_job_table.csv").write_text("job_a,inst_a,alice,Terminated,1,2\n")
    with pytest.raises(TraceError, match="job_z"):
        load_trace(orphan)
    (tmp_path / "log.json").write_text('{"not": "a list"')
    with pytest.raises(TraceError):
        load_trace(tmp_path / "log.json")


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        # NaN never equals the simulator's clock: it waited for it for ever, growing without end
        (
            "philly.csv",
            b"timestamp,duration,num_gpus,gpu_time,cluster\nnan,100,1,0,vc1\n",
            "timestamp: not a time",
        ),
        (
            "philly.csv",
            b"timestamp,duration,num_gpus,gpu_time,cluster\n1,100,inf,0,vc1\n",
            "not a finite number",
        ),
        (
            "trace.jsonl",
            b'{"submit_time": NaN, "tenant": "t", "learners": 1, "gpus_per_learner": 1, "runtime": 5}\n',
            "finite",
        ),
        ("trace.jsonl", b"\xff\xfe not text", "not a trace of the format it looks like"),
        ("log.json", b'[{"jobid": "j", "attempts": 5}]', "not a trace of the format it looks like"),
        ("log.json", b"[1, 2]", "job 1: not an object"),
    ],
)
def test_a_trace_that_is_not_what_its_format_says_is_a_trace_error(
    tmp_path: Path, name: str, content: bytes, said: str
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TraceError, match=said):
        load_trace(tmp_path / name)


@given(gpus=st.integers(1, 512), per_node=st.sampled_from([1, 2, 4, 8, 16]))
def test_a_gang_shape_holds_exactly_the_gpus_asked_with_no_learner_bigger_than_a_node(
    gpus: int, per_node: int
) -> None:
    learners, per_learner = gang_shape(gpus, per_node)
    assert learners * per_learner == gpus and 1 <= per_learner <= per_node
    if gpus <= per_node:
        assert learners == 1


def test_the_cli_simulates_a_public_trace_beside_the_baselines(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["simulate", str(TRACES / "cluster_log.csv"), "--nodes", "2", "--compare", "fifo,las", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["policies"]) == {"ffdl", "fifo", "las"}
    assert all(figures["completed"] == 3 for figures in report["policies"].values())
    wrong = CliRunner().invoke(app, ["simulate", str(TRACES / "cluster_log.csv"), "--compare", "sjf"])
    assert wrong.exit_code == 2 and "fifo,backfill,las,oracle" in wrong.output
