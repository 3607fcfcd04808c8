"""``ffdl`` as a new user types it against a running platform: mistakes said in people's words,
kubectl's output habits, and verbs with one meaning (cancel stops a live job; delete, asked first,
removes an ended one from the listings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import Result

from ffdl.wiring.config import Settings
from tests.harness import Api, Cli, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e

LONG = ["--steps", "1000", "--delay", "0.05"]


async def test_mistakes_are_one_line_each_in_peoples_words(
    api: Api, settings: Settings, tmp_path: Path
) -> None:
    cli = Cli(settings)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Not_A_Label\nlearners: 0\ncommand: train\n")
    refused = await cli("submit", str(bad))
    assert refused.exit_code == 2
    lines = cli_lines(refused.output)
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), refused.output
    assert any(line.startswith("error: name: ") for line in lines), refused.output
    assert any(line.startswith("error: learners: ") for line in lines), refused.output
    assert "[{" not in refused.output and "'field'" not in refused.output

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nlearners: [1\n")
    unparsable = await cli("submit", str(broken))
    assert unparsable.exit_code == 2 and len(cli_lines(unparsable.output)) == 1, unparsable.output
    assert "line 3, column 1" in unparsable.output and "\\n" not in unparsable.output

    huge = tmp_path / "huge.yaml"
    huge.write_text(manifest("huge", learners=1, gpus=8))  # the one node has 4
    never = await cli("submit", str(huge))
    assert never.exit_code == 1, never.output
    assert "can never run" in never.output, never.output


def cli_lines(output: str) -> list[str]:
    """What the command printed, without the platform's own log lines (it runs in this process)."""
    return [line for line in output.splitlines() if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]


def printed(result: Result) -> str:
    return "\n".join(cli_lines(result.stdout))


async def test_a_job_through_the_command_line_in_kubectls_habits(
    api: Api, settings: Settings, tmp_path: Path
) -> None:
    cli = Cli(settings)
    spec = tmp_path / "job.yaml"
    spec.write_text(manifest("a-rather-long-job-name", learners=1, args=LONG, labels={"team": "vision"}))
    submitted = await cli("submit", str(spec), "--json")
    job_id = yaml.safe_load(submitted.stdout[submitted.stdout.index("{") :])["job_id"]
    await api.wait(job_id, "RUNNING")

    table = await cli("list")  # 80 columns: the id and the state whole, the age relative
    row = next(line for line in cli_lines(table.output) if job_id in line)
    assert "RUNNING" in row and "1x1" in row and "every learner of" in row, table.output
    assert printed(await cli("list", "-o", "name")) == job_id
    listed = yaml.safe_load(printed(await cli("list", "-o", "yaml", "--label", "team=vision")))
    assert [job["job_id"] for job in listed["jobs"]] == [job_id]
    assert yaml.safe_load(printed(await cli("list", "-o", "yaml", "-l", "team=audio")))["jobs"] == []
    wide = await cli("list", "-o", "wide")
    assert "node-a" in wide.output and "tenant" in wide.output
    why = await cli("why", job_id)
    assert f"{job_id} is RUNNING: every learner of attempt 1 started" in " ".join(why.output.split())
    assert "waiting for GPUs" not in why.output
    assert printed(await cli("status", job_id, "-o", "name")) == job_id
    assert "host" in (await cli("status", job_id, "-o", "wide")).output

    logged = await cli("logs", job_id, "--tail", "1", "--attempt", "1")
    assert logged.exit_code == 0 and printed(logged) == "starting from step 0", logged.output

    # a job that has not launched has no log yet: said so, not as a 404's field list
    waiter = await api.submit(manifest("waiter", learners=1, gpus=4, args=LONG))  # node-a has 3 free
    await api.wait(waiter, "QUEUED")
    early = await cli("logs", waiter)
    assert early.exit_code == 2, early.output
    assert f"error: {waiter} is QUEUED: learner 0 has written no log yet" in early.output, early.output
    assert (await cli("cancel", waiter)).exit_code == 0

    assert (await cli("cancel", job_id)).exit_code == 0
    await api.wait(job_id, "CANCELLED", released=True)
    again = await cli("cancel", job_id)
    assert again.exit_code == 2 and f"error: {job_id} has ended (CANCELLED)" in again.output, again.output
    kept = await cli("delete", job_id, answer="n\n")
    assert kept.exit_code == 1 and f"{job_id} was not deleted" in kept.output, kept.output
    assert (await api.job(job_id))["state"] == "CANCELLED"
    deleted = await cli("delete", job_id, answer="y\n")
    assert deleted.exit_code == 0 and f"{job_id}: deleted from the listings" in deleted.output, deleted.output
    await wait_until_async(lambda: gone(api, job_id), 10, what="the job to leave the listings")


async def gone(api: Api, job_id: str) -> bool:
    return (await api.http.get(f"/v1/jobs/{job_id}")).status_code == 404


async def test_logs_follow_waits_for_the_learner_and_status_watch_ends_with_the_job(
    api: Api, settings: Settings, tmp_path: Path
) -> None:
    cli = Cli(settings)
    quick = ["--steps", "20", "--delay", "0.02"]
    # followed from its submission on: the log does not exist yet, and the command waits for it
    followed_id = await api.submit(manifest("followed", learners=1, args=quick))
    followed = await cli("logs", followed_id, "-f")
    assert followed.exit_code == 0, followed.output
    assert cli_lines(followed.stdout) == ["starting from step 0", "done at step 20"], followed.output
    watched_id = await api.submit(manifest("watched", learners=1, args=quick))
    watched = await cli("status", watched_id, "--watch")
    assert watched.exit_code == 0, watched.output
    titles = [line for line in cli_lines(watched.stdout) if line.strip().startswith(f"{watched_id}:")]
    assert len(titles) > 1 and "COMPLETED" in titles[-1], watched.output
