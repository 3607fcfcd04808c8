"""What the command groups share: the output options, calling the API, failing with the reason."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ffdl.cli.client import ApiClient, ApiError
from ffdl.cli.render import err_console
from ffdl.wiring.config import Settings

T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables (as -o json).")]


class Output(StrEnum):
    """What ``-o`` prints, in kubectl's habits: the table is the default, ``wide`` adds columns,
    ``name`` prints one id a line (for scripts), ``json`` and ``yaml`` the API's documents."""

    TABLE = "table"
    WIDE = "wide"
    NAME = "name"
    JSON = "json"
    YAML = "yaml"


OutputOption = Annotated[
    Output | None,
    typer.Option("--output", "-o", help="json, yaml, wide or name (default: a table).", show_choices=False),
]


def output_of(output: Output | None, json_output: bool) -> Output:
    """The format asked for: ``--json`` is ``-o json``; asking for two different ones is a usage error."""
    if json_output and output not in (None, Output.JSON):
        raise usage(f"--json and -o {output} ask for two formats: give one")
    return Output.JSON if json_output else output or Output.TABLE


def api_client() -> ApiClient:
    """A client of the API at ``FFDL_API``, with the ``FFDL_TOKEN`` bearer token if one is set."""
    settings = Settings()
    return ApiClient(settings.api, settings.token)


def fail(exc: Exception, code: int = 2) -> typer.Exit:
    """Print why the command failed, one ``error:`` line per problem; raise what this returns to exit."""
    for line in str(exc).splitlines() or [type(exc).__name__]:
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def usage(message: str) -> typer.Exit:
    """A mistake in how the command was called: its line, exit 2."""
    return fail(ValueError(message))


def call_api(fn: Callable[[ApiClient], T]) -> T:
    """``fn(client)`` with a fresh API client; an API error exits 2 with its reason."""
    client = api_client()
    try:
        return fn(client)
    except ApiError as exc:
        raise fail(exc) from exc
    finally:
        client.close()


def data_summary(data: dict[str, Any]) -> str:
    """An event's data on one line, without the job spec and empty fields."""
    return " ".join(f"{k}={v}" for k, v in data.items() if k != "spec" and v not in (None, "", {}, []))
