"""SRE commands: ``export``, ``import``, ``replay``, ``verify``.

The log is the truth; these read it directly (the configured bus, another one with ``--bus``, or an
exported file), so they work with the platform down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from ffdl.cli.commands.common import JsonFlag, fail, usage
from ffdl.cli.render import (
    cluster_tables,
    console,
    cordon_text,
    diff_table,
    err_console,
    learners_table,
    node_status,
    node_timeline_table,
    print_json,
    replay_lines,
    replay_timeline_table,
    styled,
    violations_table,
)
from ffdl.core.kinds import JOBS, NODES
from ffdl.tools.terminal import shown
from ffdl.wiring.config import Settings
from ffdl.wiring.logging import configure_logging

app = typer.Typer()

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
        raise fail(exc) from exc


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
    commands: Annotated[
        bool,
        typer.Option("--commands", help="Also the commands, for 'verify --redecide' (-o NAME.events.jsonl)."),
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Export the event log to JSON Lines, one event per line, partitions merged in time order.

    Jobs' and nodes' events alike; --job and --tenant keep jobs' events only, --node one node's.
    --commands writes the whole commands topic to NAME.commands.jsonl beside NAME.events.jsonl first.
    """
    from ffdl.events import EVENT_TYPES, NODE_EVENT_TYPES  # noqa: PLC0415
    from ffdl.tools.log_files import STDIO, EventFilter, open_for_writing, parse_time  # noqa: PLC0415
    from ffdl.tools.redecide import export_commands_beside  # noqa: PLC0415
    from ffdl.tools.sre import events_topic, export_log  # noqa: PLC0415

    settings = _sre_settings(partitions)

    def run() -> dict[str, Any]:
        known = EVENT_TYPES.keys() | NODE_EVENT_TYPES.keys()
        unknown = sorted(set(types or ()) - known)
        if unknown:
            raise ValueError(f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        start, end = (parse_time(since) if since else None), (parse_time(until) if until else None)
        keep = EventFilter(job, tenant, start, end, frozenset(types or ()), node)
        url = bus or settings.bus_url
        exported_commands = (
            asyncio.run(export_commands_beside(output, url, settings, keep)) if commands else None
        )
        with open_for_writing(output) as out:
            report: dict[str, Any] = asyncio.run(
                export_log(url, settings.partitions, events_topic(settings), keep, out)
            )
        return {**report, "commands": exported_commands} if commands else report

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
        if commands:
            where.print(f"and {report['commands']['written']} commands to {report['commands']['path']}")
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
    cluster: Annotated[
        bool, typer.Option("--cluster", help="The whole cluster (GPUs, queue, every job) at --at.")
    ] = False,
    at: Annotated[
        str | None, typer.Option("--at", help="--cluster: this ISO 8601 time (default: the end).")
    ] = (None),
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
    """Replay a job (state, timeline, diff), a node (state, timeline) or the whole cluster (its GPUs,
    queue and jobs: the dashboard's time machine) to any point, or rebuild the projections, from a log.

    --rebuild without LOG rebuilds the configured bus and compares with the live projections.
    """
    from ffdl.tools import sre  # noqa: PLC0415

    settings = _sre_settings(partitions)
    if [job is not None, node is not None, cluster, rebuild].count(True) != 1:
        raise usage("say what to replay: --job JOB, --node NODE, --cluster, or --rebuild")
    if at is not None and not cluster:
        raise usage("--at is the moment of --cluster; a job or node replays with --until")
    if cluster:
        _replay_cluster(log, bus, at, settings, json_output)
        return
    if rebuild:
        if until is not None or diff is not None:
            raise usage("--until and --diff replay a job or node; a rebuild folds the whole log")
        _rebuild(log, bus, out, settings, json_output)
        return
    if node is not None:
        if diff is not None:
            raise usage("--diff compares two points of a job; a node replays with --until")
        _replay_node(log, bus, node, until, settings, json_output)
        return
    assert job is not None
    if diff is not None:
        if until is not None:
            raise usage("--diff A B compares two points; leave out --until")
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
    report = _sre(lambda: sre.replay(_log_events(log, bus, settings), JOBS, job, point))
    if json_output:
        print_json(report)
        return
    for line in replay_lines(report):
        console.print(line)
    console.print(learners_table(report["state"]))
    console.print(replay_timeline_table(job, report["timeline"]))


def _replay_cluster(
    log: str | None, bus: str | None, at: str | None, settings: Settings, as_json: bool
) -> None:
    """``replay --cluster``: every node, GPU, queued job and job state at the moment, folded from the log."""
    from ffdl.projections.timemachine import cluster_at  # noqa: PLC0415
    from ffdl.tools.log_files import parse_time  # noqa: PLC0415

    moment = _sre(lambda: parse_time(at) if at else None)
    picture = _sre(lambda: cluster_at(list(_log_events(log, bus, settings)), moment))
    if as_json:
        print_json(picture)
        return
    for table in cluster_tables(picture):
        console.print(table)
    previous = picture["previous_event"]
    if previous:
        console.print(
            f"after {picture['applied']} of {picture['span']['events']} events; the last: "
            f"{previous['type']} of {shown(previous['key'])} at {previous['at']}"
        )


def _replay_node(
    log: str | None, bus: str | None, name: str, until: str | None, settings: Settings, as_json: bool
) -> None:
    """``replay --node``: the node's state at the point, what was skipped, and its timeline."""
    from ffdl.tools import sre  # noqa: PLC0415

    point = _sre(lambda: sre.Point.parse(until) if until else None)
    report = _sre(lambda: sre.replay(_log_events(log, bus, settings), NODES, name, point))
    if as_json:
        print_json(report)
        return
    state, at = report["state"], report["point"]
    console.print(
        f"node [bold]{shown(name)}[/] at seq {at['seq']}, {at['at']} (position {at['position']}): "
        f"{node_status(state['status'])}, {state['gpus']} x {shown(state['gpu_type'])} GPU, "
        f"{state['cpus']:g} CPUs, {state['memory_mb']} MB"
    )
    console.print(f"since {state['since']}: {shown(state['reason'] or 'no reason recorded')}")
    if state["cordon"]:
        console.print(shown(cordon_text(state)))
    for skipped in report["skipped"]:
        console.print(
            f"[yellow]skipped[/] seq {skipped['seq']} {skipped['type']} at {skipped['position']}: "
            f"{shown(skipped['reason'])}"
        )
    console.print(node_timeline_table(name, report["timeline"]))


def _rebuild(log: str | None, bus: str | None, out: Path | None, settings: Settings, as_json: bool) -> None:
    from ffdl.tools import sre  # noqa: PLC0415

    if log is not None:
        if bus is not None:
            raise usage("read either a LOG file or --bus, not both")
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
    console.print(
        f"rebuilt {report['path']} from {report['events']} events ({report['ignored']} ignored)",
        soft_wrap=True,
    )
    console.print(f"jobs:  {report['jobs']} of {report['tenants']} tenant(s): {states or 'none'}")
    console.print(f"nodes: {report['nodes']}: {statuses or 'none'}")
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
    redecide: Annotated[
        bool, typer.Option("--redecide", help="Decide LOG's commands again (NAME.commands.jsonl beside it).")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Check every invariant of the log, jobs and nodes; exit 1 on any violation.

    A record of the bus that is no event is a violation too (kind 'undecodable', at its position).
    With --redecide, LOG (NAME.events.jsonl) is decided again with today's deciders, command by command
    from NAME.commands.jsonl ('ffdl export --commands'); exit 1 on a decision that differs. Tenants'
    submissions are held to the priority ceilings of the tenants file (FFDL_TENANTS_FILE), if it exists.
    """
    from ffdl.adapters.tenants import TenantRegistry  # noqa: PLC0415
    from ffdl.tools import sre  # noqa: PLC0415
    from ffdl.tools.redecide import redecide_files, report_lines  # noqa: PLC0415

    settings = _sre_settings(partitions)
    if redecide:
        if log is None or bus is not None:
            raise usage("--redecide reads a LOG file (NAME.events.jsonl), not a bus")
        # the owner held tenants' submissions to the ceilings of the tenants file: this one, if any
        tenants = settings.tenants_path
        ceilings = TenantRegistry(tenants).max_priority if tenants.exists() else None
        report = _sre(lambda: redecide_files(log, settings.restart_policy, ceilings))
        if json_output:
            print_json(report)
        else:
            console.print("\n".join(report_lines(report)), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1 if report["divergences"] else 0)
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
