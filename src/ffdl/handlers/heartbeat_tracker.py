"""The monitor's state machine: what each heartbeat, exit record, deletion, probe and tick means.

It knows the learners of the jobs it watches and everything it has read from the heartbeat store,
and turns what happens into reports for the jobs' owners:

* a learner's first heartbeat of an attempt -> ``ReportLearnerStarted``;
* a change of step or metrics -> ``ReportProgress`` (at most every ``progress_interval_s`` per
  learner, flushed before an exit so final metrics are never lost); a change from what the job
  already records, that is: a learner at step 0 with no metrics yet reports nothing;
* a new checkpoint in the heartbeat -> ``ReportCheckpoint``, also from the learners of the attempt
  a restarting job has just left: they are stopped before the relaunch, and the checkpoint a
  surviving rank saves (or finds in its final scan) on its way out is the one a program that
  resumes from its newest file will load, so the relaunch must know of it (the relaunch reads
  their exit records itself too, since these reports and its ``BeginLaunch`` come from two
  producers: ``handlers/launching.py``). At most one a learner every ``checkpoint_interval_s``:
  each becomes a ``CheckpointRecorded`` on the job's log, and a learner's side may name a new one
  in every beat (whoever holds the job's etcd login writes its beats as fast as etcd takes them),
  so one named within the interval waits, and a newer one replaces it (a restart resumes from the
  latest alone). What waits is reported when the interval is over (on a tick), and at once
  before any learner of its job is reported exited or lost, and when the job is no longer watched
  (a restart, a halt): the last checkpoint of a running learner is recorded before the report that
  moves the job on (its exit or loss, which a halt waits for). A learner stopped for a restart has
  its first exit record reported at once, with what waits for it; a restarting job's halt (or
  preemption) is decided at once, though, naming what is recorded by then, and a checkpoint its
  stopped learner named only in a beat, within the interval of its previous one, may still wait
  then: it is not recorded (a halted job holds no learners);
* an exit record -> ``ReportLearnerExited`` with the code, after the checkpoint the record names
  if it is new (the beat that named it may have gone with the lease unread); also when the record
  was read before the job was observed: a monitor that starts reads the store before its jobs are
  folded from the log;
* a learner key deleted without an exit record (its lease expired) -> ``ReportLearnerLost(expired)``;
* a key of a rank the job does not have (a learner's side may write any) -> nothing, noted once a
  job: each report of it was refused as a ``CommandRejected`` on the job's log;
* no progress of the *gang* for the job's ``progress_timeout_s`` -> ``ReportLearnerLost(hung)`` of
  the learner that progressed last the longest ago; process liveness is not progress. Any learner's
  progress is the gang's: a new step or metric, a new checkpoint, any new output line (each moves
  the beat's ``last_progress``). Ranks of a data-parallel job advance together or not at all (each
  step ends in a collective), so a quiet rank whose gang progresses is alive (only rank 0 logging
  is normal practice), and a gang stuck in a collective behind one stopped or deadlocked rank makes
  no progress anywhere, which is what is detected. Liveness stays per learner: its lease.

Exit records have no lease (they must outlive the agent), so they are marked *spent* once they
matter no more, for the shell to delete: when the job leaves the attempt they belong to (its owner
has decided on them by then), and for a job adopted from the log that is past them.

A store outage is not a learner death. Losses are decided only while the store is *healthy*: the
shell follows it (a snapshot and a watch from the snapshot's revision) and its last probe of the
store came back in time. Whenever the store becomes healthy (first followed, followed again, a
probe answered after trouble), learners get ``grace_s`` to re-register before anything is reaped:
etcd itself expires the leases that could not be renewed while it was unreachable, so the
deletions that follow an outage are of learners that are alive and about to write their key again
with a new lease. A deletion seen while unhealthy or within the grace marks the learner *gone*;
when the grace ends, a learner still gone (no new heartbeat of its attempt) is lost. A job adopted
from the log (a partition taken over from another monitor, or loaded at start) gets the same
grace. Hang detection waits the same way.

Nothing here reads a clock or touches the world: every input carries the time, on the monotonic
clock (``now``, seconds) and, for the tick, on the wall clock the events' times are written in
(``wall``). Every input returns its *effects*, the reports to send and the notes to log, in order;
the async shell (``handlers/monitoring.py``) does the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ffdl.core.job import Job
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import CommandData
from ffdl.events.model import Checkpoint, LossReason
from ffdl.handlers.heartbeat_keys import (
    ExitRecord,
    LearnerBeat,
    exit_key,
    learner_key,
    parse_exit,
    parse_key,
    recorded_checkpoint,
)


@dataclass(frozen=True, slots=True)
class Report:
    """A command for the owner of ``job_id``: what the monitor concluded about one of its learners."""

    job_id: str
    tenant: str
    data: CommandData


@dataclass(frozen=True, slots=True)
class Note:
    """Something worth a log line; the shell writes it, since the state machine does no I/O."""

    level: Literal["info", "warning", "error"]
    message: str
    details: Mapping[str, object] = field(default_factory=dict)


Effect = Report | Note

#: The least time between two checkpoints reported for one learner (see the module docstring).
CHECKPOINT_INTERVAL_S = 1.0


@dataclass(slots=True)
class _Checkpoints:
    """What has been reported of one learner's checkpoints, and the latest one waiting its turn."""

    sent: tuple[str, int] | None = None
    sent_at: float = -math.inf
    waiting: Checkpoint | None = None


