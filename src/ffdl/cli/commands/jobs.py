"""Submit and steer jobs and look at them: ``submit``, ``status``, ``list``, ``halt``, ``resume``,
``cancel``, ``delete``, ``events``, ``why``, ``logs``; all through the API at ``FFDL_API``.

Output follows kubectl's habits: a table by default, ``-o wide|name|json|yaml`` (``--json`` too),
``--watch`` to keep looking; errors are one ``error:`` line per problem and a non-zero exit.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from ffdl.cli.client import ApiClient, ApiError
from ffdl.cli.commands.common import (
    JsonFlag,
    Output,
    OutputOption,
    api_client,
    call_api,
    data_summary,
    fail,
    output_of,
    usage,
)
from ffdl.cli.render import (
    console,
    job_table,
    learners_table,
    print_json,
    print_table,
    print_yaml,
    styled,
    timeline_table,
)
from ffdl.core.states import JobState
from ffdl.tools.terminal import shown, visible

app = typer.Typer()

WatchFlag = Annotated[
    bool, typer.Option("--watch", "-w", help="Keep looking: print again whenever it changes (Ctrl-C stops).")
]
#: How often ``--watch`` and a waiting ``logs --follow`` ask the API again.
POLL_S = 1.0


def _read_manifest(manifest: Path) -> str:
    if str(manifest) == "-":
        return typer.get_text_stream("stdin").read()
    try:
        return manifest.read_text()
    except OSError as exc:
        raise usage(f"{manifest}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise usage(f"{manifest}: not a text file ({exc.reason})") from exc


@app.command()
def submit(
    manifest: Annotated[Path, typer.Argument(help="Manifest file (ours or FfDL's), '-' for stdin.")],
    json_output: JsonFlag = False,
) -> None:
    """Submit a job and wait (a few seconds at most) for the scheduler to take it in. Exits 1 with the
    reason when the scheduler refuses it (it can never fit)."""
    text = _read_manifest(manifest)
    client = api_client()
    try:
        result = client.submit(text)
        job = _admitted(client, result["job_id"])
    except ApiError as exc:
        raise fail(exc) from exc
    finally:
        client.close()
    state = job["state"] if job else result["state"] or JobState.SUBMITTED
    if json_output:
        print_json({**result, "state": state})
    else:
        console.print(f"submitted [bold]{result['job_id']}[/] ({styled(state)})")
    if job is not None and state == JobState.FAILED:
        raise fail(ValueError(f"{job['job_id']} can never run: {job['reason']}"), code=1)


#: How long ``submit`` waits for the scheduler to admit or refuse the job (none runs: it says SUBMITTED).
ADMISSION_WAIT_S = 10.0


def _admitted(client: ApiClient, job_id: str) -> dict[str, Any] | None:
    """The job once the scheduler has admitted or refused it; None if it has not within
    :data:`ADMISSION_WAIT_S` (no scheduler runs: the job waits, and ``submit`` says SUBMITTED)."""
    deadline = time.monotonic() + ADMISSION_WAIT_S
    while True:
        job = client.get(job_id)
        if job["state"] != JobState.SUBMITTED:
            return job
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _show(value: Any, output: Output, name: str, table: Callable[[], None]) -> None:
    if output is Output.JSON:
        print_json(value)
    elif output is Output.YAML:
        print_yaml(value)
    elif output is Output.NAME:
        print(name)
    else:
        table()


def _watch(
    read: Callable[[ApiClient], Any], show: Callable[[Any], None], ended: Callable[[Any], bool]
) -> None:
    """Show what ``read`` answers, then again each time it changes, until ``ended`` says it will not
    change any more or the user interrupts (exit 0: looking is not failing)."""
    client = api_client()
    shown: Any = None
    try:
        while True:
            value = read(client)
            if value != shown:
                show(value)
                shown = value
            if ended(value):
                return
            time.sleep(POLL_S)
    except ApiError as exc:
        raise fail(exc) from exc
    except KeyboardInterrupt:
        return
    finally:
        client.close()


@app.command()
def status(
    job_id: str, output: OutputOption = None, json_output: JsonFlag = False, watch: WatchFlag = False
) -> None:
    """Show a job: state, learners, attempts, checkpoints, timeline."""
    chosen = output_of(output, json_output)

    def show(job: dict[str, Any]) -> None:
        def tables() -> None:
            print_table(learners_table(job, wide=chosen is Output.WIDE), wide=chosen is Output.WIDE)
            if job["latest_checkpoint"]:
                checkpoint = job["latest_checkpoint"]
                console.print(
                    f"latest checkpoint: step {checkpoint['step']} at {shown(checkpoint['uri'])}",
                    soft_wrap=True,
                )
            console.print(timeline_table(job))

        _show(job, chosen, job["job_id"], tables)

    if not watch:
        show(call_api(lambda c: c.get(job_id)))
        return
    # a learner's heartbeat changes on every read: a change worth showing is one of the job's own
    _watch(lambda c: _without_heartbeats(c.get(job_id)), show, lambda job: JobState(job["state"]).terminal)


def _without_heartbeats(job: dict[str, Any]) -> dict[str, Any]:
    for learner in job["learners"]:
        learner.pop("heartbeat", None)
    return job


@app.command("list")
def list_jobs(
    state: Annotated[list[str] | None, typer.Option(help="Only jobs in this state (repeatable).")] = None,
    label: Annotated[
        str | None, typer.Option("--label", "-l", help="Only jobs with this label: KEY=VALUE.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many jobs.")] = 50,
    output: OutputOption = None,
    json_output: JsonFlag = False,
    watch: WatchFlag = False,
) -> None:
    """List jobs, newest first."""
    chosen = output_of(output, json_output)
    if label is not None and "=" not in label.strip("="):
        raise usage(f"--label is KEY=VALUE, not {label!r}")

    def show(page: dict[str, Any]) -> None:
        names = "\n".join(job["job_id"] for job in page["jobs"])
        _show(page, chosen, names, lambda: _jobs_table(page["jobs"], wide=chosen is Output.WIDE))

    def read(client: ApiClient) -> dict[str, Any]:
        return client.list_jobs(state=state, label=label, limit=limit)

    if watch:
        _watch(read, show, lambda page: False)
    else:
        show(call_api(read))


def _jobs_table(jobs: list[dict[str, Any]], *, wide: bool) -> None:
    if jobs:
        print_table(job_table(jobs, wide=wide), wide=wide)
    else:
        console.print("no jobs", style="dim")


def _steer(action: str, job_id: str, json_output: bool) -> None:
    result = call_api(lambda c: getattr(c, action)(job_id))
    if json_output:
        print_json(result)
    elif result.get("command_id"):
        console.print(f"{job_id}: asked; the platform has not decided yet (see `ffdl status {job_id}`)")
    elif result["state"] is None:  # the job has left the listings: deleted
        console.print(f"{job_id}: deleted from the listings (its events stay on the log)")
    else:
        unchanged = " (nothing changed)" if result.get("changed") is False else ""
        console.print(f"{job_id}: {styled(result['state'])}{unchanged}")


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
    """Cancel a live job: its learners stop and its GPUs are freed. An ended job is refused (see delete)."""
    _steer("cancel", job_id, json_output)


@app.command()
def delete(
    job_id: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Remove an ended job from the listings (its events stay on the log); asks first."""
    if not yes:
        try:
            confirmed = typer.confirm(f"remove {job_id} from the listings? Its events stay on the log")
        except typer.Abort:
            confirmed = False
        if not confirmed:
            raise fail(ValueError(f"{job_id} was not deleted"), code=1)
    _steer("delete", job_id, json_output)


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
                        f"{shown(data_summary(event['data']))}"
                    )
            if not follow or JobState(client.get(job_id)["state"]).terminal:
                return
            time.sleep(0.5)
    except ApiError as exc:
        raise fail(exc) from exc
    except KeyboardInterrupt:
        return
    finally:
        client.close()


