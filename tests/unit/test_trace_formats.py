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
    jobs = load_trace(TRACES / "philly.csv").jobs
    assert shapes(jobs) == [
        ("philly-2", "vc-a", 1, 1, 66.0, 0),
        ("philly-3", "vc-b", 1, 4, 2951.0, 0),
        ("philly-4", "vc-a", 2, 8, 600.0, 0),  # bigger than a node: whole nodes
        ("philly-5", "vc-c", 2, 6, 100.0, 0),  # 12 GPUs on 8-GPU nodes
    ]  # the job that ran 0 s is left out
    assert jobs[0].submit_time == at("2017-10-09 07:01:55")


def test_philly_cluster_job_log_counts_every_attempt_and_leaves_out_jobs_that_never_ran() -> None:
    jobs = load_trace(TRACES / "cluster_job_log.json").jobs
    assert shapes(jobs) == [
        ("application_1", "vc-a", 2, 8, 600.0 + 3600.0, 0),  # two attempts on two machines each
        ("application_2", "vc-b", 1, 1, 600.0, 0),  # killed: kept for as long as it ran
    ]
    assert jobs[0].submit_time == at("2017-10-03 01:00:00")


def test_alibaba_pai_joins_its_two_headerless_tables_and_takes_a_whole_gpu_for_a_share() -> None:
    for path in (TRACES / "pai", TRACES / "pai" / "pai_task_table.csv", TRACES / "pai" / "pai_job_table.csv"):
        jobs = load_trace(path).jobs
        assert shapes(jobs) == [
            ("job_a", "alice", 4, 1, 5000.0 - 1010.0, 0),  # the ps task plans no GPU: not counted
            ("job_b", "bob", 1, 1, 550.0, 0),  # half a GPU takes one; failed, kept as long as it ran
        ]  # job_c plans no GPU, job_d never ended
        assert jobs[0].submit_time == 1000.0


def test_alibaba_openb_pods_are_jobs_with_tenant_and_priority_from_their_qos() -> None:
    jobs = load_trace(TRACES / "openb_pod_list.csv").jobs
    assert shapes(jobs) == [
        ("openb-pod-0001", "LS", 1, 1, 8900.0, 10),
        ("openb-pod-0002", "BE", 1, 1, 640.0, -10),
        ("openb-pod-0003", "Burstable", 1, 8, 3920.0, 0),
    ]  # a CPU pod and a pod never scheduled are left out


