"""The planner's compiled build (``ffdl.native``): it decides exactly as the sources do, and it is
run only while it is a build of the sources there are."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ffdl import native
from ffdl.core.allocator import Node
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.simulation import simulate, summarize
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.tools.traces import generate_trace

# What a run decided, printed as JSON: every job's start, end, preemptions and last reason, and the
# figures, under ffdl's bands with guarantees and borrowing limits (reclaims across classes).
RUN = """
import json
from ffdl import native
from tests.unit.test_native import decided
print(json.dumps({"compiled": native.active(), "decided": decided()}))
"""
PROBE = "from ffdl import native; print(native.active())"
REPOSITORY = Path(__file__).parents[2]


def decided() -> list[object]:
    trace = generate_trace(1500, nodes=6, gpus_per_node=8, load=1.3, seed=11)
    policy = SchedulerPolicy(
        TenancyPolicy({trace[0].tenant: TenantQuota(8), trace[1].tenant: TenantQuota(4, 16, weight=2.0)}),
        min_runtime_s=60.0,
        service_queues=(3600.0, 16 * 3600.0),
        starve_after_s=6 * 3600.0,
    )
    result = simulate(trace, [Node(f"n{index}", 8) for index in range(6)], policy)
    runs = [
        [o.job.job_id, o.first_start, o.end, o.preemptions, o.last_wait and repr(o.last_wait)]
        for o in result.outcomes
    ]
    figures = summarize(result)
    return [runs, figures["jct_mean_s"], figures["utilization"], figures["preemptions"], result.cycles]


def python(code: str, package_root: Path = native.PACKAGE.parent, *, switch: str = "1") -> str:
    """What ``code`` prints, run by a Python of its own that imports ffdl from ``package_root``, with
    ``FFDL_COMPILED`` set to ``switch``."""
    path = os.pathsep.join([str(package_root), str(REPOSITORY)])
    ran = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": path, native.SWITCH: switch},
        capture_output=True,
        text=True,
        check=True,
    )
    return ran.stdout.strip()


def test_the_compiled_planner_decides_every_job_as_the_sources_do() -> None:
    assert native.active(), "the suite runs the compiled planner: `make native` builds it (make test does)"
    sources = json.loads(python(RUN, switch="0"))
    assert sources["compiled"] is False
    here = json.loads(json.dumps(decided()))  # as the other process's JSON has it
    assert here[3] > 0  # preemptions: the bands, reclaims and halts were all exercised
    assert here == sources["decided"]


def test_a_build_of_other_sources_is_not_run(tmp_path: Path) -> None:
    """A source edited after the build (here one comment added) runs as it is: the old build of it
    would decide as the source no longer does."""
    assert native.active(), "the suite runs the compiled planner: `make native` builds it (make test does)"
    copy = tmp_path / "ffdl"
    shutil.copytree(native.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert python(PROBE, tmp_path) == "True"  # the copy's build is found and run
    edited = copy / "core" / "cluster.py"
    edited.write_text(edited.read_text() + "# edited\n")
    assert python(PROBE, tmp_path) == "False"
    assert python("import ffdl.core.cluster as c; print(c.__file__)", tmp_path) == str(edited)


def test_a_build_missing_a_part_is_not_run(tmp_path: Path) -> None:
    """Every module's extension forwards to one shared library: a build without it, or without one
    module, runs the sources (in part, the compiled modules failed to import)."""
    copy = tmp_path / "ffdl"
    shutil.copytree(native.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shared = next((copy / "compiled" / "ffdl" / "core").glob("planner__mypyc.*"))
    shared.unlink()
    assert python(PROBE, tmp_path) == "False"


def test_the_switch_runs_the_sources_whatever_is_built() -> None:
    assert native.active()
    assert python(PROBE, switch="0") == "False"
