"""A tenant's priority ceiling holds below the API too: a tenant that writes its own commands topic
(``PREFIX.tenant.NAME.commands``) cannot submit a job above the ceiling its tenant record allows. The
owner refuses it (a dead letter naming the ceiling, and the ``command refused`` log line with the
tenant's principal), and ``verify --redecide`` with the tenants file's ceilings decides it so again;
once an admin raises the ceiling, the same submission is decided.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from ffdl.adapters.tenants import TenantRegistry
from ffdl.core.tenancy import DEFAULT_MAX_PRIORITY
from ffdl.events import job_commands as cmd
from ffdl.events.model import JobSpec
from ffdl.tools.log_files import EventFilter
from ffdl.tools.redecide import export_commands_beside, redecide_files
from ffdl.tools.sre import events_topic, export_log
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import fast_settings
from tests.integration.test_forged_commands import Forger
from tests.services import wait_until_async

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl", direct_tenants=["acme"])


@pytest.fixture
async def platform(settings: Settings) -> AsyncIterator[Platform]:
    TenantRegistry(settings.tenants_path).add("acme")
    async with Platform(settings) as running:
        yield running


async def _settled(platform: Platform, job_id: str) -> bool:
    """The job has ended and given its GPUs back, and the owners have decided every command on the
    log: an export now holds each command's events (one decided later would count as undecided)."""
    job = platform.projection.get(job_id)
    if job is None or job["state"] != "COMPLETED" or job["placement"] is not None:
        return False
    commands = platform.topics.commands
    ends = await platform.bus.end_offsets(commands)
    committed = await platform.bus.committed(platform.owners_group, commands)
    return any(ends.values()) and all(committed.get(partition, 0) >= end for partition, end in ends.items())


def submission(priority: int) -> cmd.SubmitJob:
    return cmd.SubmitJob(spec=JobSpec(name="urgent", command="true", priority=priority))


async def test_a_tenant_writing_its_own_topic_cannot_submit_above_its_ceiling(
    platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    forger = Forger(platform)
    topic = platform.topics.ingress("acme")
    with structlog.testing.capture_logs() as logs:
        above = await forger.write(
            topic, forger.job(f"urgent-{uuid.uuid4().hex[:6]}", "acme", submission(DEFAULT_MAX_PRIORITY + 1))
        )
        reason = await forger.answer(above)
    assert reason.startswith("dead letter: ") and "above the ceiling of tenant 'acme'" in reason, reason
    assert platform.projection.get(above.key) is None
    refusals = [line for line in logs if line["event"] == "command refused"]
    assert [line["principal"] for line in refusals] == ["tenant:acme"], refusals
    assert "ceiling" in refusals[0]["reason"]

    at = await forger.write(topic, forger.job(f"fair-{uuid.uuid4().hex[:6]}", "acme", submission(100)))
    await wait_until_async(lambda: platform.projection.get(at.key) is not None, 30, what="the job")
    await wait_until_async(lambda: _settled(platform, at.key), 60, what="all decided")

    # decided again from an export, with the tenants file's ceilings, as the owner decided
    events = tmp_path / "ceiling.events.jsonl"
    await export_commands_beside(str(events), settings.bus_url, settings, EventFilter())
    out = io.StringIO()
    await export_log(settings.bus_url, settings.partitions, events_topic(settings), EventFilter(), out)
    events.write_text(out.getvalue())
    ceilings = TenantRegistry(settings.tenants_path).max_priority
    redecided = redecide_files(events, settings.restart_policy, ceilings)
    assert redecided["matched"] == redecided["commands"], redecided  # none diverged, none undecided

    TenantRegistry(settings.tenants_path).set_max_priority("acme", 1000)
    allowed = await forger.write(
        topic, forger.job(f"urgent-{uuid.uuid4().hex[:6]}", "acme", submission(1000))
    )
    await wait_until_async(lambda: platform.projection.get(allowed.key) is not None, 30, what="the job")
