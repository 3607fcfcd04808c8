"""Submit and steer jobs and look at them: ``submit``, ``status``, ``list``, ``halt``, ``resume``,
``cancel``, ``events``, ``why``, ``logs``; all through the API at ``FFDL_API``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ffdl.cli.client import ApiError
from ffdl.cli.commands.common import JsonFlag, api_client, call_api, data_summary, fail
from ffdl.cli.render import console, job_table, learners_table, print_json, styled, timeline_table
from ffdl.core.states import JobState

app = typer.Typer()


@app.command()
def submit(
    manifest: Annotated[Path, typer.Argument(help="Manifest file (ours or FfDL's), '-' for stdin.")],
    json_output: JsonFlag = False,
) -> None:
    """Submit a job."""
    text = typer.get_text_stream("stdin").read() if str(manifest) == "-" else manifest.read_text()
    result = call_api(lambda c: c.submit(text))
    if json_output:
        print_json(result)
    else:
        console.print(f"submitted [bold]{result['job_id']}[/] ({styled(result['state'] or 'SUBMITTED')})")


@app.command()
def status(job_id: str, json_output: JsonFlag = False) -> None:
    """Show a job: state, learners, attempts, checkpoints, timeline."""
    job = call_api(lambda c: c.get(job_id))
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
    result = call_api(lambda c: c.list_jobs(state=state, limit=limit))
    if json_output:
        print_json(result)
    else:
        console.print(job_table(result["jobs"]))


def _steer(action: str, job_id: str, json_output: bool) -> None:
    result = call_api(lambda c: getattr(c, action)(job_id))
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
    client = api_client()
    seq = 0
    try:
        while True:
            for event in client.events(job_id, seq):
                seq = event["seq"]
                if json_output:
                    print_json(event)
                else:
                    console.print(
                        f"{event['seq']:>4} {event['occurred_at']} [bold]{event['type']}[/] "
                        f"{data_summary(event['data'])}"
                    )
            if not follow or JobState(client.get(job_id)["state"]).terminal:
                return
            time.sleep(0.5)
    except ApiError as exc:
        raise fail(exc) from exc
    finally:
        client.close()


@app.command()
def why(job_id: str, json_output: JsonFlag = False) -> None:
    """Say why a job is pending: the scheduler's reason, its place in the queue and what it waits for."""
    answer = call_api(lambda c: c.why(job_id))
    if json_output:
        print_json(answer)
        return
    console.print(answer["summary"])
    waiting = answer["waiting"]
    if waiting and waiting["reserved_nodes"]:
        console.print(f"nodes kept free for it: {', '.join(waiting['reserved_nodes'])}")
    if answer["state"] == "QUEUED":
        console.print(
            f"tenant {answer['tenant']}: position {answer['tenant_position']} among its jobs, "
            f"{answer['tenant_gpus_held']} GPU(s) held now"
        )


@app.command()
def logs(job_id: str, rank: int = 0, tail: int = 200) -> None:
    """Print the tail of a learner's log."""
    print(call_api(lambda c: c.logs(job_id, rank, tail)), end="")