@app.command()
def why(job_id: str, json_output: JsonFlag = False) -> None:
    """Say why a job is pending: the scheduler's reason, its place in the queue and what it waits for."""
    answer = call_api(lambda c: c.why(job_id))
    if json_output:
        print_json(answer)
        return
    console.print(shown(answer["summary"]))
    waiting = answer["waiting"]
    if waiting and waiting["reserved_nodes"]:
        console.print(f"nodes kept free for it: {shown(', '.join(waiting['reserved_nodes']))}")
    if answer["state"] == "QUEUED":
        held = f"{answer['tenant_gpus_held']} GPU(s) held now"
        counted = answer.get("tenant_counts_as_gpus", answer["tenant_gpus_held"])  # an older API has none
        if counted != answer["tenant_gpus_held"]:
            held += f", which count as {counted:g} against its quota (CPUs and memory too)"
        console.print(
            shown(f"tenant {answer['tenant']}: position {answer['tenant_position']} among its jobs, {held}")
        )


@app.command()
def logs(
    job_id: str,
    rank: Annotated[int, typer.Option(min=0, help="The learner.")] = 0,
    attempt: Annotated[int | None, typer.Option(min=1, help="The attempt (default: the latest).")] = None,
    tail: Annotated[int, typer.Option(min=1, help="Lines from the end.")] = 200,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
) -> None:
    """Print the tail of a learner's log; --follow waits for it to start and prints on until the job ends."""
    client = api_client()
    try:
        if follow:
            for text in _followed(client, job_id, rank, tail, attempt):
                print(_for_output(text), end="", flush=True)
            return
        try:
            print(_for_output(client.logs(job_id, rank, tail, attempt)), end="")
        except ApiError as exc:
            raise fail(_no_log_yet(client, job_id, rank, exc)) from exc
    except ApiError as exc:
        raise fail(exc) from exc
    except KeyboardInterrupt:
        return
    finally:
        client.close()


def _for_output(text: str) -> str:
    """A learner's output as ``ffdl logs`` prints it: as it is into a file or a pipe, with its control
    characters made visible on a terminal (a learner's escape sequence once wrote to the operator's
    clipboard and set their terminal's title)."""
    return visible(re.sub(r"\r\n?", "\n", text)) if sys.stdout.isatty() else text


def _followed(client: ApiClient, job_id: str, rank: int, tail: int, attempt: int | None) -> Iterator[str]:
    """The log as the API streams it; while the learner has written none (the job is queued or
    launching), wait for it, unless the job has ended without one."""
    while True:
        try:
            yield from client.follow_logs(job_id, rank, tail, attempt)
            return
        except ApiError as exc:
            if exc.status != 404:
                raise
            job = client.get(job_id)  # a 404 for the job itself raises here
            if JobState(job["state"]).terminal:
                raise
        time.sleep(POLL_S)


def _no_log_yet(client: ApiClient, job_id: str, rank: int, refusal: ApiError) -> ApiError:
    """A 404 for a log that is not there yet, said as such: the job has not started its learners."""
    if refusal.status != 404:
        return refusal
    job = client.get(job_id)
    state = JobState(job["state"])
    if state.terminal or state is JobState.RUNNING:
        return refusal
    return ApiError(
        404,
        f"{job_id} is {state}: learner {rank} has written no log yet "
        f"(`ffdl logs {job_id} --follow` waits for it)",
    )
