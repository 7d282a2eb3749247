"""Per-family quotas of a batch (the multi-task cocktail). Pure: no I/O, no clock.

    quotas: {math: 0.4, code: 0.3, shell: 0.3}            # shares of the B groups of a batch
    quota_schedule: [{from_step: 0, quotas: {...}}, {from_step: 50, quotas: {...}}]

A batch of B groups *reserves* group slots per family, so clients of one family
cannot crowd out the others: a claim that would open a new group for a family
whose slots in this window are all taken is refused (429, `quota_exceeded`).
Joining a group that is already open never needs a slot.

Families not named in the quotas share the `other` bucket: its share is the
explicit `other` entry plus whatever the named shares leave below 1. With
shares summing to exactly 1 and no `other` entry, an unnamed family has 0
slots and every claim of it gets 429 (with a reason naming the family); the
quotas can be changed live (`POST /swarm/v1/admin/config`) to let it in.

Rounding (slots always sum to B): the slots of successive windows under the same
quotas are dealt one at a time by Balinski and Young's *quota method*: the next
slot goes to the bucket with the largest q/(a+1) (a: its slots so far) among
those still below their upper quota ceil(q*h) (h: slots dealt including this
one); ties go to the larger share, then the name. That method is house-monotone
and satisfies quota, so after every window each bucket holds floor(q*H) or
ceil(q*H) of the H slots dealt so far: never a whole slot from its share, however
many windows pass (a per-window largest-remainder rule with a carry can drift
past one). math=0.4, code=0.3, shell=0.3 at B=4 gives 2/1/1, 1/2/1, 2/1/1,
1/1/2, ...; a change of B keeps the count, a change of quotas starts it afresh.
A bucket with share 0 never gets a slot. Reserved slots that no client of their family claims keep
the window from filling (that is what reserving means) until the window is
`quota_borrow_s` old (30 s by default): from then on another family may take a
slot that is still free, so a family whose fleet died slows training but cannot
stop it (the server counts `quota_borrowed`; lower that family's quota to stop
waiting at all).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from swarm.config.quotas import OTHER, SHARE_EPS, QuotaPhase, check_quotas, check_schedule
from swarm.server.exceptions import Refused


def shares(quotas: dict[str, float]) -> dict[str, float]:
    """Buckets and their shares, summing to 1: named families plus `other` (the rest)."""
    out = dict(quotas)
    rest = 1.0 - sum(out.values())
    if rest > SHARE_EPS:
        out[OTHER] = out.get(OTHER, 0.0) + rest
    total = sum(out.values())
    return {k: v / total for k, v in out.items()}


def allocate(share: dict[str, float], batch_groups: int, dealt: dict[str, int] | None = None) -> dict[str, int]:
    """Group slots per bucket for one window, after `dealt` slots per bucket in earlier windows
    under the same shares (the quota method; see the module docstring). Sums to `batch_groups`."""
    counts = {k: (dealt or {}).get(k, 0) for k in share}
    slots = {k: 0 for k in share}
    live = sorted((k for k, q in share.items() if q > 0), key=lambda k: (-share[k], k))
    for _ in range(batch_groups):
        h = sum(counts.values()) + 1
        eligible = [k for k in live if counts[k] < math.ceil(share[k] * h - 1e-9)] or live
        pick = max(eligible, key=lambda k: share[k] / (counts[k] + 1))  # first of equals: share, then name
        counts[pick] += 1
        slots[pick] += 1
    return slots


def bucket_of(family: str, quotas: dict[str, float]) -> str:
    return family if family in quotas else OTHER


class QuotaRejected(Refused):
    """A claim over its family's quota; `details` (family, bucket, slots, used) go into the error body."""

    def __init__(self, message: str, details: dict) -> None:
        super().__init__("quota_exceeded", message, details=details)
        self.details: dict = details


