"""Live control of a running server: training knobs, sampling, batch size, quotas, pause.

    POST /swarm/v1/admin/config {"lr": 1e-4, "temperature": 0.8}   (admin token)

When a change takes effect, so that every batch stays self-consistent:

* training knobs (`lr`, `kl_coef`, `entropy_coef`, `clip_eps`, `max_grad_norm`,
  `advantage`): from the next optimisation step that starts (a running step
  keeps the config it started with);
* window knobs (`temperature`, `default_temperature`, `batch_groups`, `quotas`,
  `quota_schedule`): from the next on-policy window, i.e. the next batch. They
  are held as *pending* until the current window is trained, or applied at once
  when the current window is empty (nothing claimed, nothing training), so one
  batch never mixes two temperatures or two quota splits.

Every metrics.jsonl row carries the values its step ran with (`live/lr`,
`live/temperature`, ..., `live/slots`) and, on the first row after a change, a
`config_changed` list of the change events; each event is also appended to
`out_dir/events.jsonl` (with pause/resume), so the metrics rows stay uniform.

`pause` refuses new claims (429 `paused` with Retry-After) while running
episodes finish and train normally; `resume` lets claims in again.

Live settings survive a restart: every change (and pause/resume) rewrites
`out_dir/live_config.json` atomically, and a server that resumes from that
`out_dir` re-applies it before it admits anything, so a crash does not silently
revert an operator's learning-rate cut to the command line's value. A fresh
run (`resume=False`) ignores the file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm.server.batcher import Group, Rejected
from swarm.server.checkpoint import write_atomic
from swarm.server.quotas import QuotaBook, QuotaPhase, QuotaRejected, check_quotas, check_schedule

if TYPE_CHECKING:
    from swarm.protocol import ClaimRequest
    from swarm.server.state import Swarm

log = logging.getLogger("swarm.server")

TRAIN_KEYS = ("lr", "kl_coef", "entropy_coef", "clip_eps", "max_grad_norm", "advantage", "loss_agg")
WINDOW_KEYS = ("temperature", "default_temperature", "batch_groups", "quotas", "quota_schedule")
NULLABLE = {"temperature", "quotas", "quota_schedule"}
HISTORY_KEPT = 1000
LIVE_FILE = "live_config.json"


class LiveConfigUpdate(BaseModel):
    """A partial update: only the fields present change. Unknown fields are refused (typos)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lr: float | None = Field(None, gt=0.0, le=1.0, description="learning rate (next step)")
    kl_coef: float | None = Field(None, ge=0.0, le=100.0, description="KL coefficient (next step)")
    entropy_coef: float | None = Field(None, ge=-10.0, le=10.0, description="entropy bonus (next step)")
    clip_eps: float | None = Field(None, gt=0.0, le=10.0, description="PPO clip epsilon (next step)")
    max_grad_norm: float | None = Field(None, gt=0.0, le=1e6, description="gradient clip (next step)")
    advantage: Literal["grpo", "rloo", "reinforce_pp"] | None = Field(None, description="next step")
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] | None = Field(None, description="next step")
    temperature: float | None = Field(None, ge=0.0, le=2.0,
                                      description="force this temperature on every call; null: stop forcing")
    default_temperature: float | None = Field(None, ge=0.0, le=2.0,
                                              description="temperature of calls that name none")
    batch_groups: int | None = Field(None, ge=1, le=100_000, description="B: groups per step")
    quotas: dict[str, float] | None = Field(None, description="family -> share; null: no quotas")
    quota_schedule: list[QuotaPhase] | None = Field(None, description="quotas over steps; null: none")

    @model_validator(mode="after")
    def _check(self) -> LiveConfigUpdate:
        given = self.model_fields_set
        if not given:
            raise ValueError("name at least one setting to change")
        for key in given - NULLABLE:
            if getattr(self, key) is None:
                raise ValueError(f"{key} cannot be null")
        if self.quotas is not None:
            check_quotas(self.quotas)
        if self.quota_schedule is not None:
            check_schedule(self.quota_schedule)
        if self.quotas is not None and self.quota_schedule is not None:
            raise ValueError("give quotas or quota_schedule, not both")
        return self

    def changes(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.model_fields_set}
        if "quotas" in out or "quota_schedule" in out:  # one replaces the other
            out.setdefault("quotas", None)
            out.setdefault("quota_schedule", None)
        return out


class LiveConfigResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    live: dict[str, Any] = Field(description="values in force now")
    pending: dict[str, Any] = Field(description="window settings that apply when the next window opens")
    paused: bool
    step: int
    window: int
    quotas: dict[str, Any] = Field(description="quotas, active split, slots and used slots of this window")
    changed: dict[str, Any] | None = Field(None, description="(POST) what this request changed: old, new")


class _Refused(Rejected):
    """A quota refusal in the batcher's shape, carrying the details for the 429 body."""

    def __init__(self, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(code, message)
        self.details = details


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, BaseModel):
        return value.model_dump()
    return value