@dataclass(slots=True)
class _Restart:
    """A restarting job, whose past attempt's learners are being stopped: their checkpoints, by rank."""

    job: Job
    checkpoints: dict[int, _Checkpoints] = field(default_factory=dict)
    #: The ranks whose exit record has been read: their first is reported at once, a rewrite is not.
    exited: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Learner:
    """What the tracker knows of one learner of the job's current attempt."""

    attempt: int
    beat: LearnerBeat | None = None
    progress_at: float = 0.0
    sent_progress: tuple[int, tuple[tuple[str, float], ...]] | None = None
    sent_progress_at: float = 0.0
    checkpoints: _Checkpoints = field(default_factory=_Checkpoints)
    exited: bool = False
    lost: bool = False
    gone: bool = False
    started_sent: bool = False


@dataclass(slots=True)
class _Watched:
    job: Job
    reap_after: float = 0.0
    learners: dict[int, _Learner] = field(default_factory=dict)
    strays_noted: bool = False

    def learner(self, rank: int) -> _Learner:
        entry = self.learners.get(rank)
        if entry is None or entry.attempt != self.job.attempt:
            entry = _Learner(attempt=self.job.attempt, sent_progress=self._recorded(rank))
            self.learners[rank] = entry
        return entry

    def all_checkpoints(self) -> list[_Checkpoints]:
        return [learner.checkpoints for learner in self.learners.values()]

    def checkpoints_of(self, attempt: int) -> dict[int, _Checkpoints]:
        return {rank: entry.checkpoints for rank, entry in self.learners.items() if entry.attempt == attempt}

    def _recorded(self, rank: int) -> tuple[int, tuple[tuple[str, float], ...]] | None:
        """The progress the job records for ``rank``'s learner: reporting it again would tell its
        owner nothing (a new attempt's learners start at step 0 with no metrics)."""
        if rank >= len(self.job.learners):
            return None
        learner = self.job.learners[rank]
        return (learner.step, learner.metrics)


