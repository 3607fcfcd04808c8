"""The platform as tests drive it: fast settings, manifests of the counting learner, an API with waits."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from typer.testing import CliRunner, Result

from ffdl.cli.main import app
from ffdl.wiring.config import KafkaConfig, NodeConfig, Settings
from tests.services import TansuBroker, free_port

LEARNER = Path(__file__).with_name("learners") / "counting.py"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}
#: Tests run their learners sandboxed (the default) as the platform's own user inside; the isolation
#: and hostile tests (tests/e2e/test_learner_isolation.py, test_hostile_learner.py) run them as the
#: default learner user, with the default learners' root.
PLATFORM_USER = pwd.getpwuid(os.geteuid()).pw_name


#: Kafka client settings for tests: a member expelled within seconds, requests that may wait on a
#: busy two-CPU machine.
FAST_KAFKA = KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2, request_timeout_s=30.0)


def bus_under_test(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The settings that put a test parametrised ``embedded``/``kafka`` on its bus: none for the
    embedded log; the module's tansu broker (the ``broker`` fixture), :data:`FAST_KAFKA` and a topic
    prefix of its own for Kafka."""
    if request.param == "embedded":
        return {}
    broker: TansuBroker = request.getfixturevalue("broker")
    return {"bus": broker.url, "kafka": FAST_KAFKA, "topic_prefix": f"test-{uuid.uuid4().hex[:10]}"}


def fast_settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "learners_dir": data_dir.with_name(f"{data_dir.name}-learners"),
        "learner_user": PLATFORM_USER,
        "api": f"http://127.0.0.1:{free_port()}",
        "heartbeat_ttl_s": 1.0,
        "monitor_grace_s": 3.0,
        "stop_grace_s": 3.0,
        "restart_backoff_base_s": 0.2,
        "launch_timeout_s": 30.0,
        "partitions": 4,
        "nodes": [NodeConfig(name="node-a", gpus=4)],
    }
    values.update(overrides)
    return Settings(**values)


def learner_variables(settings: Settings) -> dict[str, str]:
    """The learners' root and user of ``settings``, for a platform started as a process."""
    return {"FFDL_LEARNERS_DIR": str(settings.work_dir), "FFDL_LEARNER_USER": settings.learner_user}


def settings_environment(settings: Settings) -> dict[str, str]:
    """The ``FFDL_*`` variables that make a platform started as a process (``ffdl up``) read the
    fields set in ``settings``: scalars as text, lists, maps and sections as JSON."""
    variables: dict[str, str] = {}
    for name, value in settings.model_dump(mode="json", include=settings.model_fields_set).items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        variables[f"FFDL_{name.upper()}"] = text
    return variables


def learner_command(*args: str) -> str:
    return " ".join([sys.executable, str(LEARNER), *args])


def manifest(
    name: str = "job", *, learners: int = 2, gpus: int = 1, args: Iterable[str] = (), **extra: Any
) -> str:
    spec = {"name": name, "learners": learners, "gpus": gpus, "command": learner_command(*args), **extra}
    return yaml.safe_dump(spec)


class Api:
    """The platform's HTTP API as a test sees it, with bounded waits for states."""

    def __init__(self, client: httpx.AsyncClient, app: FastAPI) -> None:
        self.http = client
        self.app = app

    async def submit(self, text: str) -> str:
        response = await self.http.post(
            "/v1/jobs", content=text, headers={"Content-Type": "application/yaml"}
        )
        assert response.status_code == 201, response.text
        return str(response.json()["job_id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def wait(
        self, job_id: str, *states: str, timeout_s: float = 60.0, released: bool = False
    ) -> dict[str, Any]:
        """Wait until the job is in one of ``states`` (and, with ``released``, holds no GPUs)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        job: dict[str, Any] = {}
        while asyncio.get_running_loop().time() < deadline:
            job = await self.job(job_id)
            if job["state"] in states and (not released or job["placement"] is None):
                return job
            if job["state"] in TERMINAL and job["state"] not in states:
                break
            await asyncio.sleep(0.1)
        raise AssertionError(
            f"job {job_id} did not reach {states}: it is {job.get('state')} ({job.get('reason')})"
        )

    async def wait_for(
        self, job_id: str, predicate: Any, what: str, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        job: dict[str, Any] = {}
        while asyncio.get_running_loop().time() < deadline:
            job = await self.job(job_id)
            if predicate(job):
                return job
            await asyncio.sleep(0.1)
        raise AssertionError(f"job {job_id}: {what} did not happen; last state {job.get('state')}")


class Cli:
    """``ffdl`` run in process, in a worker thread (the platform's event loop keeps running)."""

    def __init__(self, settings: Settings) -> None:
        self.env = {"FFDL_API": settings.api, "COLUMNS": "80"}  # a terminal of 80 columns
        self.runner = CliRunner()

    async def __call__(self, *args: str, answer: str | None = None) -> Result:
        """The command's result; ``answer`` is what the user types when it asks."""
        return await asyncio.to_thread(self.runner.invoke, app, list(args), input=answer, env=self.env)

    async def json(self, *args: str) -> Any:
        result = await self(*args, "--json")
        assert result.exit_code == 0, result.output
        text = "\n" + result.output  # the platform's own log lines may come before and after
        start = min(i for i in (text.find("\n{"), text.find("\n[")) if i >= 0) + 1
        value, _ = json.JSONDecoder().raw_decode(text, start)
        return value
