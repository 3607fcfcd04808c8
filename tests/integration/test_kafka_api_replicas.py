"""Two API replicas on Kafka, each with its own projection: both serve every job and both are ready.

Three ``ffdl up`` processes share one broker: one runs ``workers,scheduler`` (with instant
learners), two run ``api,projector``, each in a data directory of its own, as API pods with a
projection file each would. Each replica's projector folds every partition into its own file (a
consumer group per projection file), so a job submitted through one replica is served by the
other, and each becomes ready once it has caught up with the log.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.test_kafka_scale_out import (
    api_ready,
    broker,
    caught_up,
    environment,
    platform_settings,
    processes,
    start,
)
from tests.services import TansuBroker, free_port, wait_until_async

pytestmark = pytest.mark.integration

__all__ = ["broker", "processes"]  # fixtures

JOBS = 24
JOB = "name: replicated\ncommand: 'true'\nlearners: 1\ngpus: 1\n"


async def test_two_api_replicas_each_serve_every_job_and_become_ready(
    tmp_path: Path, broker: TansuBroker, processes: list[subprocess.Popen[bytes]]
) -> None:
    settings = platform_settings(tmp_path, broker)
    processes.append(start("workers,scheduler", environment(settings), tmp_path / "workers.log"))
    urls = []
    for replica in ("a", "b"):
        url = f"http://127.0.0.1:{free_port()}"
        env = {**environment(settings), "FFDL_DATA_DIR": str(tmp_path / f"api-{replica}"), "FFDL_API": url}
        processes.append(start("api,projector", env, tmp_path / f"api-{replica}.log"))
        urls.append(url)

    async with (
        httpx.AsyncClient(base_url=urls[0], timeout=30) as a,
        httpx.AsyncClient(base_url=urls[1], timeout=30) as b,
    ):
        replicas = (a, b)
        for client in replicas:
            await wait_until_async(lambda c=client: api_ready(c), 60, interval_s=0.2, what="a replica ready")
        job_ids = []
        for n in range(JOBS):
            response = await replicas[n % 2].post("/v1/jobs", content=JOB)
            assert response.status_code == 201, response.text
            job_ids.append(response.json()["job_id"])

        async def all_completed(client: httpx.AsyncClient) -> bool:
            listed = (await client.get("/v1/jobs", params={"state": "completed", "limit": 500})).json()
            return len(listed["jobs"]) == JOBS and await caught_up(client)

        for client in replicas:
            await wait_until_async(lambda c=client: all_completed(c), 60, interval_s=0.25, what="every job")
            for job_id in job_ids:
                job = await client.get(f"/v1/jobs/{job_id}")
                assert job.status_code == 200 and job.json()["state"] == "COMPLETED", job.text
            assert (await client.get("/readyz")).json() == {"ready": True, "behind": {}}
