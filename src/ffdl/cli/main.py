"""The ``ffdl`` command line: run the platform, submit and steer jobs, and inspect the log.

Commands that steer jobs or nodes talk to the API at ``FFDL_API`` (``ffdl up`` listens there); the SRE
commands (``export``, ``import``, ``replay``, ``verify``) read an event log directly, the configured
bus, another one (``--bus``) or an exported file, so they work with the platform down.
Every command prints rich tables on a terminal and JSON with ``--json``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ffdl.cli.client import ApiClient, ApiError
from ffdl.cli.render import (
    console,
    cordon_text,
    diff_table,
    err_console,
    job_table,
    learners_table,
    node_line,
    node_status,
    node_timeline_table,
    nodes_table,
    print_json,
    replay_lines,
    replay_timeline_table,
    styled,
    timeline_table,
    violations_table,
    when,
)
from ffdl.core.states import JobState
from ffdl.wiring.config import Settings
from ffdl.wiring.logging import configure_logging

app = typer.Typer(
    help="ffdl: an event-sourced multi-tenant deep-learning training platform.", no_args_is_help=True
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


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
    open_api: Annotated[
        bool, typer.Option("--open", help="Serve the API with no tenant: every caller is admin (a laptop).")
    ] = False,
) -> None:
    """Run the platform (all roles by default) until interrupted."""
    from ffdl.adapters.tenants import TenantError  # noqa: PLC0415
    from ffdl.cli.serve import serve  # noqa: PLC0415 - heavy imports only for this command

    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    chosen = frozenset(r.strip() for r in roles.split(",") if r.strip()) or None
    try:
        asyncio.run(serve(settings, chosen, open_api=open_api))
    except TenantError as exc:
        raise _fail(exc) from exc


@app.command()
def demo(
    chaos: Annotated[bool, typer.Option("--chaos/--no-chaos", help="Kill one learner partway.")] = True,
    steps: Annotated[int, typer.Option(help="Training steps of the demo job.")] = 240,
    keep: Annotated[bool, typer.Option(help="Keep the demo's data directory.")] = False,
) -> None:
    """Start the platform, run a 2-learner training job through a learner failure to COMPLETED."""
    from ffdl.cli.demo import run_demo  # noqa: PLC0415

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
                    console.print(
                        f"{event['seq']:>4} {event['occurred_at']} [bold]{event['type']}[/] "
                        f"{_summary(event['data'])}"
                    )
            if not follow or JobState(client.get(job_id)["state"]).terminal:
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
    admin: Annotated[
        bool, typer.Option("--admin", help="May see and steer every tenant's jobs (SREs).")
    ] = False,
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
        console.print(
            f"tenant [bold]{name}[/]{' (admin)' if admin else ''} created; its token, shown only now:"
        )
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
        console.print("\n".join(names) or "no tenants: `ffdl up` serves the API only with --open")


@app.command()
def why(job_id: str, json_output: JsonFlag = False) -> None:
    """Say why a job is pending: the scheduler's reason, its place in the queue and what it waits for."""
    answer = _call(lambda c: c.why(job_id))
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


nodes_app = typer.Typer(
    help="The inventory: list and show nodes; cordon, drain, uncordon them (admins).", no_args_is_help=True
)
app.add_typer(nodes_app, name="nodes")
ReasonOption = Annotated[str, typer.Option("--reason", help="Why, for the node's history.")]


@nodes_app.command("list")
def nodes_list(json_output: JsonFlag = False) -> None:
    """List every node of the inventory (lost and removed ones too) with its status."""
    nodes = _call(lambda c: c.nodes())
    if json_output:
        print_json(nodes)
    else:
        console.print(nodes_table(nodes))