class QuotaBook:
    """Which quotas are in force, the slots of the current window, and who uses them.

    The server calls `window_slots(window, step, B)` when it needs the slots (the
    allocation is fixed for a window once computed), `check(...)` before a claim
    that would open a new group, and `opened(group_id, family)` after it.
    """

    def __init__(self, quotas: dict[str, float] | None = None, schedule: list[QuotaPhase] | None = None) -> None:
        self.quotas: dict[str, float] | None = None
        self.schedule: list[QuotaPhase] | None = None
        self.set(quotas, schedule)

    def set(self, quotas: dict[str, float] | None, schedule: list[QuotaPhase] | None) -> None:
        if quotas is not None and schedule is not None:
            raise ValueError("give quotas or quota_schedule, not both")
        self.quotas = check_quotas(quotas) if quotas is not None else None
        self.schedule = check_schedule(schedule) if schedule is not None else None
        self._window: int | None = None
        self._b = 0
        self._slots: dict[str, int] = {}
        self._active: dict[str, float] | None = None
        self._dealt: dict[str, int] = {}  # slots per bucket over the windows under the current quotas
        self._dealt_key: tuple | None = None
        self.families: dict[str, str | None] = {}  # group id -> family (None: unknown)

    @property
    def slots(self) -> dict[str, int]:
        """Group slots per bucket of the window last allocated."""
        return self._slots

    @property
    def enabled(self) -> bool:
        return self.quotas is not None or self.schedule is not None

    def active(self, step: int) -> dict[str, float] | None:
        """The quotas in force for a window that trains as step `step + 1`."""
        if self.schedule is not None:
            current = None
            for phase in self.schedule:
                if phase.from_step <= step:
                    current = phase.quotas
            return current
        return self.quotas

    def window_slots(self, window: int, step: int, batch_groups: int) -> dict[str, int]:
        if self._window == window:
            return self._slots
        self._active = self.active(step)
        self._window = window
        self._b = batch_groups
        self.families = {}
        if self._active is None:
            self._slots = {}
            return self._slots
        key = tuple(sorted(self._active.items()))
        if key != self._dealt_key:
            self._dealt, self._dealt_key = {}, key
        self._slots = allocate(shares(self._active), batch_groups, self._dealt)
        for k, v in self._slots.items():
            self._dealt[k] = self._dealt.get(k, 0) + v
        return self._slots

    def used(self, open_groups: Iterable[str]) -> dict[str, int]:
        """Slots taken per bucket by the groups of this window that still exist."""
        quotas = self._active or {}
        out: dict[str, int] = {}
        for gid in open_groups:
            family = self.families.get(gid)
            if family is not None:
                b = bucket_of(family, quotas)
                out[b] = out.get(b, 0) + 1
        return out

    def check(self, family: str, open_groups: Iterable[str]) -> None:
        """Raise `QuotaRejected` when `family` has no free slot in this window."""
        if self._active is None:
            return
        b = bucket_of(family, self._active)
        slots = self._slots.get(b, 0)
        used = self.used(open_groups).get(b, 0)
        if used < slots:
            return
        share = shares(self._active).get(b, 0.0)
        where = f"family {family!r}" + (f" (bucket {OTHER!r})" if b != family else "")
        if slots == 0:
            why = f"{where} has quota {share:.3g} and so 0 of the {self._b} group slots of a batch" + (
                "; unnamed families share the 'other' bucket" if b == OTHER else ""
            )
        else:
            why = (
                f"{where} has used its {slots} of {self._b} group slots (quota {share:.3g}) "
                "in this batch; claims resume with the next batch"
            )
        raise QuotaRejected(
            why,
            {
                "family": family,
                "bucket": b,
                "quota": round(share, 6),
                "slots": slots,
                "used": used,
                "batch_groups": self._b,
            },
        )

    def opened(self, group_id: str, family: str) -> None:
        if self._active is not None:
            self.families.setdefault(group_id, family)

    def describe(self, open_groups: Iterable[str]) -> dict:
        return {
            "quotas": self.quotas,
            "quota_schedule": [p.model_dump() for p in self.schedule] if self.schedule is not None else None,
            "active": self._active,
            "slots": dict(self._slots),
            "used": self.used(open_groups),
        }
