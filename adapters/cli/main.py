"""The ``ffdl`` command line: run the platform, submit and steer jobs, and inspect the log.

Commands that steer jobs talk to the API at ``FFDL_API`` (``ffdl up`` listens there); ``verify``
and ``replay`` read the configured event log directly, so they work with the platform down.
Every command prints rich tables on a terminal and JSON with ``--json``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ffdl.adapters.cli.client import ApiClient, ApiError
from ffdl.adapters.cli.render import console, job_table, learners_table, print_json, styled, timeline_table
from ffdl.adapters.config import Settings
from ffdl.adapters.logging import configure_logging

app = typer.Typer(help="ffdl: an event-sourced multi-tenant deep-learning training platform.", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}


def _client() -> ApiClient:
    settings = Settings()
    return ApiClient(settings.api, settings.token)


def _fail(exc: Exception) -> typer.Exit:
    console.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(2)


def _call(fn: Any, *args: Any) -> Any:
    client = _client()
    try:
        return fn(client, *args)
    except ApiError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()


@app.command()
def up(
    roles: Annotated[str, typer.Option(help="Comma-separated roles: api,workers,scheduler,projector")] = "",
) -> None:
    """Run the platform (all roles by default) until interrupted."""
    from ffdl.adapters.serve import serve  # noqa: PLC0415 - heavy imports only for this command

    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    chosen = frozenset(r.strip() for r in roles.split(",") if r.strip()) or None
    asyncio.run(serve(settings, chosen))


@app.command()
def demo(
    chaos: Annotated[bool, typer.Option("--chaos/--no-chaos", help="Kill one learner partway.")] = True,
    steps: Annotated[int, typer.Option(help="Training steps of the demo job.")] = 240,
    keep: Annotated[bool, typer.Option(help="Keep the demo's data directory.")] = False,
) -> None:
    """Start the platform, run a 2-learner training job through a learner failure to COMPLETED."""
    from ffdl.adapters.cli.demo import run_demo  # noqa: PLC0415

    raise typer.Exit(asyncio.run(run_demo(chaos=chaos, steps=steps, keep=keep)))


@app.command()
def submit(
    manifest: Annotated[Path, typer.Argument(help="Manifest file (ours or FfDL's), '-' for stdin.")],
    json_output: JsonFlag = False,
) -> None:
    """Submit a job."""
    text = typer.get_text_stream("stdin").read() if str(manifest) == "-" else manifest.read_text()
    result = _call(lambda c: c.submit(text))
    if json_output:
        print_json(result)
    else:
        console.print(f"submitted [bold]{result['job_id']}[/] ({styled(result['state'] or 'SUBMITTED')})")


@app.command()
def status(job_id: str, json_output: JsonFlag = False) -> None:
    """Show a job: state, learners, attempts, checkpoints, timeline."""
    job = _call(lambda c: c.get(job_id))
    if json_output:
        print_json(job)
        return
    console.print(learners_table(job))
    if job["latest_checkpoint"]:
        checkpoint = job["latest_checkpoint"]
        console.print(f"latest checkpoint: step {checkpoint['step']} at {checkpoint['uri']}")
    console.print(timeline_table(job))


@app.command("list")
def list_jobs(
    state: Annotated[list[str] | None, typer.Option(help="Only jobs in this state (repeatable).")] = None,
    limit: int = 50,
    json_output: JsonFlag = False,
) -> None:
    """List jobs, newest first."""
    result = _call(lambda c: c.list_jobs(state=state, limit=limit))
    if json_output:
        print_json(result)
    else:
        console.print(job_table(result["jobs"]))


def _steer(action: str, job_id: str, json_output: bool) -> None:
    result = _call(lambda c: getattr(c, action)(job_id))
    if json_output:
        print_json(result)
    else:
        console.print(f"{job_id}: {styled(result['state'] or 'pending')}")


@app.command()
def halt(job_id: str, json_output: JsonFlag = False) -> None:
    """Halt a job: its learners checkpoint and stop; resume it later."""
    _steer("halt", job_id, json_output)


@app.command()
def resume(job_id: str, json_output: JsonFlag = False) -> None:
    """Resume a halted job from its last checkpoint."""
    _steer("resume", job_id, json_output)


@app.command()
def cancel(job_id: str, json_output: JsonFlag = False) -> None:
    """Cancel a job."""
    _steer("cancel", job_id, json_output)


@app.command()
def events(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Print a job's events (its timeline on the log)."""
    client = _client()
    seq = 0
    try:
        while True:
            for event in client.events(job_id, seq):
                seq = event["seq"]
                if json_output:
                    print_json(event)
                else:
                    console.print(f"{event['seq']:>4} {event['occurred_at']} [bold]{event['type']}[/] "
                                  f"{_summary(event['data'])}")
            if not follow or client.get(job_id)["state"] in TERMINAL:
                return
            time.sleep(0.5)
    except ApiError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()


def _summary(data: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items() if k != "spec" and v not in (None, "", {}, []))


