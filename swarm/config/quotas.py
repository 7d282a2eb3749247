"""The quota vocabulary of the server's config: `{family: share}` and quota phases, validated.

`ServerConfig.quotas`, `ServerConfig.quota_schedule` and the admin API's live
settings share these checks; the enforcement (slots per window, the quota
method, borrowing) is the server's, in swarm/server/quotas.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the bucket of every family the quotas do not name
OTHER = "other"
SHARE_EPS = 1e-6  # shares within this of a bound count as on it


def check_quotas(quotas: dict[str, float]) -> dict[str, float]:
    """Validate a {family: share} mapping (shares in [0, 1], sum <= 1, some share > 0)."""
    if not quotas:
        raise ValueError("quotas must name at least one family")
    if len(quotas) > 256:
        raise ValueError("at most 256 families in quotas")
    out: dict[str, float] = {}
    for family, share in quotas.items():
        if not isinstance(family, str) or not 1 <= len(family) <= 128:
            raise ValueError(f"family names are 1..128 characters, got {family!r}")
        share = float(share)
        if not (0.0 <= share <= 1.0) or math.isnan(share):
            raise ValueError(f"quota of {family!r} must be in [0, 1], got {share}")
        out[family] = share
    total = sum(out.values())
    if total > 1.0 + SHARE_EPS:
        raise ValueError(f"quotas sum to {total:.4g} > 1")
    if total <= 0.0:
        raise ValueError("at least one quota must be > 0")
    return out


class QuotaPhase(BaseModel):
    """One entry of a quota schedule: these quotas from this optimisation step on."""

    model_config = ConfigDict(extra="forbid")

    from_step: int = Field(0, ge=0, description="first step (as counted by the server) these quotas apply to")
    quotas: dict[str, float] = Field(description="family -> share of the B groups of a batch")

    @field_validator("quotas")
    @classmethod
    def _valid(cls, value: dict[str, float]) -> dict[str, float]:
        return check_quotas(value)


def check_schedule(phases: Iterable[QuotaPhase]) -> list[QuotaPhase]:
    """Sorted by `from_step`; no two phases may start at the same step."""
    out = sorted(phases, key=lambda p: p.from_step)
    if not out:
        raise ValueError("quota_schedule must have at least one phase")
    if len(out) > 1000:
        raise ValueError("at most 1000 phases in quota_schedule")
    for a, b in zip(out, out[1:]):
        if a.from_step == b.from_step:
            raise ValueError(f"two quota phases start at step {a.from_step}")
    return out


__all__ = ["OTHER", "SHARE_EPS", "QuotaPhase", "check_quotas", "check_schedule"]