@nodes_app.command("show")
def nodes_show(name: str, json_output: JsonFlag = False) -> None:
    """Show a node: status, cordon, which job holds each GPU, and its events."""
    node = _call(lambda c: c.node(name))
    if json_output:
        print_json(node)
        return
    console.print(node_line(node))
    console.print(
        f"{node['gpus']} x {node['gpu_type']} GPU, {node['cpus']:g} CPUs, {node['memory_mb']} MB; "
        f"since {when(node['since'])}: {node['reason'] or 'no reason recorded'}"
    )
    gpus = Table(title=f"GPUs of {name}")
    for column in ("gpu", "job"):
        gpus.add_column(column)
    for gpu in range(node["gpus"]):
        gpus.add_row(str(gpu), node["allocated"].get(str(gpu), "[dim]free[/]"))
    console.print(gpus)
    history = Table(title=f"events of {name}")
    for column in ("seq", "at", "event", "detail"):
        history.add_column(column)
    for event in node["history"]:
        history.add_row(str(event["seq"]), when(event["occurred_at"]), event["type"], _summary(event["data"]))
    console.print(history)


def _steer_node(write: Any, json_output: bool) -> None:
    node = _call(write)
    if json_output:
        print_json(node)
    else:
        pending = " (not projected yet)" if node.get("command_id") else ""
        console.print(node_line(node) + pending)