tenants_app = typer.Typer(help="Tenants and their API tokens.", no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")


@tenants_app.command("add")
def tenants_add(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="May see and steer every tenant's jobs (SREs).")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Create a tenant and print its API token once (only its hash is kept)."""
    from ffdl.adapters.tenants import TenantError, TenantRegistry  # noqa: PLC0415

    settings = Settings()
    try:
        token = TenantRegistry(settings.tenants_path).add(name, admin=admin)
    except TenantError as exc:
        raise _fail(exc) from exc
    if json_output:
        print_json({"tenant": name, "admin": admin, "token": token})
    else:
        console.print(f"tenant [bold]{name}[/]{' (admin)' if admin else ''} created; its token, shown only now:")
        print(token)
        console.print("clients send it as 'Authorization: Bearer TOKEN'; the CLI reads FFDL_TOKEN")


@tenants_app.command("list")
def tenants_list(json_output: JsonFlag = False) -> None:
    """List tenant names."""
    from ffdl.adapters.tenants import TenantRegistry  # noqa: PLC0415

    names = TenantRegistry(Settings().tenants_path).names()
    if json_output:
        print_json(names)
    else:
        console.print("\n".join(names) or "no tenants: the API runs open")


@app.command()
def why(job_id: str, json_output: JsonFlag = False) -> None:
    """Say why a job is pending: the scheduler's reason, its place in the queue and what it waits for."""
    answer = _call(lambda c: c._call("GET", f"/v1/jobs/{job_id}/why"))
    if json_output:
        print_json(answer)
        return
    console.print(answer["summary"])
    waiting = answer["waiting"]
    if waiting and waiting["reserved_nodes"]:
        console.print(f"nodes kept free for it: {', '.join(waiting['reserved_nodes'])}")
    if answer["state"] == "QUEUED":
        console.print(f"tenant {answer['tenant']}: position {answer['tenant_position']} among its jobs, "
                      f"{answer['tenant_gpus_held']} GPU(s) held now")


@app.command()
def simulate(
    trace: Annotated[Path | None, typer.Argument(help="Trace file, JSON Lines (docs/scheduling.md).")] = None,
    *,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes of the simulated cluster.")] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=1, help="GPUs per node.")] = 8,
    policy: Annotated[str | None, typer.Option(help="pack or spread, for every job (default: pack).")] = None,
    generate: Annotated[int | None, typer.Option(min=1, help="First write a Philly-shaped trace of N jobs")] = (
        None
    ),
    out: Annotated[Path | None, typer.Option(help="Where --generate writes its trace.")] = None,
    load: Annotated[float, typer.Option(min=0.01, help="--generate: offered load, x cluster GPUs.")] = 0.9,
    tenants: Annotated[int, typer.Option(min=1, help="--generate: how many tenants submit.")] = 6,
    seed: Annotated[int, typer.Option(help="--generate: random seed (same seed, same trace).")] = 0,
    json_output: JsonFlag = False,
) -> None:
    """Run a workload trace through the scheduler in virtual time and report how it went.

    Tenant quotas and scheduler settings come from the configuration, as for `ffdl up`.
    """
    from ffdl.adapters.simulate import PLACEMENTS, homogeneous_cluster, report_tables, run_simulation  # noqa: PLC0415
    from ffdl.adapters.traces import TraceError, generate_trace, read_trace, write_trace  # noqa: PLC0415

    if policy is not None and policy not in PLACEMENTS:
        raise _fail(ValueError(f"--policy is pack or spread, not {policy!r}"))
    if generate is not None:
        if out is None or trace is not None:
            raise _fail(ValueError("--generate N writes to --out FILE (and simulates it); give no TRACE"))
        jobs = generate_trace(generate, nodes=nodes, gpus_per_node=gpus_per_node, load=load, tenants=tenants,
                              seed=seed)
        write_trace(jobs, out)
        if not json_output:
            console.print(f"wrote {len(jobs)} jobs to {out}")
    elif trace is None:
        raise _fail(ValueError("give a TRACE file, or --generate N --out FILE"))
    else:
        try:
            jobs = read_trace(trace)
        except (OSError, TraceError) as exc:
            raise _fail(exc) from exc
    cluster = homogeneous_cluster(nodes, gpus_per_node)
    report = run_simulation(jobs, cluster, Settings().scheduler_policy(), PLACEMENTS.get(policy or ""))
    if json_output:
        print_json(report)
        return
    for table in report_tables(report):
        console.print(table)
    for job in report["never_run"][:10]:
        console.print(f"[yellow]never runs[/] {job['job_id']}: {job['reason']}")


@app.command()
def logs(job_id: str, rank: int = 0, tail: int = 200) -> None:
    """Print the tail of a learner's log."""
    print(_call(lambda c: c.logs(job_id, rank, tail)), end="")


@app.command()
def verify(json_output: JsonFlag = False) -> None:
    """Check every invariant over the configured event log; exit 1 on any violation."""
    from ffdl.adapters.sre import verify_log  # noqa: PLC0415

    report = asyncio.run(verify_log(Settings()))
    if json_output:
        print_json(report)
    else:
        for violation in report["violations"]:
            console.print(f"[red]{violation['kind']}[/] job {violation['job_id']} at {violation['position']}: "
                          f"{violation['detail']}")
        colour = "red" if report["violations"] else "green"
        console.print(f"[{colour}]{report['events']} events, {report['jobs']} jobs, "
                      f"{len(report['violations'])} violation(s), {report['duplicates']} duplicate(s) ignored[/]")
    raise typer.Exit(1 if report["violations"] else 0)


@app.command()
def replay(
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Drop and rebuild the projections from the log.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Rebuild the read models from the configured event log, and say whether they equal the live ones."""
    from ffdl.adapters.sre import rebuild_projections  # noqa: PLC0415

    if not rebuild:
        raise _fail(ValueError("say what to replay: --rebuild"))
    report = asyncio.run(rebuild_projections(Settings()))
    if json_output:
        print_json(report)
    else:
        same = "identical to" if report["identical"] else "DIFFERENT from"
        console.print(f"rebuilt {report['events']} events into {report['path']}: {same} the live projections")