class HeartbeatTracker:
    def __init__(
        self,
        *,
        grace_s: float,
        launch_timeout_s: float,
        progress_interval_s: float,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
    ) -> None:
        self._grace_s = grace_s
        self._launch_timeout_s = launch_timeout_s
        self._progress_interval_s = progress_interval_s
        self._checkpoint_interval_s = checkpoint_interval_s
        self._watched: dict[str, _Watched] = {}
        self._beats_by_key: dict[str, LearnerBeat] = {}
        self._exits: dict[str, dict[tuple[int, int], ExitRecord]] = {}
        self._spent_exits: set[str] = set()
        self._past_attempt: dict[str, int] = {}  # job -> the last attempt it has moved past
        self._restarting: dict[str, _Restart] = {}
        self._reap_after = 0.0
        self._effects: list[Effect] = []
        self.store_up = False
        self.probe_ok = True

    @property
    def healthy(self) -> bool:
        """Whether the store is followed and answering: losses may be decided (after the grace)."""
        return self.store_up and self.probe_ok

    @property
    def spent_exits(self) -> list[str]:
        """The keys of exit records that matter no more, for the shell to delete from the store."""
        return sorted(self._spent_exits)

    def exit_deleted(self, key: str) -> None:
        self._spent_exits.discard(key)

    # -- the jobs, as the reactor host folds them ---------------------------------------------------

    def observe(self, job: Job, *, adopted: bool, now: float) -> None:
        """Track ``job``; ``adopted``: loaded from the log rather than followed live, so it gets a grace."""
        left = self._watched.get(job.job_id)
        if left is not None and (not job.state.observes_learners or job.attempt != left.job.attempt):
            self._flush_checkpoints(left.job, left.all_checkpoints(), now)  # the job moves on: the latest
        if not job.state.observes_learners:
            self._watched.pop(job.job_id, None)
            # A restarting job already carries the number of the attempt it is about to launch.
            restarting = job.state is JobState.RESTARTING
            past = job.attempt - 1 if restarting else job.attempt
            self._past_attempt[job.job_id] = past
            restart = self._restarting.get(job.job_id)
            if restarting and restart is not None:
                restart.job = job
            elif restarting:
                # what the past attempt's learners reported while watched counts: no burst anew
                known = {} if left is None else left.checkpoints_of(past)
                self._restarting[job.job_id] = _Restart(job, known)
                self._saved_before(job, past, now)
            else:
                self._end_restart(job.job_id, now)
            self._forget_exits(job.job_id, up_to_attempt=past)
            return
        self._end_restart(job.job_id, now)
        watched = self._watched.get(job.job_id)
        if watched is None:
            watched = self._watched[job.job_id] = _Watched(job)
            if adopted:
                watched.reap_after = now + self._grace_s
        watched.job = job

    def forget(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._watched.pop(job_id, None)
            self._past_attempt.pop(job_id, None)
            self._restarting.pop(job_id, None)

    # -- the store --------------------------------------------------------------------------------

    def resync(self, values: Mapping[str, bytes], now: float, *, revision: int) -> list[Effect]:
        """A snapshot of every learner key at ``revision``: the store is followed (again)."""
        if not self.store_up:
            self.store_up = True
            self._start_grace(
                now, "heartbeat store reachable: following learners", revision=revision, keys=len(values)
            )
        exits = {key: value for key, value in values.items() if _is_exit(key)}
        for key, value in sorted(exits.items()):
            self._on_put(key, value, now)
        for key in [key for key in self._beats_by_key if key not in values]:
            self._on_delete(key, now)
        for key, value in sorted(values.items()):
            if key not in exits:
                self._on_put(key, value, now)
        return self._take_effects()

    def put(self, key: str, value: bytes, now: float) -> list[Effect]:
        """The watch saw ``key`` written."""
        self._on_put(key, value, now)
        return self._take_effects()

    def delete(self, key: str, now: float) -> list[Effect]:
        """The watch saw ``key`` deleted (revoked, or its lease expired)."""
        self._on_delete(key, now)
        return self._take_effects()

    def store_lost(self, reason: str) -> list[Effect]:
        """The shell follows the store no more (it broke, or the monitor restarts): reaping pauses."""
        if self.store_up:
            self._note("warning", "heartbeat store not followed: reaping paused", reason=reason)
        self.store_up = False
        return self._take_effects()

    def probe_failed(self, reason: str) -> list[Effect]:
        """A probe of the store failed or took too long: the store may be frozen, reaping pauses."""
        if self.probe_ok:
            self._note("warning", "heartbeat store slow or unreachable: reaping paused", reason=reason)
        self.probe_ok = False
        return self._take_effects()

    def probe_answered(self, now: float) -> list[Effect]:
        """A probe of the store came back in time."""
        if not self.probe_ok:
            self.probe_ok = True
            self._start_grace(now, "heartbeat store answers again")
        return self._take_effects()

    # -- time -------------------------------------------------------------------------------------

    def tick(self, now: float, wall: datetime) -> list[Effect]:
        """What time alone decides: exits not reported yet, the end of a grace, hangs, late starts,
        checkpoints whose interval is over."""
        for watched in list(self._watched.values()):
            self._flush_checkpoints(watched.job, watched.all_checkpoints(), now, due_only=True)
            self._check(watched, now, wall)
        for restart in self._restarting.values():
            self._flush_checkpoints(restart.job, restart.checkpoints.values(), now, due_only=True)
        return self._take_effects()

    def _check(self, watched: _Watched, now: float, wall: datetime) -> None:
        job = watched.job
        exits = self._exits.get(job.job_id, {})
        hung = self._hung_learner(watched, now)
        for state in job.learners:
            if not state.active:
                continue
            learner = watched.learner(state.rank)
            if learner.lost or learner.exited:
                continue
            record = exits.get((job.attempt, state.rank))
            if record is not None:
                self._report_exit(watched, state.rank, record, now)
                continue
            if learner.beat is None:
                known = self._beats_by_key.get(learner_key(job.job_id, state.rank))
                if known is not None and known.attempt == job.attempt:
                    self._take_beat(watched, state.rank, known, now, new=True)
            self._maybe_progress(job, state.rank, learner, now, force=False)
            if not self._may_reap(watched, now):
                continue
            if learner.gone:
                detail = f"heartbeat lease expired; not re-registered within {self._grace_s:.0f}s"
                self._lose(watched, state.rank, LossReason.EXPIRED, detail, now)
            elif learner.beat is None:
                waited = (wall - job.history[-1].at).total_seconds()
                limit = self._launch_timeout_s if job.state is JobState.LAUNCHING else self._grace_s
                if waited > limit:
                    detail = f"no heartbeat within {limit:.0f}s"
                    self._lose(watched, state.rank, LossReason.EXPIRED, detail, now)
            elif state.rank == hung:
                timeout = job.spec.progress_timeout_s
                detail = (
                    f"the gang made no progress for {timeout:.0f}s (rank {hung} at step {learner.beat.step})"
                )
                self._lose(watched, state.rank, LossReason.HUNG, detail, now)
                hung = None

    def _hung_learner(self, watched: _Watched, now: float) -> int | None:
        """The rank to report hung when the job's gang made no progress for its timeout: of the
        learners running (they beat, and have not exited), the one whose last progress is oldest;
        None while the gang progresses, or once one of its learners is lost (the gang restarts:
        one report is enough). A learner that finished counts as progress when it finished, so the
        silent ranks it leaves behind have the timeout to finish too. A learner not beating yet is
        the launch timeout's business."""
        job = watched.job
        if job.state is not JobState.RUNNING:
            return None
        latest = 0.0
        running: list[tuple[float, int]] = []
        for state in job.learners:
            learner = watched.learner(state.rank)
            if state.active and learner.lost:
                return None
            if learner.beat is None or not (state.active or learner.exited):
                continue
            latest = max(latest, learner.progress_at)
            if state.active and not learner.exited:
                running.append((learner.progress_at, state.rank))
        if not running or now - latest <= job.spec.progress_timeout_s:
            return None
        return min(running)[1]

    # -- reactions --------------------------------------------------------------------------------

    def _start_grace(self, now: float, message: str, **details: object) -> None:
        self._reap_after = max(self._reap_after, now + self._grace_s)
        self._note("info", message, grace_s=self._grace_s, **details)

    def _may_reap(self, watched: _Watched, now: float) -> bool:
        return self.healthy and now >= self._reap_after and now >= watched.reap_after

    def _on_put(self, key: str, value: bytes, now: float) -> None:
        """A key written: read on its own, so that nothing in one key, which a learner's side
        writes, stops the monitor for every job (a nested checkpoint once crashed the role at the
        same key after every restart, and no learner anywhere was reported lost)."""
        try:
            self._read_put(key, value, now)
        except Exception as exc:  # the rest of the store is read on; the key is named
            self._note("error", "heartbeat key skipped", key=key, error=f"{type(exc).__name__}: {exc}"[:500])

    def _read_put(self, key: str, value: bytes, now: float) -> None:
        parsed = parse_key(key)
        if parsed is None:
            return
        if parsed.kind == "exit":
            self._on_exit_record(parsed.job_id, parsed.attempt or 0, parsed.rank, value, now)
            return
        watched = self._watched.get(parsed.job_id)
        if watched is not None and self._stray(watched, parsed.rank):
            return
        tenant = watched.job.tenant if watched is not None else None
        try:
            beat = LearnerBeat.from_json(value)
        except ValueError as exc:
            self._note(
                "warning",
                "unreadable heartbeat ignored",
                key=key,
                job_id=parsed.job_id,
                tenant=tenant,
                error=str(exc),
            )
            return
        previous = self._beats_by_key.get(key)
        self._beats_by_key[key] = beat
        if beat.dropped and (previous is None or previous.dropped != beat.dropped):
            self._note(
                "warning",
                "learner report cut to the bounds",
                job_id=parsed.job_id,
                tenant=tenant,
                rank=parsed.rank,
                reasons=list(beat.dropped),
            )
        if watched is None:
            self._checkpoint_on_the_way_out(parsed.job_id, parsed.rank, beat.attempt, beat.checkpoint, now)
            return
        if beat.attempt != watched.job.attempt:
            return
        new = previous is None or previous.attempt != beat.attempt
        self._take_beat(watched, parsed.rank, beat, now, new=new)

    def _take_beat(self, watched: _Watched, rank: int, beat: LearnerBeat, now: float, *, new: bool) -> None:
        """A heartbeat of the job's current attempt: the learner is there (again)."""
        learner = watched.learner(rank)
        job = watched.job
        if learner.gone:
            learner.gone = False
            self._note("info", "learner re-registered", job_id=job.job_id, rank=rank, attempt=beat.attempt)
        previous = learner.beat
        if (
            new
            or previous is None
            or (beat.step, beat.last_progress, beat.checkpoint)
            != (previous.step, previous.last_progress, previous.checkpoint)
        ):
            learner.progress_at = now
        learner.beat = beat
        if not learner.started_sent and rank < len(job.learners) and not job.learners[rank].has_started:
            learner.started_sent = True
            started = cmd.ReportLearnerStarted(rank=rank, attempt=beat.attempt, pid=beat.pid, host=beat.host)
            self._report(job, started)
        self._maybe_progress(job, rank, learner, now, force=False)
        self._maybe_checkpoint(job, rank, learner, beat.checkpoint, now)

    def _on_exit_record(self, job_id: str, attempt: int, rank: int, value: bytes, now: float) -> None:
        try:
            record = parse_exit(value)
        except ValueError as exc:
            self._note(
                "warning", "unreadable exit record", job_id=job_id, rank=rank, attempt=attempt, error=str(exc)
            )
            return
        watched = self._watched.get(job_id)
        if watched is not None and self._stray(watched, rank):
            return
        self._exits.setdefault(job_id, {})[(attempt, rank)] = record
        past = self._past_attempt.get(job_id, 0)
        if attempt <= past:  # written after its job moved on (a learner stopped by a halt or cancel)
            self._stopped_exit(job_id, rank, attempt, record, now)
            self._forget_exits(job_id, up_to_attempt=past)
            return
        if watched is not None and watched.job.attempt == attempt:
            self._report_exit(watched, rank, record, now)

    def _stopped_exit(self, job_id: str, rank: int, attempt: int, record: ExitRecord, now: float) -> None:
        """The exit record of a learner of the attempt a restarting job has just left. Its first is
        reported at once, after the checkpoint its beats named that waits: a halt (or a preemption)
        of a restarting job is decided at once, naming the checkpoint recorded by then, and a
        report a second later is refused (a halted job holds no learners). A rewrite of the record
        waits its turn as a beat does: a learner's side may rewrite it as fast as etcd takes writes."""
        restart = self._restarting.get(job_id)
        first = (
            restart is not None
            and attempt == self._past_attempt.get(job_id)
            and rank < restart.job.spec.learners
            and rank not in restart.exited
        )
        if restart is not None and first:
            restart.exited.add(rank)
            waiting = restart.checkpoints.get(rank)
            if waiting is not None:
                self._flush_checkpoints(restart.job, [waiting], now)
        self._checkpoint_on_the_way_out(job_id, rank, attempt, record.checkpoint, now, force=first)

    def _report_exit(self, watched: _Watched, rank: int, record: ExitRecord, now: float) -> None:
        """The learner's exit, after its last progress and checkpoint: its final beat's, and the exit
        record's too (the beat may have gone with the lease before it was read)."""
        learner = watched.learner(rank)
        if learner.exited:
            return
        self._maybe_progress(watched.job, rank, learner, now, force=True)
        self._flush_checkpoints(watched.job, watched.all_checkpoints(), now)
        if learner.beat is not None:
            self._maybe_checkpoint(watched.job, rank, learner, learner.beat.checkpoint, now, force=True)
        self._maybe_checkpoint(watched.job, rank, learner, record.checkpoint, now, force=True)
        learner.exited = True
        code = record.exit_code
        if code == 0:
            # finishing is progress: its peers (often silent ranks) get the timeout to finish too
            learner.progress_at = now
        self._report(
            watched.job, cmd.ReportLearnerExited(rank=rank, attempt=watched.job.attempt, exit_code=code)
        )

    def _on_delete(self, key: str, now: float) -> None:
        parsed = parse_key(key)
        beat = self._beats_by_key.pop(key, None)
        if parsed is None or parsed.kind != "learner" or beat is None:
            return
        watched = self._watched.get(parsed.job_id)
        if watched is None or watched.job.attempt != beat.attempt:
            return
        if self._stray(watched, parsed.rank):
            return  # kept while the job was not watched (the monitor's start, a restart): no learner's
        if (beat.attempt, parsed.rank) in self._exits.get(parsed.job_id, {}):
            return  # a clean exit: the agent wrote its exit record before it revoked the lease
        learner = watched.learner(parsed.rank)
        if learner.lost or learner.exited:
            return
        if self._may_reap(watched, now):
            self._lose(watched, parsed.rank, LossReason.EXPIRED, "heartbeat lease expired", now)
            return
        learner.gone = True
        self._note(
            "info",
            "heartbeat deleted during a grace period: waiting for the learner to re-register",
            job_id=parsed.job_id,
            rank=parsed.rank,
            attempt=beat.attempt,
        )

    def _forget_exits(self, job_id: str, up_to_attempt: int) -> None:
        """Exit records of attempts that are over matter no more; later attempts have higher numbers."""
        exits = self._exits.get(job_id)
        if exits is None:
            return
        for attempt, rank in [k for k in exits if k[0] <= up_to_attempt]:
            del exits[(attempt, rank)]
            self._spent_exits.add(exit_key(job_id, attempt, rank))
        if not exits:
            del self._exits[job_id]

    # -- effects ----------------------------------------------------------------------------------

    def _maybe_progress(self, job: Job, rank: int, learner: _Learner, now: float, *, force: bool) -> None:
        beat = learner.beat
        if beat is None:
            return
        current = (beat.step, tuple(sorted(beat.metrics.items())))
        if current == learner.sent_progress:
            return
        if not force and now - learner.sent_progress_at < self._progress_interval_s:
            return
        learner.sent_progress, learner.sent_progress_at = current, now
        progress = cmd.ReportProgress(
            rank=rank, attempt=beat.attempt, step=beat.step, metrics=beat.metrics, dropped=beat.dropped
        )
        self._report(job, progress)

    def _maybe_checkpoint(
        self,
        job: Job,
        rank: int,
        learner: _Learner,
        named: Mapping[str, Any] | None,
        now: float,
        *,
        force: bool = False,
    ) -> None:
        """Report the checkpoint ``named`` (by a beat or an exit record of the job's current attempt)
        unless it is the one last reported for this learner; within the interval, or with ``force``
        at once."""
        checkpoint = self._checkpoint_of(job, rank, job.attempt, named)
        if checkpoint is not None:
            self._offer_checkpoint(job, learner.checkpoints, checkpoint, now, force=force)

    def _offer_checkpoint(
        self, job: Job, checkpoints: _Checkpoints, checkpoint: Checkpoint, now: float, *, force: bool
    ) -> None:
        """A learner's latest checkpoint: reported now if its last was reported at least an interval
        ago (or ``force``), else it waits, replacing the one that waited (only the latest matters)."""
        if (checkpoint.uri, checkpoint.step) == checkpoints.sent:
            checkpoints.waiting = None
        elif force or now - checkpoints.sent_at >= self._checkpoint_interval_s:
            self._send_checkpoint(job, checkpoints, checkpoint, now)
        else:
            checkpoints.waiting = checkpoint

    def _flush_checkpoints(
        self, job: Job, learners: Iterable[_Checkpoints], now: float, *, due_only: bool = False
    ) -> None:
        """Report the checkpoints that wait: all, or with ``due_only`` those whose interval is over."""
        for checkpoints in learners:
            waiting = checkpoints.waiting
            if waiting is None:
                continue
            if due_only and now - checkpoints.sent_at < self._checkpoint_interval_s:
                continue
            self._send_checkpoint(job, checkpoints, waiting, now)

    def _send_checkpoint(
        self, job: Job, checkpoints: _Checkpoints, checkpoint: Checkpoint, now: float
    ) -> None:
        checkpoints.sent = (checkpoint.uri, checkpoint.step)
        checkpoints.sent_at = now
        checkpoints.waiting = None
        self._report(job, cmd.ReportCheckpoint(checkpoint=checkpoint))

    def _stray(self, watched: _Watched, rank: int) -> bool:
        """Whether ``rank`` is none of the job's: its keys are passed over (a report of it was refused
        as a ``CommandRejected`` on the job's log, one for every key a learner's side wrote), noted
        once a job."""
        if rank < watched.job.spec.learners:
            return False
        if not watched.strays_noted:
            watched.strays_noted = True
            job = watched.job
            self._note(
                "warning",
                "heartbeat keys of ranks the job does not have are passed over",
                job_id=job.job_id,
                tenant=job.tenant,
                rank=rank,
                learners=job.spec.learners,
            )
        return True

    def _saved_before(self, job: Job, past: int, now: float) -> None:
        """The checkpoints that the beats and exit records of the attempt ``job`` is restarting from
        name, read from the store before the restart began (a monitor that starts reads the store
        before it folds the jobs; a live one has just seen the job leave that attempt): reported now,
        once, before those records are spent."""
        restart = self._restarting[job.job_id]
        for (attempt, rank), record in self._exits.get(job.job_id, {}).items():
            if attempt == past and rank < job.spec.learners:
                restart.exited.add(rank)  # reported now: a rewrite waits its turn
                self._checkpoint_on_the_way_out(job.job_id, rank, attempt, record.checkpoint, now, force=True)
        for rank in range(job.spec.learners):
            beat = self._beats_by_key.get(learner_key(job.job_id, rank))
            if beat is not None and beat.attempt == past:
                self._checkpoint_on_the_way_out(job.job_id, rank, past, beat.checkpoint, now, force=True)

    def _checkpoint_on_the_way_out(
        self,
        job_id: str,
        rank: int,
        attempt: int,
        named: Mapping[str, Any] | None,
        now: float,
        *,
        force: bool = False,
    ) -> None:
        """A checkpoint named by a beat or an exit record of the attempt a restarting job has just
        left: reported as a running learner's are, at most one a rank every interval."""
        restart = self._restarting.get(job_id)
        if restart is None or attempt != self._past_attempt.get(job_id):
            return
        job = restart.job
        if rank >= job.spec.learners:
            return
        checkpoint = self._checkpoint_of(job, rank, attempt, named)
        if checkpoint is None:
            return
        checkpoints = restart.checkpoints.setdefault(rank, _Checkpoints())
        self._offer_checkpoint(job, checkpoints, checkpoint, now, force=force)

    def _end_restart(self, job_id: str, now: float) -> None:
        """The restart is over (the next attempt launches, or the job stopped): what waits is reported."""
        restart = self._restarting.pop(job_id, None)
        if restart is not None:
            self._flush_checkpoints(restart.job, restart.checkpoints.values(), now)

    def _checkpoint_of(
        self, job: Job, rank: int, attempt: int, named: Mapping[str, Any] | None
    ) -> Checkpoint | None:
        """The checkpoint a beat or an exit record names, as the owner records it; None without one
        or when unreadable."""
        if not named:
            return None
        try:
            return recorded_checkpoint(named, rank, attempt)
        except ValueError as exc:
            self._note(
                "warning",
                "unreadable checkpoint in a learner's report",
                job_id=job.job_id,
                rank=rank,
                error=str(exc),
            )
            return None

    def _lose(self, watched: _Watched, rank: int, reason: LossReason, detail: str, now: float) -> None:
        job = watched.job
        self._flush_checkpoints(job, watched.all_checkpoints(), now)
        watched.learner(rank).lost = True
        self._note(
            "warning",
            "learner lost",
            job_id=job.job_id,
            rank=rank,
            attempt=job.attempt,
            reason=str(reason),
            detail=detail,
        )
        self._report(job, cmd.ReportLearnerLost(rank=rank, attempt=job.attempt, reason=reason, detail=detail))

    def _report(self, job: Job, data: CommandData) -> None:
        self._effects.append(Report(job.job_id, job.tenant, data))

    def _note(self, level: Literal["info", "warning", "error"], message: str, **details: object) -> None:
        self._effects.append(Note(level, message, details))

    def _take_effects(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects


def _is_exit(key: str) -> bool:
    parsed = parse_key(key)
    return parsed is not None and parsed.kind == "exit"