class _LiveMetrics:
    """Wraps the trainer's metrics sink: each row gets the live values of its step."""

    def __init__(self, inner: Any, control: LiveControl) -> None:
        self.inner = inner
        self.control = control
        self.path = getattr(inner, "path", None)

    def __getattr__(self, name: str) -> Any:  # anything else the sink offers (flush, close, ...)
        return getattr(self.inner, name)

    def write(self, record: dict) -> None:
        try:
            record.update(self.control.row_fields(int(record.get("step", 0))))
        except Exception:  # never lose a metrics row over its decoration
            log.exception("could not add live config to a metrics row")
        self.inner.write(record)


class LiveControl:
    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.book = QuotaBook(swarm.config.quotas, swarm.config.quota_schedule)
        self.paused = False
        self.pending: dict[str, Any] = {}
        self._unreported: list[dict[str, Any]] = []
        self._history: list[tuple[int, dict[str, Any]]] = [(0, self.values())]
        self.events_path = swarm.out_dir / "events.jsonl"
        self.live_path = swarm.out_dir / LIVE_FILE
        self.overrides: dict[str, Any] = {}  # every setting changed live so far (persisted)
        # pending window settings apply when the trainer opens the next window
        self._after_reopen = swarm.trainer.on_reopen
        swarm.trainer.on_reopen = self._on_reopen
        swarm.trainer.metrics = _LiveMetrics(swarm.trainer.metrics, self)

    # -- values ---------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        train = self.swarm.trainer.config
        cfg = self.swarm.config
        return {**{k: getattr(train, k) for k in TRAIN_KEYS},
                "temperature": cfg.temperature, "default_temperature": cfg.default_temperature,
                "batch_groups": self.swarm.batcher.batch_groups,
                "quotas": self.book.quotas, "quota_schedule": _plain(self.book.schedule)}

    def values_for(self, step: int) -> dict[str, Any]:
        chosen = self._history[0][1]
        for from_step, vals in self._history:
            if from_step <= step:
                chosen = vals
        return chosen

    def _remember(self, from_step: int) -> None:
        self._history.append((from_step, self.values()))
        del self._history[:-HISTORY_KEPT]

    def row_fields(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {f"live/{k}": v for k, v in self.values_for(step).items()}
        out["live/slots"] = dict(self.book._slots)
        out["live/paused"] = self.paused
        if self._unreported:
            out["config_changed"], self._unreported = self._unreported, []
        return out

    def _refresh_slots(self) -> None:
        b = self.swarm.batcher
        if self.book.enabled and not b.training:
            self.book.window_slots(b.window, self.swarm.trainer.step, b.batch_groups)

    def describe(self, changed: dict[str, Any] | None = None) -> LiveConfigResponse:
        groups = list(self.swarm.batcher.groups)
        self._refresh_slots()
        return LiveConfigResponse(
            live=self.values(), pending={k: _plain(v) for k, v in self.pending.items()},
            paused=self.paused, step=self.swarm.trainer.step, window=self.swarm.batcher.window,
            quotas=self.book.describe(groups), changed=changed)

    # -- changes --------------------------------------------------------------
    def update(self, req: LiveConfigUpdate) -> LiveConfigResponse:
        changes = req.changes()
        current = self.values()
        changed = {k: {"old": _plain(current.get(k)), "new": _plain(v)} for k, v in changes.items()}
        train = {k: v for k, v in changes.items() if k in TRAIN_KEYS}
        window = {k: v for k, v in changes.items() if k in WINDOW_KEYS}
        if train:
            trainer = self.swarm.trainer
            trainer.config = dataclasses.replace(trainer.config, **train)
            self.swarm.config = self.swarm.config.model_copy(update={"train": trainer.config})
            effective = trainer.step + (2 if trainer.running else 1)
            for k in train:
                changed[k]["effective_step"] = effective
            self._remember(effective)
        if window:
            self.pending.update(window)
            if self._window_idle():
                self._apply_pending()
                for k in window:
                    changed[k]["effective"] = "now"
            else:
                for k in window:
                    changed[k]["effective"] = "next window"
        self.overrides.update({k: _plain(v) for k, v in changes.items()})
        self._save()
        self._event("config_changed", changes=changed)
        return self.describe(changed)

    # -- persistence ------------------------------------------------------------
    def _save(self) -> None:
        """Rewrite live_config.json atomically (a crash leaves the old or the new one)."""
        record = {"overrides": self.overrides, "paused": self.paused, "saved_at": time.time()}
        try:
            self.live_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.live_path, json.dumps(record, indent=2, sort_keys=True, default=str))
        except OSError:
            log.exception("could not save live settings to %s", self.live_path)

    def restore(self) -> dict[str, Any] | None:
        """Re-apply the live settings a previous run of this out_dir left (call before admitting).

        A file that cannot be read or no longer validates is reported and set
        aside (renamed `.invalid`), never half-applied: the server starts with
        its configured values instead.
        """
        if not self.live_path.is_file():
            return None
        try:
            record = json.loads(self.live_path.read_text())
            overrides = dict(record.get("overrides") or {})
            paused = bool(record.get("paused", False))
            update = LiveConfigUpdate(**overrides) if overrides else None
        except (OSError, ValueError, TypeError) as exc:
            bad = self.live_path.with_name(self.live_path.name + ".invalid")
            log.error("ignoring live settings in %s (%s); moved to %s", self.live_path, exc, bad)
            self.live_path.replace(bad)
            return None
        if update is not None:
            self.update(update)
            self._apply_pending()  # nothing is admitted yet: window settings apply now
        if paused:
            self.pause()
        log.warning("restored live settings from %s: %s%s", self.live_path, json.dumps(overrides, default=str),
                    " (paused: `swarm ctl resume` lets claims in)" if paused else "")
        self._event("config_restored", overrides=overrides, paused=paused)
        return {"overrides": overrides, "paused": paused}

    def _window_idle(self) -> bool:
        b = self.swarm.batcher
        return not b.training and not b.groups and not self.swarm.trainer.running

    def _apply_pending(self) -> None:
        if not self.pending:
            return
        changes, self.pending = self.pending, {}
        update: dict[str, Any] = {}
        for k in ("temperature", "default_temperature"):
            if k in changes:
                update[k] = changes[k]
        if "batch_groups" in changes:
            self.swarm.batcher.batch_groups = update["batch_groups"] = int(changes["batch_groups"])
        if "quotas" in changes or "quota_schedule" in changes:
            q, s = changes.get("quotas"), changes.get("quota_schedule")
            self.book.set(q, s)
            update["quotas"], update["quota_schedule"] = q, s
        self.swarm.config = self.swarm.config.model_copy(update=update)
        self._remember(self.swarm.trainer.step + 1)
        self._event("config_applied", applied={k: _plain(v) for k, v in changes.items()},
                    effective_step=self.swarm.trainer.step + 1)
        self.swarm.wake_claims()

    def _on_reopen(self) -> None:
        try:
            self._apply_pending()
        except Exception:
            log.exception("could not apply pending live settings")
        if self._after_reopen is not None:
            self._after_reopen()

    # -- pause ----------------------------------------------------------------
    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self._save()
            self._event("paused")

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._save()
            self._event("resumed")
            self.swarm.wake_claims()

    # -- admission --------------------------------------------------------------
    def before_admit(self, req: ClaimRequest) -> None:
        """Refuse a claim when paused, or when it would open a group over its family's quota."""
        if self.paused:
            raise Rejected("paused", "the server is paused by its operator; claims resume after `resume`")
        if not self.book.enabled:
            return
        b = self.swarm.batcher
        if b.training:
            return  # the batcher refuses it anyway
        if any(g.task_id == req.task_id and g.free > 0 for g in b.groups.values()):
            return  # joining an open group takes no new slot
        self.book.window_slots(b.window, self.swarm.trainer.step, b.batch_groups)
        self._learn_families()
        try:
            self.book.check(req.task_family, b.groups.keys())
        except QuotaRejected as exc:
            borrow_s = self.swarm.config.quota_borrow_s
            if borrow_s is not None and len(b.groups) < b.batch_groups:
                age = self.swarm.trainer.window_age_s
                if age >= borrow_s:  # a slot its own family left idle this long: lend it
                    self.swarm.counters["quota_borrowed"] += 1
                    log.info("window %d is %.0fs old: %s borrows an idle slot", b.window, age, req.task_family)
                    return
                exc.message += (f"; or, if that slot is still unclaimed when this window is {borrow_s:g}s old "
                                f"(now {age:.0f}s), it may borrow one")
                exc.details["borrow_in_s"] = round(borrow_s - age, 3)
            raise _Refused(exc.code, exc.message, exc.details) from None

    def _learn_families(self) -> None:
        """Families of groups not opened through a claim here (restored after a restart)."""
        missing = {gid for gid in self.swarm.batcher.groups if gid not in self.book.families}
        if not missing:
            return
        reg = self.swarm.registry
        for ep in [*reg.open.values(), *reversed(reg.closed.values())]:
            if ep.group_id in missing:
                self.book.opened(ep.group_id, ep.task_family)
                missing.discard(ep.group_id)
                if not missing:
                    return
        for gid in missing:  # not found: counted as no family's slot, and not searched again
            self.book.families[gid] = None

    def admitted(self, req: ClaimRequest, group: Group) -> None:
        self.book.opened(group.group_id, req.task_family)

    def status_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"paused": self.paused}
        if self.book.enabled:
            self._refresh_slots()
            out["quotas"] = self.book.describe(list(self.swarm.batcher.groups))
        return out

    # -- events ---------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> None:
        record = {"event": kind, "time": time.time(), "step": self.swarm.trainer.step,
                  "window": self.swarm.batcher.window, **fields}
        if kind.startswith("config_"):
            self._unreported.append(record)
        log.info("%s: %s", kind, json.dumps(fields, default=str)[:500])
        try:
            self.events_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.events_path, "a") as f:
                f.write(json.dumps(record, default=str) + "\n")
        except OSError:
            log.exception("could not append to %s", self.events_path)
