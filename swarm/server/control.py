"""Live control of a running server: training knobs, sampling, batch size, quotas, pause.

    POST /swarm/v1/admin/config {"lr": 1e-4, "temperature": 0.8}   (admin token)

When a change takes effect, so that every batch stays self-consistent:

* training knobs (`lr`, `kl_coef`, `entropy_coef`, `clip_eps`, `max_grad_norm`,
  `advantage`, `loss_agg`, `ppo_epochs`): from the next optimisation step that starts (a running step
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
The request and response bodies are in `admin_schema.py`.

`pause` refuses new claims (429 `paused` with Retry-After) while running
episodes finish and train normally; `resume` lets claims in again.

Live settings survive a restart: every change (and pause/resume) rewrites
`out_dir/live_config.json` atomically, and a server that resumes from that
`out_dir` re-applies it before it admits anything, so a crash does not silently
revert an operator's learning-rate cut to the command line's value. A fresh
run (`resume=False`) ignores the file.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from swarm.config.server import ServerConfig
from swarm.protocol import ClaimRequest
from swarm.server.admin_schema import TRAIN_KEYS, WINDOW_KEYS, LiveConfigResponse, LiveConfigUpdate
from swarm.server.batcher import Batcher, Group
from swarm.server.checkpoint import write_atomic
from swarm.server.counters import Counters
from swarm.server.episodes import EpisodeRegistry
from swarm.server.events import Topic
from swarm.server.exceptions import Refused
from swarm.server.quotas import QuotaBook, QuotaRejected
from swarm.server.trainer import Trainer

log = logging.getLogger("swarm.server")

HISTORY_KEPT = 1000
LIVE_FILE = "live_config.json"


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, BaseModel):
        return value.model_dump()
    return value


class LiveControl:
    """The settings in force (`config`), what changes them, and the admission rules they imply.

    `config` is the server's `ServerConfig` as changed live so far (`Swarm.config`
    reads it). `admission_changed` is published when claims that were refused may
    now get in (pending settings applied, resumed).
    """

    def __init__(
        self,
        config: ServerConfig,
        trainer: Trainer,
        batcher: Batcher,
        registry: EpisodeRegistry,
        counters: Counters,
        out_dir: Path,
    ) -> None:
        self.config = config
        self.trainer = trainer
        self.batcher = batcher
        self.registry = registry
        self.counters = counters
        self.admission_changed: Topic[[]] = Topic("admission changed")
        self.book = QuotaBook(config.quotas, config.quota_schedule)
        self.paused = False
        self.pending: dict[str, Any] = {}  # window settings that apply when the next window opens
        self._unreported: list[dict[str, Any]] = []
        self._history: list[tuple[int, dict[str, Any]]] = [(0, self.values())]
        self.events_path = out_dir / "events.jsonl"
        self.live_path = out_dir / LIVE_FILE
        self.overrides: dict[str, Any] = {}  # every setting changed live so far (persisted)

    # -- values ---------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        train = self.trainer.config
        cfg = self.config
        return {
            **{k: getattr(train, k) for k in TRAIN_KEYS},
            "temperature": cfg.temperature,
            "default_temperature": cfg.default_temperature,
            "batch_groups": self.batcher.batch_groups,
            "quotas": self.book.quotas,
            "quota_schedule": _plain(self.book.schedule),
        }

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
        out["live/slots"] = dict(self.book.slots)
        out["live/paused"] = self.paused
        if self._unreported:
            out["config_changed"], self._unreported = self._unreported, []
        return out

    def annotate_row(self, step: int, row: dict[str, Any]) -> None:
        """A step's metrics row gets the values that step ran with (and the changes since the last row)."""
        try:
            row.update(self.row_fields(step))
        except Exception:  # never lose a metrics row over its decoration
            log.exception("could not add live config to a metrics row")

    def _window_base_step(self) -> int:
        """The step before the one that trains the open window (quota phases count from it): a window
        opened while a step trains (claims_during_step, max_staleness >= 1) trains after that step."""
        return self.trainer.step + (1 if self.batcher.stepping else 0)

    def _refresh_slots(self) -> None:
        b = self.batcher
        if self.book.enabled and not b.training:
            self.book.window_slots(b.window, self._window_base_step(), b.batch_groups)

    def describe(self, changed: dict[str, Any] | None = None) -> LiveConfigResponse:
        groups = list(self.batcher.groups)
        self._refresh_slots()
        return LiveConfigResponse(
            live=self.values(),
            pending={k: _plain(v) for k, v in self.pending.items()},
            paused=self.paused,
            step=self.trainer.step,
            window=self.batcher.window,
            quotas=self.book.describe(groups),
            changed=changed,
        )

    # -- changes --------------------------------------------------------------
    def update(self, req: LiveConfigUpdate) -> LiveConfigResponse:
        changes = req.changes()
        current = self.values()
        changed = {k: {"old": _plain(current.get(k)), "new": _plain(v)} for k, v in changes.items()}
        for entry in changed.values():  # set to what it was: said so, not reported as a change
            if entry["old"] == entry["new"]:
                entry["unchanged"] = True
        train = {k: v for k, v in changes.items() if k in TRAIN_KEYS}
        window = {k: v for k, v in changes.items() if k in WINDOW_KEYS}
        if train:
            trainer = self.trainer
            trainer.config = trainer.config.model_copy(update=train)
            self.config = self.config.model_copy(update={"train": trainer.config})
            effective = trainer.step + (2 if trainer.running else 1)
            for k in train:
                changed[k]["effective_step"] = effective
            self._remember(effective)
        if window:
            self.pending.update(window)
            if self._window_idle():
                self.apply_pending()
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
            self.apply_pending()  # nothing is admitted yet: window settings apply now
        if paused:
            self.pause()
        log.warning(
            "restored live settings from %s: %s%s",
            self.live_path,
            json.dumps(overrides, default=str),
            " (paused: `swarm ctl resume` lets claims in)" if paused else "",
        )
        self._event("config_restored", overrides=overrides, paused=paused)
        return {"overrides": overrides, "paused": paused}

    def _window_idle(self) -> bool:
        b = self.batcher
        return not b.training and not b.groups and not self.trainer.running

    def apply_pending(self) -> None:
        """Window settings held for the next window take effect (called when a window opens)."""
        if not self.pending:
            return
        changes, self.pending = self.pending, {}
        update: dict[str, Any] = {}
        for k in ("temperature", "default_temperature"):
            if k in changes:
                update[k] = changes[k]
        if "batch_groups" in changes:
            self.batcher.batch_groups = update["batch_groups"] = int(changes["batch_groups"])
        if "quotas" in changes or "quota_schedule" in changes:
            q, s = changes.get("quotas"), changes.get("quota_schedule")
            self.book.set(q, s)
            update["quotas"], update["quota_schedule"] = q, s
        self.config = self.config.model_copy(update=update)
        step = self._window_base_step() + 1  # the step that trains the window opening now
        self._remember(step)
        self._event("config_applied", applied={k: _plain(v) for k, v in changes.items()}, effective_step=step)
        self.admission_changed.publish()

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
            self.admission_changed.publish()

    # -- admission --------------------------------------------------------------
    def before_admit(self, req: ClaimRequest) -> None:
        """Refuse a claim when paused, or when it would open a group over its family's quota."""
        if self.paused:
            raise Refused("paused", "the server is paused by its operator; claims resume after `resume`")
        if not self.book.enabled:
            return
        b = self.batcher
        if b.training:
            return  # the batcher refuses it anyway
        if any(g.task_id == req.task_id and g.free > 0 for g in b.groups.values()):
            return  # joining an open group takes no new slot
        self.book.window_slots(b.window, self._window_base_step(), b.batch_groups)
        self._learn_families()
        try:
            self.book.check(req.task_family, b.groups.keys())
        except QuotaRejected as exc:
            borrow_s = self.config.quota_borrow_s
            if borrow_s is not None and len(b.groups) < b.batch_groups:
                age = self.trainer.window_age_s
                if age >= borrow_s:  # a slot its own family left idle this long: lend it
                    self.counters.add("quota_borrowed")
                    log.info("window %d is %.0fs old: %s borrows an idle slot", b.window, age, req.task_family)
                    return
                exc.message += (
                    f"; or, if that slot is still unclaimed when this window is {borrow_s:g}s old "
                    f"(now {age:.0f}s), it may borrow one"
                )
                exc.details["borrow_in_s"] = round(borrow_s - age, 3)
            raise

    def _learn_families(self) -> None:
        """Families of groups not opened through a claim here (restored after a restart)."""
        missing = {gid for gid in self.batcher.groups if gid not in self.book.families}
        if not missing:
            return
        reg = self.registry
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
            out["quotas"] = self.book.describe(list(self.batcher.groups))
        return out

    # -- events ---------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> None:
        record = {
            "event": kind,
            "time": time.time(),
            "step": self.trainer.step,
            "window": self.batcher.window,
            **fields,
        }
        if kind.startswith("config_"):
            self._unreported.append(record)
        log.info("%s: %s", kind, json.dumps(fields, default=str)[:500])
        try:
            self.events_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.events_path, "a") as f:
                f.write(json.dumps(record, default=str) + "\n")
        except OSError:
            log.exception("could not append to %s", self.events_path)
