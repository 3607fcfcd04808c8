"""What reactions share: the ports they act through and the settings they act by."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.core.places import CheckpointPlaces
from ffdl.core.reconcile import Action
from ffdl.events.envelope import CommandData
from ffdl.events.ids import reaction_command_id
from ffdl.handlers.messaging import CommandSender
from ffdl.handlers.ports import HeartbeatStore, Launcher


@dataclass(frozen=True, slots=True)
class ReactionContext:
    sender: CommandSender
    launcher: Launcher
    learner_env: Mapping[str, str] = field(default_factory=dict)
    stop_grace_s: float = 10.0
    #: The job's own directory on this host, if it has one here (its learners work in its ``work/``).
    job_dir: Callable[[str], Path | None] = lambda job_id: None
    #: Where else a job's results may be measured (absolute result places).
    result_roots: tuple[Path, ...] = ()
    #: Where a job's checkpoints must lie: an attempt is never launched from one elsewhere.
    checkpoints: CheckpointPlaces | None = None
    #: Where the learners' exit records are read: a relaunch reports the checkpoints its stopped
    #: ranks saved on their way out before it asks for the next attempt (None: it does not).
    heartbeats: HeartbeatStore | None = None

    def grace_s(self, job: Job) -> float:
        """How long a stop of ``job``'s learners waits between SIGTERM and SIGKILL: the job's
        ``stop_grace_s`` when its manifest names one (a job that checkpoints for long on SIGTERM
        asks for more), else the platform's."""
        return self.stop_grace_s if job.spec.stop_grace_s is None else job.spec.stop_grace_s

    async def send(self, job: Job, action: Action, *data: CommandData) -> None:
        """Send the commands an action calls for, in one append, each with an id fixed by the job,
        action, state entry and its place among them, so re-running the action after a crash or
        redelivery sends the very same commands."""
        await self.send_parts(
            job, action, [(str(index) if index else "", item) for index, item in enumerate(data)]
        )

    async def send_parts(self, job: Job, action: Action, parts: Sequence[tuple[str, CommandData]]) -> None:
        """Send commands in one append, in order, each with an id fixed by the job, action, state
        entry and its part's name (the empty name: the action's own command), for commands that
        are not always the same ones when the action is re-run: a name that says what the command
        is about keeps one id from ever standing for two different commands."""
        address = JOBS.address(job.job_id, job.tenant)
        commands = [
            self.sender.make(
                address,
                item,
                command_id=reaction_command_id(
                    job.job_id,
                    f"{action.kind}/{name}" if name else action.kind,
                    action.attempt,
                    action.since_seq,
                ),
            )
            for name, item in parts
        ]
        await self.sender.send(*commands)