@nodes_app.command("cordon")
def nodes_cordon(
    name: str,
    reason: ReasonOption,
    drain: Annotated[bool, typer.Option("--drain", help="Also move its jobs off (see 'drain').")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Place nothing new on a node (admins)."""
    _steer_node(lambda c: c.cordon(name, reason, drain=drain), json_output)


@nodes_app.command("drain")
def nodes_drain(name: str, reason: ReasonOption, json_output: JsonFlag = False) -> None:
    """Cordon a node and halt its jobs with a checkpoint, to resume elsewhere (admins)."""
    _steer_node(lambda c: c.cordon(name, reason, drain=True), json_output)


@nodes_app.command("uncordon")
def nodes_uncordon(name: str, reason: ReasonOption = "", json_output: JsonFlag = False) -> None:
    """Lift an operator's cordon or drain from a node (admins)."""
    _steer_node(lambda c: c.uncordon(name, reason), json_output)


@app.command()
def simulate(
    trace: Annotated[Path | None, typer.Argument(help="Trace file, JSON Lines (docs/scheduling.md).")] = None,
    *,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes of the simulated cluster.")] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=1, help="GPUs per node.")] = 8,
    policy: Annotated[str | None, typer.Option(help="pack or spread, for every job (default: pack).")] = None,
    generate: Annotated[int | None, typer.Option(min=1, help="First write N Philly-like jobs.")] = None,
    out: Annotated[Path | None, typer.Option(help="Where --generate writes its trace.")] = None,
    load: Annotated[float, typer.Option(min=0.01, help="--generate: offered load, x cluster GPUs.")] = 0.9,
    tenants: Annotated[int, typer.Option(min=1, help="--generate: how many tenants submit.")] = 6,
    seed: Annotated[int, typer.Option(help="--generate: random seed (same seed, same trace).")] = 0,
    json_output: JsonFlag = False,
) -> None:
    """Run a workload trace through the scheduler in virtual time and report how it went.

    Tenant quotas and scheduler settings come from the configuration, as for `ffdl up`.
    """
    from ffdl.tools.simulate import PLACEMENTS, homogeneous_cluster, report_tables, run_simulation  # noqa: PLC0415
    from ffdl.tools.traces import TraceError, generate_trace, read_trace, write_trace  # noqa: PLC0415

    if policy is not None and policy not in PLACEMENTS:
        raise _fail(ValueError(f"--policy is pack or spread, not {policy!r}"))
    if generate is not None:
        if out is None or trace is not None:
            raise _fail(ValueError("--generate N writes to --out FILE (and simulates it); give no TRACE"))
        jobs = generate_trace(
            generate, nodes=nodes, gpus_per_node=gpus_per_node, load=load, tenants=tenants, seed=seed
        )
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


# -- SRE: the log is the truth; these read it directly, so they work with the platform down -------------

BusOption = Annotated[
    str | None,
    typer.Option("--bus", help="Event log: embedded:///DIR or kafka://HOST:PORT (default: configured)."),
]
PartitionsOption = Annotated[
    int | None,
    typer.Option("--partitions", min=1, help="Partitions per topic of that log (FFDL_PARTITIONS)."),
]
LogArgument = Annotated[
    str | None, typer.Argument(help="A log file as 'ffdl export' writes it ('-': stdin); default: the bus.")
]


def _sre_settings(partitions: int | None) -> Settings:
    """The settings of an SRE command; its logs go to stderr, warnings only unless FFDL_LOG_LEVEL says more.

    (Its output is the data: an export may be going to stdout, and --json must stay parseable.)
    """
    settings = Settings(partitions=partitions) if partitions else Settings()
    level = settings.log_level if "log_level" in settings.model_fields_set else "warning"
    configure_logging(settings.log_format, level)
    return settings


def _sre(work: Any) -> Any:
    """Run one SRE operation; a bad log, a bad argument or a refused target exits 2 with the reason."""
    from ffdl.tools.sre import NotInLogError, TargetNotEmptyError  # noqa: PLC0415

    try:
        return work()
    except (OSError, ValueError, NotInLogError, TargetNotEmptyError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def _log_events(log: str | None, bus: str | None, settings: Settings) -> Any:
    """The events of a log file (streamed) or of a bus (read whole; records that are no event are
    logged as warnings), in log order."""
    from ffdl.tools.log_files import read_log  # noqa: PLC0415
    from ffdl.tools.sre import events_topic, read_bus  # noqa: PLC0415

    if log is not None and bus is not None:
        raise ValueError("read either a LOG file or --bus, not both")
    if log is not None:
        return read_log(log)
    return asyncio.run(read_bus(bus or settings.bus_url, settings.partitions, events_topic(settings))).events


@app.command()
def export(
    *,
    bus: BusOption = None,
    partitions: PartitionsOption = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job's events.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's jobs' events.")] = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node's events.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only events from this time on (ISO).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Only events before this time (ISO).")] = None,
    types: Annotated[list[str] | None, typer.Option("--type", help="Only this event type (repeatable).")] = (
        None
    ),
    output: Annotated[str, typer.Option("--output", "-o", help="File to write; '-' for stdout.")] = "-",
    json_output: JsonFlag = False,
) -> None:
    """Export the event log to JSON Lines, one event per line, partitions merged in time order.

    Jobs' and nodes' events alike; --job and --tenant keep jobs' events only, --node one node's.
    """
    from ffdl.events import EVENT_TYPES, NODE_EVENT_TYPES  # noqa: PLC0415
    from ffdl.tools.log_files import STDIO, EventFilter, open_for_writing, parse_time  # noqa: PLC0415
    from ffdl.tools.sre import events_topic, export_log  # noqa: PLC0415

    settings = _sre_settings(partitions)

    def run() -> dict[str, Any]:
        known = EVENT_TYPES.keys() | NODE_EVENT_TYPES.keys()
        unknown = sorted(set(types or ()) - known)
        if unknown:
            raise ValueError(f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        start, end = (parse_time(since) if since else None), (parse_time(until) if until else None)
        keep = EventFilter(job, tenant, start, end, frozenset(types or ()), node)
        with open_for_writing(output) as out:
            report: dict[str, Any] = asyncio.run(
                export_log(bus or settings.bus_url, settings.partitions, events_topic(settings), keep, out)
            )
        return report

    report = _sre(run)
    report["output"] = output
    where = err_console if output == STDIO else console
    if json_output:
        where.print_json(data=report)
    else:
        where.print(
            f"exported {report['written']} of {report['events']} events of {report['topic']} "
            f"from {report['source']} to {'stdout' if output == STDIO else output}"
        )
    if report["undecodable"]:
        positions = ", ".join(record["position"] for record in report["undecodable"])
        err_console.print(
            f"[yellow]warning:[/] {len(report['undecodable'])} record(s) are no event and were not exported, "
            f"at {positions} (ffdl verify lists why)"
        )


@app.command("import")
def import_events(
    log: Annotated[str, typer.Argument(help="A log file as 'ffdl export' writes it ('-': stdin).")],
    *,
    bus: BusOption = None,
    partitions: PartitionsOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Import a JSON Lines log into an empty event log (embedded or a Kafka topic)."""
    from ffdl.tools import sre  # noqa: PLC0415

    settings = _sre_settings(partitions)
    url, topic = bus or settings.bus_url, sre.events_topic(settings)
    report = _sre(lambda: asyncio.run(sre.import_log(log, url, settings.partitions, topic)))
    if json_output:
        print_json(report)
    else:
        moved = (
            "every event at its exported position"
            if not report["moved"]
            else (f"{report['moved']} event(s) at another position than exported (another partition count)")
        )
        target = f"{report['topic']} on {report['target']}"
        console.print(f"imported {report['events']} events into {target}: {moved}")


@app.command()
def replay(
    log: LogArgument = None,
    *,
    job: Annotated[str | None, typer.Option("--job", help="The job to replay.")] = None,
    node: Annotated[str | None, typer.Option("--node", help="The node to replay.")] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Stop after this seq of the job or node, or at this ISO 8601 time."),
    ] = None,
    diff: Annotated[
        tuple[str, str] | None, typer.Option("--diff", help="What changed between points A B (SEQ or TIME).")
    ] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Rebuild every projection from the log.")] = (
        False
    ),
    out: Annotated[Path | None, typer.Option("--out", help="--rebuild: the new projection file.")] = None,
    bus: BusOption = None,
    partitions: PartitionsOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Replay a job (state, timeline, diff) or a node (state, timeline) to any point, or rebuild the
    projections, from a log.

    --rebuild without LOG rebuilds the configured bus and compares with the live projections.
    """
    from ffdl.tools import sre  # noqa: PLC0415

    settings = _sre_settings(partitions)
    if [job is not None, node is not None, rebuild].count(True) != 1:
        raise _sre_usage("say what to replay: --job JOB, --node NODE, or --rebuild")
    if rebuild:
        if until is not None or diff is not None:
            raise _sre_usage("--until and --diff replay a job or node; a rebuild folds the whole log")
        _rebuild(log, bus, out, settings, json_output)
        return
    if node is not None:
        if diff is not None:
            raise _sre_usage("--diff compares two points of a job; a node replays with --until")
        _replay_node(log, bus, node, until, settings, json_output)
        return
    assert job is not None
    if diff is not None:
        if until is not None:
            raise _sre_usage("--diff A B compares two points; leave out --until")
        first, second = diff
        report = _sre(
            lambda: sre.diff_job(
                _log_events(log, bus, settings), job, sre.Point.parse(first), sre.Point.parse(second)
            )
        )
        if json_output:
            print_json(report)
            return
        console.print(diff_table(report))
        between = ", ".join(f"{kind} x{count}" for kind, count in report["events_between"].items())
        console.print(f"events between: {between or 'none'}")
        if report["transitions"]:
            console.print(replay_timeline_table(job, report["transitions"]))
        return
    point = _sre(lambda: sre.Point.parse(until) if until else None)
    report = _sre(lambda: sre.replay_job(_log_events(log, bus, settings), job, point))
    if json_output:
        print_json(report)
        return
    for line in replay_lines(report):
        console.print(line)
    console.print(learners_table(report["state"]))
    console.print(replay_timeline_table(job, report["timeline"]))


def _sre_usage(message: str) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(2)


def _replay_node(
    log: str | None, bus: str | None, name: str, until: str | None, settings: Settings, as_json: bool
) -> None:
    """``replay --node``: the node's state at the point, what was skipped, and its timeline."""
    from ffdl.tools import sre  # noqa: PLC0415

    point = _sre(lambda: sre.Point.parse(until) if until else None)
    report = _sre(lambda: sre.replay_node(_log_events(log, bus, settings), name, point))
    if as_json:
        print_json(report)
        return
    state, at = report["state"], report["point"]
    console.print(
        f"node [bold]{name}[/] at seq {at['seq']}, {at['at']} (position {at['position']}): "
        f"{node_status(state['status'])}, {state['gpus']} x {state['gpu_type']} GPU, "
        f"{state['cpus']:g} CPUs, {state['memory_mb']} MB"
    )
    console.print(f"since {state['since']}: {state['reason'] or 'no reason recorded'}")
    if state["cordon"]:
        console.print(cordon_text(state))
    for skipped in report["skipped"]:
        console.print(
            f"[yellow]skipped[/] seq {skipped['seq']} {skipped['type']} at {skipped['position']}: "
            f"{skipped['reason']}"
        )
    console.print(node_timeline_table(name, report["timeline"]))


def _rebuild(log: str | None, bus: str | None, out: Path | None, settings: Settings, as_json: bool) -> None:
    from ffdl.tools import sre  # noqa: PLC0415

    if log is not None:
        if bus is not None:
            raise _sre_usage("read either a LOG file or --bus, not both")
        target = out or Path(f"{Path(log).stem if log != '-' else 'stdin'}.projections.sqlite")
        report = _sre(lambda: sre.rebuild_file(log, target))
    else:
        report = _sre(lambda: asyncio.run(sre.rebuild_projections(settings, bus, out)))
    if as_json:
        print_json(report)
        return
    states = ", ".join(f"{styled(state)} {count}" for state, count in report["states"].items())
    statuses = ", ".join(
        f"{node_status(status)} {count}" for status, count in report["node_statuses"].items()
    )
    jobs = f"{report['jobs']} job(s) of {report['tenants']} tenant(s) and {report['nodes']} node(s)"
    console.print(
        f"rebuilt {jobs} from {report['events']} events ({report['ignored']} ignored) into "
        f"{report['path']}: {states or 'no jobs'}; {statuses or 'no nodes'}"
    )
    if report.get("undecodable"):
        err_console.print(f"[yellow]warning:[/] {report['undecodable']} record(s) of the log are no event")
    if report.get("identical") is not None:
        same = "[green]identical to[/]" if report["identical"] else "[bold red]DIFFERENT from[/]"
        console.print(f"the rebuilt projections are {same} the live ones")


@app.command()
def verify(
    log: LogArgument = None,
    *,
    bus: BusOption = None,
    partitions: PartitionsOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Check every invariant of the log (DESIGN §5), jobs and nodes; exit 1 on any violation.

    A record of the bus that is no event is a violation too (kind 'undecodable', at its position).
    """
    from ffdl.tools import sre  # noqa: PLC0415

    settings = _sre_settings(partitions)
    if log is not None:
        report = _sre(lambda: sre.verify_events(_log_events(log, bus, settings), log))
    else:
        report = _sre(lambda: asyncio.run(sre.verify_log(settings, bus)))
    if json_output:
        print_json(report)
    else:
        if report["violations"]:
            # the table's one column names what a violation is about: its job, else its node
            named = [
                {**v, "job_id": v["job_id"] or (f"node {v['node']}" if v["node"] else "")}
                for v in report["violations"]
            ]
            console.print(violations_table(named))
        colour = "red" if report["violations"] else "green"
        found = f"{len(report['violations'])} violation(s), {report['duplicates']} duplicate(s) ignored"
        read = (
            f"{report['source']}: {report['events']} events, {report['jobs']} jobs, {report['nodes']} nodes"
        )
        console.print(f"[{colour}]{read}, {found}[/]")
    raise typer.Exit(1 if report["violations"] else 0)
