"""What stopped learners saved on their way out, read from their exit records.

A learner's agent writes its exit record after the command ends, naming the last checkpoint its beat
named (``handlers/heartbeat_keys.py``); unlike the beat, which goes with the lease, the record stays
until the monitor has reported what it says and deletes it. The monitor reports that checkpoint
too, but a role that decides from a learner's end as another producer (the relaunch's
``BeginLaunch``, the pod watcher's exit report) cannot count on the monitor's report being on the
job's partition before its own command. So such a role reads the records and sends the checkpoints
before its command, in the same append; the owner records each that is new and inside the job's
checkpoint place. A record found gone was deleted by the monitor, which deletes one only once the
reports it queued before are on the log.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from ffdl.events.model import Checkpoint
from ffdl.handlers.heartbeat_keys import exit_key, exits_prefix, parse_exit, recorded_checkpoint
from ffdl.handlers.ports import HeartbeatStore, StoreUnavailable

log = structlog.get_logger(__name__)


async def saved_on_the_way_out(
    store: HeartbeatStore, job_id: str, attempt: int, ranks: Iterable[int]
) -> list[Checkpoint] | None:
    """The checkpoints the exit records of ``attempt``'s learners of ``ranks`` name, by rank.

    The records are hostile input (on Kubernetes the job's heartbeat login is in the tenant's pod):
    only the given ranks are read, each record is bounded and checked as the monitor checks it, and
    the rank and attempt are the key's. A store that does not answer gives None (logged): the caller
    goes on with what the monitor reported."""
    wanted = list(ranks)
    # one rank (a pod's end): its own key as the prefix, not the gang's every record for each pod
    prefix = exit_key(job_id, attempt, wanted[0]) if len(wanted) == 1 else exits_prefix(job_id, attempt)
    try:
        values = (await store.snapshot(prefix)).values
    except (StoreUnavailable, TimeoutError) as exc:
        log.warning(
            "exit records unreadable: going on with the checkpoints reported so far",
            job_id=job_id,
            attempt=attempt,
            error=str(exc) or type(exc).__name__,
        )
        return None
    saved: list[Checkpoint] = []
    for rank in wanted:
        value = values.get(exit_key(job_id, attempt, rank))
        if value is None:
            continue
        try:
            named = parse_exit(value).checkpoint
            if named:
                saved.append(recorded_checkpoint(named, rank, attempt))
        except ValueError as exc:
            log.warning("unreadable exit record", job_id=job_id, attempt=attempt, rank=rank, error=str(exc))
    return saved
