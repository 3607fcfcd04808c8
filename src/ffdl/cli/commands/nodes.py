"""``ffdl nodes``: list and show the inventory's nodes; cordon, drain and uncordon them (admins)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ffdl.cli.commands.common import JsonFlag, Output, OutputOption, call_api, data_summary, output_of
from ffdl.cli.render import console, node_line, nodes_table, print_json, print_table, print_yaml, when
from ffdl.tools.terminal import shown

app = typer.Typer(
    help="The inventory: list and show nodes; cordon, drain, uncordon them (admins).", no_args_is_help=True
)
ReasonOption = Annotated[str, typer.Option("--reason", help="Why, for the node's history.")]


@app.command("list")
def nodes_list(output: OutputOption = None, json_output: JsonFlag = False) -> None:
    """List every node of the inventory (lost and removed ones too) with its status."""
    chosen = output_of(output, json_output)
    nodes = call_api(lambda c: c.nodes())
    if chosen is Output.JSON:
        print_json(nodes)
    elif chosen is Output.YAML:
        print_yaml(nodes)
    elif chosen is Output.NAME:
        for node in nodes:
            print(node["name"])
    else:
        print_table(nodes_table(nodes, wide=chosen is Output.WIDE), wide=chosen is Output.WIDE)


@app.command("show")
def nodes_show(name: str, json_output: JsonFlag = False) -> None:
    """Show a node: status, cordon, which job holds each GPU, and its events."""
    node = call_api(lambda c: c.node(name))
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
        holder = node["allocated"].get(str(gpu))
        gpus.add_row(str(gpu), shown(holder) if holder else "[dim]free[/]")
    console.print(gpus)
    history = Table(title=f"events of {name}")
    for column in ("seq", "at", "event", "detail"):
        history.add_column(column)
    for event in node["history"]:
        history.add_row(
            str(event["seq"]), when(event["occurred_at"]), event["type"], shown(data_summary(event["data"]))
        )
    console.print(history)


def _outcome(answer: dict[str, Any]) -> str:
    """What a node write's answer says beyond the node: undecided yet, or nothing changed."""
    if answer.get("command_id"):
        return " (not projected yet)"
    return " (nothing changed)" if answer.get("changed") is False else ""


def _steer_node(write: Any, json_output: bool) -> None:
    node = call_api(write)
    if json_output:
        print_json(node)
    else:
        console.print(node_line(node) + _outcome(node))


@app.command("cordon")
def nodes_cordon(
    name: str,
    reason: ReasonOption,
    drain: Annotated[bool, typer.Option("--drain", help="Also move its jobs off (see 'drain').")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Place nothing new on a node (admins)."""
    _steer_node(lambda c: c.cordon(name, reason, drain=drain), json_output)


@app.command("drain")
def nodes_drain(name: str, reason: ReasonOption, json_output: JsonFlag = False) -> None:
    """Cordon a node and halt its jobs with a checkpoint, to resume elsewhere (admins)."""
    _steer_node(lambda c: c.cordon(name, reason, drain=True), json_output)


@app.command("uncordon")
def nodes_uncordon(name: str, reason: ReasonOption = "", json_output: JsonFlag = False) -> None:
    """Lift an operator's cordon or drain from a node (admins)."""
    _steer_node(lambda c: c.uncordon(name, reason), json_output)
