"""The ``ffdl`` command line: run the platform, submit and steer jobs, and inspect the log.

Commands that steer jobs or nodes talk to the API at ``FFDL_API`` (``ffdl up`` listens there); the SRE
commands (``export``, ``import``, ``replay``, ``verify``) read an event log directly, the configured
bus, another one (``--bus``) or an exported file, so they work with the platform down.
Every command prints rich tables on a terminal and JSON with ``--json``.

The commands live in :mod:`ffdl.cli.commands` by group; this module composes them.
"""

from __future__ import annotations

import typer

from ffdl.cli.commands import jobs, nodes, platform, sre, tenants

app = typer.Typer(
    help="ffdl: an event-sourced multi-tenant deep-learning training platform.", no_args_is_help=True
)
for group in (platform, jobs, sre):
    app.add_typer(group.app)
app.add_typer(tenants.app, name="tenants")
app.add_typer(nodes.app, name="nodes")
