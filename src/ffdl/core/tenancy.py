"""Tenants' GPU quotas and their fair share of the cluster (architecture §7).

Each tenant has a *guaranteed* number of GPUs, a *borrowing limit* (how many GPUs beyond its
guarantee it may use while others leave theirs idle; ``None``: no limit) and a *weight*. A tenant
never holds more than guaranteed + borrowing limit. While it holds less than its guarantee it may
reclaim GPUs that borrowing tenants hold, by preemption (see :mod:`ffdl.core.scheduling`).

Fair share is *weighted fair share over GPU-equivalents*: among jobs of one priority, the next job
comes from the tenant holding the least per unit of weight, tenants still inside their guarantee
first. Quotas, fair share and reclaiming all count a job as its GPUs, or, where more, as what its
CPUs or memory are worth in GPUs: their share of the cluster's CPUs or memory times its GPUs
(dominant-resource fairness with the GPU as the unit; :class:`ffdl.core.cluster.Charges`).
A job that asks no more CPU and memory per GPU than the cluster has counts exactly its GPUs. We
first counted GPUs alone, on the grounds that no job asks for much CPU or memory without GPUs; a
tenant that means harm does: its jobs without GPUs held nothing by that count, so no quota bound
them, fair share put them first every time, no guarantee could be reclaimed from them, and they
could fill every node's CPUs or memory so that no gang fit anywhere.

The :class:`TenantLedger` reads the live usage of the cluster state it is given, so what a plan
holds or frees counts at once for the next job of the same cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ffdl.core.cluster import MILLI_GPUS

#: The highest priority a tenant's jobs may have unless an admin sets its own ceiling
#: (``ffdl tenants set NAME --max-priority N``): the ordinary classes (0 to 100) are every tenant's,
#: the classes above (up to 1000, which preempt the rest) an admin hands out. Admins have no ceiling.
DEFAULT_MAX_PRIORITY = 100

#: A tenant's priority ceiling by its name (None: no ceiling, an admin's), as the tenants file says.
PriorityCeilings = Callable[[str], int | None]


def priority_problem(tenant: str, priority: int, ceiling: int | None) -> str:
    """Why ``tenant`` may not submit a job of ``priority`` under ``ceiling`` (empty when it may): a
    higher class would preempt other tenants' jobs, which only an admin may allow."""
    if ceiling is None or priority <= ceiling:
        return ""
    return (
        f"priority {priority} is above the ceiling of tenant {tenant!r} ({ceiling}): "
        "an admin may raise it (ffdl tenants set --max-priority)"
    )


@dataclass(frozen=True, slots=True)
class TenantQuota:
    guaranteed_gpus: int = 0
    borrowing_limit_gpus: int | None = None
    weight: float = 1.0

    @property
    def limit(self) -> int | None:
        """The most GPUs the tenant may hold at once (``None``: as many as are free)."""
        if self.borrowing_limit_gpus is None:
            return None
        return self.guaranteed_gpus + self.borrowing_limit_gpus

    def describe(self) -> str:
        borrowing = "any idle" if self.borrowing_limit_gpus is None else str(self.borrowing_limit_gpus)
        return f"{self.guaranteed_gpus} guaranteed + {borrowing} borrowed"


@dataclass(frozen=True, slots=True)
class TenancyPolicy:
    """Every tenant's quota; tenants not named get ``default`` (unlimited, weight 1, by default)."""

    quotas: Mapping[str, TenantQuota] = field(default_factory=dict)
    default: TenantQuota = TenantQuota()

    def quota(self, tenant: str) -> TenantQuota:
        return self.quotas.get(tenant, self.default)


class _Terms(dict[str, tuple[int, int | None, float]]):
    """Tenant -> (guarantee, limit, weight), the first two in thousandths of a GPU, worked out on
    first asking: a planning step asks millions of times, and the policy never changes under a
    ledger (a dict that fills itself: a lookup of a known tenant calls no Python function)."""

    def __init__(self, policy: TenancyPolicy) -> None:
        super().__init__()
        self._policy = policy

    def __missing__(self, tenant: str) -> tuple[int, int | None, float]:
        quota = self._policy.quota(tenant)
        limit = None if quota.limit is None else quota.limit * MILLI_GPUS
        terms = self[tenant] = (quota.guaranteed_gpus * MILLI_GPUS, limit, quota.weight)
        return terms


class TenantLedger:
    """Quotas applied to live counts, which it reads and never changes: what each tenant holds
    (``usage``), how much of that is being freed by preemption (``releasing``), and how much its
    preempting jobs will take once their victims are gone (``claimed``). The counts are in
    thousandths of a GPU-equivalent (:class:`ffdl.core.cluster.Charges`), and so is
    every amount asked of the ledger; the quotas, in GPUs, are scaled to them. (Dicts, not
    mappings: compiled, a dict is read in place, a mapping through a method call, for every job a
    step weighs.)"""

    def __init__(
        self,
        policy: TenancyPolicy,
        usage: dict[str, int],
        releasing: dict[str, int],
        claimed: dict[str, int],
    ) -> None:
        self._policy = policy
        self._usage = usage
        self._releasing = releasing
        self._claimed = claimed
        self._terms = _Terms(policy)
        #: whether any tenant has a guarantee: until one has, no job is protected by one
        self.any_guarantee = policy.default.guaranteed_gpus > 0 or any(
            quota.guaranteed_gpus > 0 for quota in policy.quotas.values()
        )
        #: whether no tenant has a guarantee or a limit: then where a tenant stands never bounds
        #: what its next job may take, nor whose jobs it may preempt
        self._unlimited = all(quota.limit is None for quota in (policy.default, *policy.quotas.values()))
        self.flat = not self.any_guarantee and self._unlimited

    def quota(self, tenant: str) -> TenantQuota:
        return self._policy.quota(tenant)

    def _kept(self, tenant: str) -> int:
        """What the tenant will hold once the preemptions under way are done."""
        return self._usage.get(tenant, 0) - self._releasing.get(tenant, 0) + self._claimed.get(tenant, 0)

    def within_limit(self, tenant: str, charge: int) -> bool:
        """Whether the tenant may take ``charge`` more: never beyond guaranteed + borrowing limit, at
        any instant (GPUs being freed still count until they are)."""
        if self._unlimited:
            return True
        limit = self._terms[tenant][1]
        return limit is None or self._usage.get(tenant, 0) + self._claimed.get(tenant, 0) + charge <= limit

    def within_guarantee(self, tenant: str, charge: int) -> bool:
        """Whether ``charge`` more keeps the tenant inside its guarantee."""
        return self._kept(tenant) + charge <= self._terms[tenant][0]

    def guaranteed(self, tenant: str) -> bool:
        """Whether the tenant has a guarantee (its jobs inside it are safe from other tenants)."""
        return self._terms[tenant][0] > 0

    def borrowed(self, tenant: str) -> int:
        """What the tenant holds (or will) beyond its guarantee."""
        return max(0, self._kept(tenant) - self._terms[tenant][0])

    def tenants(self) -> list[str]:
        """Every tenant that holds anything now."""
        return sorted(tenant for tenant, held in self._usage.items() if held > 0)

    def order_key(self, tenant: str) -> tuple[bool, float, str]:
        """Who goes next among tenants of one priority: inside the guarantee first, then least per weight."""
        guaranteed, _, weight = self._terms[tenant]
        kept = self._kept(tenant)
        return (kept >= guaranteed, kept / weight, tenant)
