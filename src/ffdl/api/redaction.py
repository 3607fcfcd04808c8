"""What a tenant is shown of the scheduler's reasons: other tenants' jobs and names left out.

A wait reason names the jobs a job waits for (higher-priority jobs ahead of it, the holders of the
nodes kept free, the jobs being preempted for it), and a preempted job's reason names the job it
was preempted for and both tenants. The log keeps these names, and an admin sees them; a tenant is
shown "another tenant's job" for a job it may not see and "another tenant" for another tenant's
name, as the cluster map shows another tenant's GPUs as "other". Only the reason fields of a
document (:data:`REASON_KEYS`) are rewritten: a tenant's own manifest is shown as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ffdl.adapters.tenants import Principal

ANOTHER_JOB = "another tenant's job"
ANOTHER_TENANT = "another tenant"
#: The fields whose text may name other jobs or tenants: reasons, wait details, what a job waits for.
REASON_KEYS = frozenset({"reason", "detail", "waiting_for", "summary"})

_ID_CHARS = "A-Za-z0-9._-"
_NAMED_JOB = re.compile(rf"\bjob ([A-Za-z0-9](?:[{_ID_CHARS}]*[A-Za-z0-9])?)")
_NAMED_TENANT = re.compile(r"\btenant ([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\b")


def mentioned_jobs(value: Any) -> set[str]:
    """Every job id the reason fields of ``value`` (a document, an event, a list of them) may name."""
    found: set[str] = set()
    _visit(value, lambda text: found.update(_NAMED_JOB.findall(text)), found.add)
    return found


class Redactor:
    """Rewrites reason fields for ``caller``: of the ``mentioned`` jobs it is shown those ``owners``
    (job id -> tenant) says it may see; of the ``tenants``, its own name."""

    def __init__(
        self,
        caller: Principal,
        mentioned: Collection[str],
        owners: Mapping[str, str],
        tenants: Collection[str],
    ) -> None:
        self._caller = caller
        self._owners = owners
        self._visible = {job for job, tenant in owners.items() if caller.may_see(tenant)}
        #: longest first, so that an id that is part of another is not replaced inside it
        self._hidden = sorted((j for j in mentioned if self._hides_named(j)), key=len, reverse=True)
        self._tenants = {t for t in tenants if t != caller.tenant and not caller.admin}

    def hides(self, job_id: str) -> bool:
        """Whether a listed job id (``waiting_for``) is hidden: any the caller may not see."""
        return not self._caller.admin and job_id not in self._visible

    def _hides_named(self, word: str) -> bool:
        """Whether the word after "job " in a text is hidden: a job the caller may not see, or an
        unknown id that looks like one (a digit, ``-``, ``_`` or ``.`` in it: every id the API
        makes has them), not a plain word ("job has ended already" is the caller's own job)."""
        if self._caller.admin or word in self._visible:
            return False
        return word in self._owners or any(c.isdigit() or c in "-_." for c in word)

    def text(self, text: str) -> str:
        def job(match: re.Match[str]) -> str:
            return ANOTHER_JOB if self._hides_named(match[1]) else match[0]

        def tenant(match: re.Match[str]) -> str:
            return ANOTHER_TENANT if match[1] in self._tenants else match[0]

        text = _NAMED_JOB.sub(job, text)
        for job_id in (j for j in self._hidden if j in text):
            bare = rf"(?<![{_ID_CHARS}]){re.escape(job_id)}(?![A-Za-z0-9_-]|\.[A-Za-z0-9])"
            text = re.sub(bare, ANOTHER_JOB, text)
        return _NAMED_TENANT.sub(tenant, text)

    def value(self, value: Any) -> Any:
        """``value`` with its reason fields rewritten (a copy; ``value`` is left as it is)."""
        if isinstance(value, dict):
            return {k: self._reason(v) if k in REASON_KEYS else self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(item) for item in value]
        return value

    def _reason(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [ANOTHER_JOB if isinstance(v, str) and self.hides(v) else self._reason(v) for v in value]
        return self.value(value)


def _visit(value: Any, on_text: Callable[[str], object], on_listed: Callable[[str], object]) -> None:
    """Call ``on_text`` with each reason text below ``value`` and ``on_listed`` with each listed id."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in REASON_KEYS:
                _visit_reason(item, on_text, on_listed)
            else:
                _visit(item, on_text, on_listed)
    elif isinstance(value, list):
        for item in value:
            _visit(item, on_text, on_listed)


def _visit_reason(value: Any, on_text: Callable[[str], object], on_listed: Callable[[str], object]) -> None:
    if isinstance(value, str):
        on_text(value)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                on_listed(item)
            else:
                _visit_reason(item, on_text, on_listed)
    else:
        _visit(value, on_text, on_listed)