def test_helios_cluster_log_spreads_a_job_over_its_nodes_and_leaves_out_cpu_and_unstarted_jobs() -> None:
    jobs = load_trace(TRACES / "cluster_log.csv").jobs
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
        ("log.json", b'[{"jobid": "j", "attempts": 5}]', "attempts: not a list"),
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


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
HELIOS_HEADER = "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time\n"
JOB_A = '{"job_id": "a", "submit_time": 0, "tenant": "t", "learners": 1, "gpus_per_learner": 1, "runtime": 5}'


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        # a runtime of 1e300 s overflowed the figures into a traceback, and JSON printed Infinity
        ("philly.csv", PHILLY_HEADER + "0,1e200,8,1,vc-a\n", r"philly.csv:2: runs 1e\+200 s"),
        (
            "trace.jsonl",
            '{"submit_time": 0, "tenant": "t", "learners": 1, "gpus_per_learner": 1, "runtime": 1e300}\n',
            r"trace.jsonl:1: runs 1e\+300 s",
        ),
        ("philly.csv", PHILLY_HEADER + "1e15,60,8,1,vc-a\n", "submitted at 1e\\+15 s"),
        # two jobs of one id became one in the simulator's books: the other's outcome was lost
        (
            "cluster_log.csv",
            HELIOS_HEADER + "1,u,vc1,8,1,1,COMPLETED,0,1,100\n1,u,vc2,8,1,1,COMPLETED,5,6,100\n",
            r"cluster_log.csv:3: job id '1' again \(first at .*cluster_log.csv:2\)",
        ),
        (
            "trace.jsonl",
            JOB_A + "\n" + JOB_A.replace('"tenant": "t"', '"tenant": "u"') + "\n",
            "trace.jsonl:2: job id 'a' again",
        ),
        # a value that is not one is an error, not a job left out without a word
        (
            "cluster_log.csv",
            HELIOS_HEADER + "1,u,vc1,abc,1,1,COMPLETED,0,1,100\n",
            "gpu_num: not a number: 'abc'",
        ),
        ("philly.csv", PHILLY_HEADER + "0,60,2.9,1,vc-a\n", "num_gpus: not a whole number"),
        (
            "philly.csv",
            PHILLY_HEADER + "0,60,2,1,vc-a\n\n\n0,60,2,1\n",
            r"philly.csv:5: 4 fields, where the table has 5",
        ),
        # read as the last of the two, a runtime of 5 s came from the wrong column
        (
            "philly.csv",
            "timestamp,duration,num_gpus,cluster, Duration\n0,100,1,vc-a,5\n",
            r"philly.csv:1: the header names the column 'duration' twice",
        ),
        # past the csv module's field limit: its error went out as a traceback
        (
            "philly.csv",
            'timestamp,duration,num_gpus,cluster\n0,100,1,"' + "x" * 140_000 + '"\n',
            r"philly.csv:2: not a CSV ffdl can read: field larger than field limit",
        ),
        ("odd.csv", "a,b,c\n1,2,3\n", "not a trace ffdl reads"),
        ("empty.csv", "", "not a trace ffdl reads"),
        ("philly.csv", PHILLY_HEADER, "no job to simulate"),
        (
            "philly.csv",
            PHILLY_HEADER + "0,0,2,0,vc-a\n0,60,0,0,vc-a\n",
            "no job to simulate; left out: 1 no GPUs, 1 ran no time",
        ),
        (
            "log.json",
            '[{"jobid": "j", "attempts": [{"start_time": 1, "end_time": 2, "detail": [{"gpus": "gpu0"}]}]}]',
            "gpus: not a list",
        ),
    ],
)
def test_a_trace_the_simulator_cannot_take_as_it_is_is_refused_naming_where(
    tmp_path: Path, name: str, content: str, said: str
) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(TraceError, match=said):
        load_trace(tmp_path / name)


@pytest.mark.parametrize(
    "content",
    [
        "\ufeff" + PHILLY_HEADER + "2017-10-09 07:01:55,66.0,1,66.0,vc-a\n",  # a byte-order mark
        "," + PHILLY_HEADER + "0,2017-10-09 07:01:55,66.0,1,66.0,vc-a\n",  # pandas' index column
        "Cluster, Num_GPUs ,Duration,timestamp,gpu_time\nvc-a,1,66.0,2017-10-09 07:01:55,66\n",  # order, case
        PHILLY_HEADER + "2017-10-09T15:01:55+08:00,66.0,1,66.0,vc-a\n",  # an offset of its own
        # rows of empty fields before the header are skipped, as everywhere else: the header was
        # not found, the file was "not a trace ffdl reads"
        ",,,,\r\n\r\n , \r\n" + PHILLY_HEADER + "2017-10-09 07:01:55,66.0,1,66.0,vc-a\n",
        # however many: the format was told from the first 4,096 characters alone
        ",,,,\n" * 1100 + PHILLY_HEADER + "2017-10-09 07:01:55,66.0,1,66.0,vc-a\n",
        # columns without a name name nothing, however many there are
        PHILLY_HEADER.replace("\n", ",,\n") + "2017-10-09 07:01:55,66.0,1,66.0,vc-a,,\n",
    ],
)
def test_the_philly_table_is_known_by_its_columns_whatever_their_order_case_or_company(
    tmp_path: Path, content: str
) -> None:
    (tmp_path / "trace.csv").write_text(content, encoding="utf-8")
    [job] = load_trace(tmp_path / "trace.csv").jobs
    assert (job.tenant, job.learners * job.gpus_per_learner, job.runtime) == ("vc-a", 1, 66.0)
    assert job.submit_time == at("2017-10-09 07:01:55")


