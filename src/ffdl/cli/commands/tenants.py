"""``ffdl tenants``: create tenants with their API token, and list them (the tenants file, no API)."""

from __future__ import annotations

from typing import Annotated

import typer

from ffdl.cli.commands.common import JsonFlag, fail
from ffdl.cli.render import console, print_json
from ffdl.core.tenancy import DEFAULT_MAX_PRIORITY
from ffdl.wiring.config import Settings

app = typer.Typer(help="Tenants and their API tokens.", no_args_is_help=True)


#: The highest priority the tenant's jobs may have (a higher class preempts other tenants' jobs).
MaxPriority = Annotated[
    int | None,
    typer.Option(
        "--max-priority",
        min=-1000,
        max=1000,
        help=f"Highest priority of the tenant's jobs (default {DEFAULT_MAX_PRIORITY}; admins: none).",
    ),
]


@app.command("add")
def tenants_add(
    name: str,
    admin: Annotated[
        bool, typer.Option("--admin", help="May see and steer every tenant's jobs (SREs).")
    ] = False,
    max_priority: MaxPriority = None,
    json_output: JsonFlag = False,
) -> None:
    """Create a tenant and print its API token once (only its hash is kept)."""
    from ffdl.adapters.tenants import TenantError, TenantRegistry  # noqa: PLC0415

    settings = Settings()
    try:
        token = TenantRegistry(settings.tenants_path).add(name, admin=admin, max_priority=max_priority)
    except TenantError as exc:
        raise fail(exc) from exc
    if json_output:
        print_json({"tenant": name, "admin": admin, "max_priority": max_priority, "token": token})
    else:
        console.print(
            f"tenant [bold]{name}[/]{' (admin)' if admin else ''} created; its token, shown only now:"
        )
        print(token)
        console.print("clients send it as 'Authorization: Bearer TOKEN'; the CLI reads FFDL_TOKEN")


@app.command("list")
def tenants_list(json_output: JsonFlag = False) -> None:
    """List tenant names."""
    from ffdl.adapters.tenants import TenantRegistry  # noqa: PLC0415

    names = TenantRegistry(Settings().tenants_path).names()
    if json_output:
        print_json(names)
    else:
        console.print("\n".join(names) or "no tenants: `ffdl up` serves the API only with --open")


@app.command("set")
def tenants_set(
    name: str,
    max_priority: Annotated[
        int,
        typer.Option(
            "--max-priority", min=-1000, max=1000, help="Highest priority of the tenant's jobs from now on."
        ),
    ],
) -> None:
    """Change a tenant's priority ceiling: its new submissions are held to it (the API and the job
    owner read the tenants file; jobs submitted before keep their priority)."""
    from ffdl.adapters.tenants import TenantError, TenantRegistry  # noqa: PLC0415

    try:
        TenantRegistry(Settings().tenants_path).set_max_priority(name, max_priority)
    except TenantError as exc:
        raise fail(exc) from exc
    console.print(f"tenant [bold]{name}[/]: jobs up to priority {max_priority}")
