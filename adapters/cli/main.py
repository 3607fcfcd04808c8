"""The ``ffdl`` command line: run the platform, submit and steer jobs, and inspect the log.

Commands that steer jobs talk to the API at ``FFDL_API`` (``ffdl up`` listens there); ``verify``
and ``replay`` read the configured event log directly, so they work with the platform down.
Every command prints rich tables on a terminal and JSON with ``--json``.
"""

from __future__ import annotations

import asyncio
import os
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
    return ApiClient(settings.api, settings.token or os.environ.get("FFDL_TOKEN"))


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