def test_philly_cluster_job_log_leaves_out_what_never_ended_or_ran_backwards_and_counts_it(
    tmp_path: Path,
) -> None:
    """A job still running at the trace's end was kept with an earlier attempt's GPUs and time; one
    attempt ending before it started took time off the others; the string None aborted the file."""
    machines = [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}]
    log = [
        {
            "jobid": "running",
            "vc": "a",
            "submitted_time": "2017-10-03 01:00:00",
            "attempts": [
                {"start_time": "2017-10-03 01:00:00", "end_time": "2017-10-03 02:00:00", "detail": machines},
                {"start_time": "2017-10-03 03:00:00", "end_time": None, "detail": machines},
            ],
        },
        {
            "jobid": "backwards",
            "vc": "a",
            "submitted_time": "2017-10-03 01:00:00",
            "attempts": [
                {"start_time": "2017-10-03 01:00:00", "end_time": "2017-10-03 03:00:00", "detail": machines},
                {"start_time": "2017-10-03 05:00:00", "end_time": "2017-10-03 04:00:00", "detail": machines},
            ],
        },
        {
            "jobid": "unsaid",
            "vc": "a",
            "submitted_time": "2017-10-03 01:00:00",
            "attempts": [
                {"start_time": "None", "end_time": "None", "detail": machines},
            ],
        },
        {
            "jobid": "done",
            "vc": "b",
            "submitted_time": "2017-10-03 01:00:00",
            "attempts": [
                {"start_time": "2017-10-03 01:00:00", "end_time": "2017-10-03 01:10:00", "detail": machines},
            ],
        },
    ]
    (tmp_path / "log.json").write_text(json.dumps(log))
    loaded = load_trace(tmp_path / "log.json")
    assert shapes(loaded.jobs) == [("done", "b", 1, 2, 600.0, 0)]
    assert loaded.left_out == {"ends before it starts": 1, "never ended in the trace": 1, "never started": 1}


def test_a_pai_job_of_tasks_of_different_sizes_asks_for_the_gpus_its_tasks_plan(tmp_path: Path) -> None:
    """Every learner took the biggest task's size: 4 one-GPU workers and an 8-GPU task asked for 40."""
    (tmp_path / "pai_job_table.csv").write_text("job_a,inst_a,alice,Terminated,1000,5000\n")
    (tmp_path / "pai_task_table.csv").write_text(
        "job_a,worker,4,Terminated,1010,5000,600.0,29.0,100.0,V100\n"
        "job_a,evaluator,1,Terminated,1010,4000,600.0,29.0,800.0,V100\n"
    )
    [job] = load_trace(tmp_path).jobs
    assert (job.learners, job.gpus_per_learner) == gang_shape(12, 8) == (2, 6)


