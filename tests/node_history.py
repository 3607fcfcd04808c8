"""A log of a job and a node together, decided by the real deciders, for the SRE tools' tests.

The node lives through everything the inventory can do to it: it joins, grows, is drained by an
operator and uncordoned, is cordoned by its inventory (so an operator's uncordon is rejected), is
lost and comes back. A job runs and completes on it meanwhile. One :class:`tests.golden.record.Owner`
decides both, a :class:`~tests.golden.record.JobScript` and a :class:`~tests.golden.record.NodeScript`
on its one virtual clock, so its events are already in time order; :func:`positioned` gives them the
positions their keys' partitions would give them, as an export writes them. Everything runs in one
thread, with nothing shared between calls.
"""

from __future__ import annotations

from pathlib import Path

from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import write_log
from tests.golden.record import (
    EVENTS_TOPIC,
    SCHEDULER,
    START,
    JobScript,
    NodeScript,
    Owner,
    positioned,
    spec,
)

__all__ = ["JOB", "LARGE", "NODE", "SMALL", "node_and_job_events", "positioned", "write_node_history"]

NODE = "gpu-node-01"
JOB = "mnist-0n0d"
SMALL = nd.NodeSpec(gpus=4, gpu_type="a100", cpus=64, memory_mb=262_144)
LARGE = nd.NodeSpec(gpus=8, gpu_type="a100", cpus=64, memory_mb=262_144)
#: The scheduler leader's fencing token throughout the story.
_TOKEN = 1


def node_and_job_events() -> list[AnyEvent]:
    """The whole story in the order the owner appended it, which is time order."""
    owner = Owner("node-history", START)
    owner.leader_token = _TOKEN
    node = NodeScript(owner, NODE, SMALL, source="configuration")
    node.observe(token=_TOKEN)
    job = JobScript(owner, JOB, "acme", spec("mnist"), nodes=(NODE,))
    job.queue_and_run(token=_TOKEN)
    job.train(40)
    node.spec = LARGE
    node.observe(token=_TOKEN)  # NodeResized
    job.complete()
    node.cordon("disk failing", drain=True)
    node.uncordon("disk replaced")
    node.observe(token=_TOKEN, cordoned=True)  # the inventory's own cordon
    node.uncordon("try anyway")  # rejected: lift it at the source
    # Sent as is, not through NodeScript.report_lost: the SRE tools' tests pin the reason unwrapped.
    node.send(nd.ReportNodeLost(reason="kubelet stopped posting status"), SCHEDULER, _TOKEN, after_s=60.0)
    node.observe(token=_TOKEN)  # back: NodeJoined, and the inventory's cordon is lifted
    return owner.events


def write_node_history(path: Path) -> list[LoggedEvent]:
    """Write the story to ``path`` as an exported log, in the order an export of a bus holding it
    writes (by time, then partition and offset); returns its events as written."""
    logged = sorted(
        positioned(node_and_job_events()), key=lambda e: (e.event.occurred_at, e.partition, e.offset)
    )
    with path.open("w", encoding="utf-8") as out:
        write_log(logged, out, EVENTS_TOPIC)
    return logged
