"""What the command groups share: the ``--json`` flag, calling the API, failing with the reason."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ffdl.cli.client import ApiClient, ApiError
from ffdl.cli.render import console
from ffdl.wiring.config import Settings

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def api_client() -> ApiClient:
    """A client of the API at ``FFDL_API``, with the ``FFDL_TOKEN`` bearer token if one is set."""
    settings = Settings()
    return ApiClient(settings.api, settings.token)


def fail(exc: Exception) -> typer.Exit:
    """Print why the command failed; raise what this returns to exit 2."""
    console.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(2)


def call_api(fn: Any, *args: Any) -> Any:
    """``fn(client, *args)`` with a fresh API client; an API error exits 2 with its reason."""
    client = api_client()
    try:
        return fn(client, *args)
    except ApiError as exc:
        raise fail(exc) from exc
    finally:
        client.close()


def data_summary(data: dict[str, Any]) -> str:
    """An event's data on one line, without the job spec and empty fields."""
    return " ".join(f"{k}={v}" for k, v in data.items() if k != "spec" and v not in (None, "", {}, []))