def test_the_cli_says_what_the_trace_left_out_and_survives_a_trace_where_nothing_fits(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text(PHILLY_HEADER + "0,60,64,1,vc-a\n1,60,0,1,vc-a\n")
    page = tmp_path / "r.html"
    runner = CliRunner()
    made = runner.invoke(
        app,
        [
            "simulate",
            str(trace),
            "--nodes",
            "4",
            "--compare",
            "fifo",
            "--json",
            "--html",
            str(tmp_path / "r.html"),
        ],
    )
    assert made.exit_code == 0, made.output
    report = json.loads(made.output)
    assert report["left_out"] == {"no GPUs": 1}
    assert [job["job_id"] for job in report["never_run"]] == ["philly-2"]  # 64 GPUs on 4 x 8
    assert page.read_text().startswith("<!doctype html>")
    assert "Left out of the trace: 1 no GPUs." in page.read_text()
    told = runner.invoke(app, ["simulate", str(trace), "--nodes", "8"])
    assert told.exit_code == 0 and "left out of the trace: 1 no GPUs" in told.output


def test_the_simulator_refuses_two_jobs_of_one_id() -> None:
    from ffdl.core.simulation import simulate
    from ffdl.tools.simulate import homogeneous_cluster

    twice = [TraceJob("a", 0.0, "t", 1, 1, 60.0), TraceJob("a", 1.0, "u", 1, 1, 60.0)]
    with pytest.raises(ValueError, match="'a' is in the trace more than once"):
        simulate(twice, homogeneous_cluster(1, 8))


def test_pai_reads_a_time_of_zero_as_none_and_builds_a_job_from_the_gpu_tasks_that_ran(
    tmp_path: Path,
) -> None:
    """Alibaba's own analysis reads 0 as no time (a task that never launched): taken as a time, an
    evaluator at 0,0 stretched a one-hour job to 11.6 days. A job whose evaluator never launched
    ran for the hour all the same; a CPU task of a job the job table lacks is no GPU job to lose."""
    (tmp_path / "pai_job_table.csv").write_text(
        "zero,i1,alice,Terminated,0,0\nwaiting,i2,bob,Terminated,1000,4600\nbackwards,i3,carol,Failed,1000,900\n"
    )
    (tmp_path / "pai_task_table.csv").write_text(
        "zero,worker,4,Terminated,1000000,1003600,600.0,29.0,100.0,V100\n"
        "zero,evaluator,1,Failed,0.0,0.0,600.0,29.0,100.0,V100\n"
        "waiting,worker,2,Terminated,1000,4600,600.0,29.0,100.0,V100\n"
        "waiting,evaluator,1,Waiting,,,600.0,29.0,100.0,V100\n"
        "backwards,worker,1,Terminated,1000,2000,600.0,29.0,100.0,V100\n"
        "backwards,evaluator,1,Failed,1500,900,600.0,29.0,100.0,V100\n"
        "orphan,ps,1,Terminated,1000,2000,600.0,29.0,,\n"
    )
    loaded = load_trace(tmp_path)
    assert shapes(loaded.jobs) == [("zero", "alice", 4, 1, 3600.0, 0), ("waiting", "bob", 2, 1, 3600.0, 0)]
    assert loaded.jobs[0].submit_time == 1000000.0  # the job table's 0 is no time: its first task's
    assert loaded.left_out == {"ends before it starts": 1}


def test_rows_a_reader_leaves_out_are_not_read_for_what_it_does_not_need(tmp_path: Path) -> None:
    """A CPU job's Unknown start (Slurm's word) or a job without GPUs with no timestamp once
    aborted the whole trace; a header after blank lines, or without columns no reader uses, is found."""
    (tmp_path / "helios.csv").write_text(
        "\n\n" + HELIOS_HEADER + "1,u,vc1,0,4,1,FAILED,0,Unknown,Unknown\n2,u,vc1,8,4,1,COMPLETED,0,10,70\n"
    )
    loaded = load_trace(tmp_path / "helios.csv")
    assert (shapes(loaded.jobs), loaded.left_out) == ([("2", "vc1", 1, 8, 60.0, 0)], {"no GPUs": 1})
    (tmp_path / "philly.csv").write_text("timestamp,duration,num_gpus,cluster\n,60,0,vc\n0,60,1,vc\n")
    loaded = load_trace(tmp_path / "philly.csv")
    assert (shapes(loaded.jobs), loaded.left_out) == ([("philly-3", "vc", 1, 1, 60.0, 0)], {"no GPUs": 1})


def test_a_table_taken_for_pai_without_the_other_says_so(tmp_path: Path) -> None:
    (tmp_path / "numbers.csv").write_text("1,2,3,4,5,6\n")
    with pytest.raises(TraceError, match="read as an Alibaba PAI 2020 trace"):
        load_trace(tmp_path / "numbers.csv")


def test_pai_tables_with_their_header_after_a_row_of_empty_fields_are_read_as_without(tmp_path: Path) -> None:
    """The header of a headerless table is skipped where it is the first row that is not blank, as
    the format was told by it, not only on line 1 (else it was read as a job of the table)."""
    (tmp_path / "pai_job_table.csv").write_text(
        ",,,,,\njob_name,inst_id,user,status,start_time,end_time\njob_a,inst_a,alice,Terminated,1000,5000\n"
    )
    (tmp_path / "pai_task_table.csv").write_text(
        "job_a,worker,4,Terminated,1010,5000,600.0,29.0,100.0,V100\n"
    )
    jobs = load_trace(tmp_path / "pai_job_table.csv").jobs
    assert shapes(jobs) == [("job_a", "alice", 4, 1, 3990.0, 0)]
