"""What a launcher asks of the heartbeat store's authentication: a login per job for its agents.

Where the heartbeat store authenticates its clients (etcd with auth on), a launcher gives each job's
agents a login of their own, whose rights cover only that job's learner and exit keys
(:class:`~ffdl.adapters.heartbeats.etcd_auth.EtcdJobUsers` implements it), never the platform's own
credentials. A launcher grants the login when it launches an attempt, with a fresh password, and
revokes it when it stops the job's learners.
"""

from __future__ import annotations

import secrets
from typing import Protocol


class HeartbeatLogins(Protocol):
    async def grant(self, job_id: str, password: str) -> str:
        """Make (or update) the job's login with ``password``; returns its user name."""

    async def revoke(self, job_id: str) -> None:
        """Remove the job's login (a login already gone is fine)."""


def new_password() -> str:
    """A password for one job's login: 192 random bits, URL-safe."""
    return secrets.token_urlsafe(24)
