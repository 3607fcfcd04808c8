"""Run the platform: ``up`` (its roles and API until interrupted), ``demo`` and ``simulate`` (the
scheduler in virtual time over a workload trace)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from ffdl.cli.commands.common import JsonFlag, fail, usage
from ffdl.cli.render import console, print_json
from ffdl.tools.terminal import shown
from ffdl.wiring.config import Settings
from ffdl.wiring.logging import configure_logging

app = typer.Typer()


@app.command()
def up(
    roles: Annotated[
        str, typer.Option(help="Comma-separated roles: api,workers,scheduler,projector,notifier")
    ] = "",
    open_api: Annotated[
        bool, typer.Option("--open", help="Serve the API with no tenant: every caller is admin (a laptop).")
    ] = False,
    no_sandbox: Annotated[
        bool,
        typer.Option(
            "--no-sandbox",
            help="Run local learners unconfined, with no bubblewrap sandbox (a laptop; FFDL_SANDBOX=off).",
        ),
    ] = False,
) -> None:
    """Run the platform (all roles by default) until interrupted."""
    from ffdl.adapters.launchers.isolation import LearnersCannotRun  # noqa: PLC0415
    from ffdl.adapters.tenants import TenantError  # noqa: PLC0415
    from ffdl.cli.serve import serve  # noqa: PLC0415 - heavy imports only for this command
    from ffdl.wiring.platform import ALL_ROLES  # noqa: PLC0415

    chosen = frozenset(r.strip() for r in roles.split(",") if r.strip()) or None
    unknown = sorted((chosen or frozenset()) - ALL_ROLES)
    if unknown:
        raise usage(f"--roles: no role {', '.join(unknown)}; the roles are {', '.join(sorted(ALL_ROLES))}")
    settings = Settings()
    if no_sandbox:
        settings = settings.model_copy(update={"sandbox": "off"})
    configure_logging(settings.log_format, settings.log_level)
    try:
        asyncio.run(serve(settings, chosen, open_api=open_api))
    except (TenantError, LearnersCannotRun) as exc:
        raise fail(exc) from exc


@app.command()
def demo(
    chaos: Annotated[bool, typer.Option("--chaos/--no-chaos", help="Kill one learner partway.")] = True,
    steps: Annotated[int, typer.Option(min=1, help="Training steps of the demo job.")] = 240,
    keep: Annotated[bool, typer.Option(help="Keep the demo's data directory.")] = False,
    linger: Annotated[
        float, typer.Option(min=0, help="Seconds the dashboard stays up after the job ends.")
    ] = 10.0,
) -> None:
    """Start the platform, run a 2-learner training job through a learner failure to COMPLETED."""
    from ffdl.cli.demo import run_demo  # noqa: PLC0415

    raise typer.Exit(asyncio.run(run_demo(chaos=chaos, steps=steps, keep=keep, linger_s=linger)))


@app.command()
def simulate(
    trace: Annotated[
        Path | None,
        typer.Argument(
            help="Trace: JSON Lines, or a Philly, Alibaba PAI (a directory), openb or Helios trace, "
            "told apart by its contents (docs/scheduling.md)."
        ),
    ] = None,
    *,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes of the simulated cluster.")] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=1, help="GPUs per node.")] = 8,
    policy: Annotated[str | None, typer.Option(help="pack or spread, for every job (default: pack).")] = None,
    generate: Annotated[int | None, typer.Option(min=1, help="First write N Philly-like jobs.")] = None,
    out: Annotated[Path | None, typer.Option(help="Where --generate writes its trace.")] = None,
    load: Annotated[float, typer.Option(min=0.01, help="--generate: offered load, x cluster GPUs.")] = 0.9,
    tenants: Annotated[int, typer.Option(min=1, help="--generate: how many tenants submit.")] = 6,
    seed: Annotated[int, typer.Option(help="--generate: random seed (same seed, same trace).")] = 0,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained page with pictures here.")
    ] = None,
    compare: Annotated[
        str,
        typer.Option(
            help="Also run these baselines on the same trace and cluster: fifo,backfill,las,oracle."
        ),
    ] = "",
    service_queues: Annotated[
        str,
        typer.Option(
            help="Least attained service within each priority class: the thresholds in GPU-hours "
            "a job has run that split it into bands, e.g. 1,16, or off; by default the "
            "configuration's (scheduler.service_queues_gpu_hours, 1,16; docs/scheduling.md)."
        ),
    ] = "",
    json_output: JsonFlag = False,
) -> None:
    """Run a workload trace through the scheduler in virtual time and report how it went.

    Tenant quotas and scheduler settings come from the configuration, as for `ffdl up`.
    """
    from ffdl.tools import simulate as simulation  # noqa: PLC0415
    from ffdl.tools.trace_formats import describe_left_out, load_trace  # noqa: PLC0415
    from ffdl.tools.traces import TraceError, generate_trace, write_trace  # noqa: PLC0415

    if policy is not None and policy not in simulation.PLACEMENTS:
        raise fail(ValueError(f"--policy is pack or spread, not {policy!r}"))
    try:
        baselines = simulation.parse_compare(compare)
        thresholds = simulation.parse_service_queues(service_queues)
    except ValueError as exc:
        raise fail(exc) from exc
    left_out: dict[str, int] = {}
    if generate is not None:
        if out is None or trace is not None:
            raise fail(ValueError("--generate N writes to --out FILE (and simulates it); give no TRACE"))
        jobs = generate_trace(
            generate, nodes=nodes, gpus_per_node=gpus_per_node, load=load, tenants=tenants, seed=seed
        )
        write_trace(jobs, out)
        # what was written (times to the millisecond), so that the file run again gives these figures
        jobs = load_trace(out, gpus_per_node).jobs
        if not json_output:
            console.print(f"wrote {len(jobs)} jobs to {out}")
    elif trace is None:
        raise fail(ValueError("give a TRACE file, or --generate N --out FILE"))
    else:
        try:
            loaded = load_trace(trace, gpus_per_node)
        except (OSError, TraceError) as exc:
            raise fail(exc) from exc
        jobs, left_out = loaded.jobs, loaded.left_out
    cluster = simulation.homogeneous_cluster(nodes, gpus_per_node)
    placement = simulation.PLACEMENTS.get(policy or "")
    scheduler = Settings().scheduler_policy()
    if thresholds is not None:
        scheduler = replace(scheduler, service_queues=thresholds)
    report = simulation.run_simulation(jobs, cluster, scheduler, placement, html, baselines, left_out)
    if json_output:
        print_json(report)
        return
    for table in simulation.report_tables(report):
        console.print(table)
    if left_out:
        console.print(f"[yellow]left out of the trace[/]: {describe_left_out(left_out)}")
    for job in report["never_run"][:10]:
        console.print(f"[yellow]never runs[/] {shown(job['job_id'])}: {shown(job['reason'])}")
    if html is not None:
        console.print(f"wrote the report to {html}")
