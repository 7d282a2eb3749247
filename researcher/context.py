"""What the graph's nodes need besides their state: store, planner, launcher, budgets.

Rebuilt from the `Study` row by every process that drives the study (the first
one, a resumed one, the daemon), so nothing here has to survive a crash.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from researcher import tracking
from researcher.analysis import trial_metric
from researcher.config import StudyConfig
from researcher.experiment import Frame
from researcher.plots import curves_plot, metric_plot
from researcher.trials import TrialLauncher, interim_rewards, read_summary, step_rewards, trial_dir
from store.models import RunSummary, Study, StudyStatus, Trial, TrialStatus
from store.types import utcnow

log = logging.getLogger(__name__)


@dataclass
class StudyContext:
    study_id: int
    cfg: StudyConfig
    engine: Any
    planner: Any
    launcher: TrialLauncher

    # ------------------------------------------------------------ rows
    def study(self) -> Study:
        with Session(self.engine, expire_on_commit=False) as s:
            row = s.get(Study, self.study_id)
            if row is None:
                raise KeyError(f"no study {self.study_id}")
            return row

    def set_study_status(self, status: StudyStatus, **fields: Any) -> None:
        with Session(self.engine, expire_on_commit=False) as s:
            row = s.get(Study, self.study_id)
            assert row is not None
            row.status = status.value
            for k, v in fields.items():
                setattr(row, k, v)
            s.add(row)
            s.commit()

    def trials(self, ids: list[int] | None = None) -> list[Trial]:
        with Session(self.engine, expire_on_commit=False) as s:
            stmt = select(Trial).where(Trial.study_id == self.study_id).order_by(Trial.id)  # type: ignore[arg-type]
            rows = list(s.exec(stmt).all())
        return rows if ids is None else [t for t in rows if t.id in set(ids)]

    def running_trials(self) -> int:
        return sum(1 for t in self.trials() if t.status == TrialStatus.RUNNING.value)

    # ------------------------------------------------------------ budgets
    def over_budget(self, state: dict, launching: bool) -> str | None:
        """Why no further trial may launch (launching=True), or why running ones must stop."""
        b = self.cfg.budget
        now = utcnow()
        study = self.study()
        if b.deadline is not None:
            deadline = b.deadline if b.deadline.tzinfo else b.deadline.replace(tzinfo=UTC)
            if now >= deadline:
                return f"deadline {deadline.isoformat()} passed"
        if b.wall_clock_s is not None and (now - study.created_at).total_seconds() >= b.wall_clock_s:
            return f"wall-clock budget of {b.wall_clock_s:g} s spent"
        if not launching:
            return None
        trials = self.trials()
        launched = [t for t in trials if "launch" in t.config]  # intent recorded = counted
        if b.max_trials is not None and len(launched) >= b.max_trials:
            return f"trial budget of {b.max_trials} spent"
        if b.llm_tokens is not None and state.get("llm_tokens", 0) >= b.llm_tokens:
            return f"LLM token budget of {b.llm_tokens} spent"
        if b.cpu_hours is not None or b.gpu_hours is not None:
            ids = [t.id for t in trials if t.id is not None]
            used = self.launcher.usage(ids)
            done = [t for t in trials if t.status == TrialStatus.COMPLETED.value and t.started_at and t.finished_at]
            est_h = (
                sum((t.finished_at - t.started_at).total_seconds() for t in done) / len(done) / 3600 if done else 0.0
            )  # type: ignore[operator]
            if b.cpu_hours is not None and used["cpu_hours"] + est_h * self.cfg.trial_cpus > b.cpu_hours:
                return f"CPU budget of {b.cpu_hours:g} h would be exceeded ({used['cpu_hours']:.3f} h used)"
            if (
                b.gpu_hours is not None
                and self.cfg.trial_gpus
                and used["gpu_hours"] + est_h * self.cfg.trial_gpus > b.gpu_hours
            ):
                return f"GPU budget of {b.gpu_hours:g} h would be exceeded ({used['gpu_hours']:.3f} h used)"
        return None

    def trials_left(self) -> int | None:
        """Trials the trial budget still allows (None: no trial budget)."""
        if self.cfg.budget.max_trials is None:
            return None
        launched = sum(1 for t in self.trials() if "launch" in t.config)
        return max(0, self.cfg.budget.max_trials - launched)

    # ------------------------------------------------------------ results
    def summary(self, trial: Trial) -> dict | None:
        return read_summary(trial_dir(self.cfg, trial.id) / "out")  # type: ignore[arg-type]

    def arm_metrics(self, ids: list[int], frame: Frame) -> dict[str, list[float]]:
        return {arm: [v for _, v in pairs] for arm, pairs in self.arm_values(ids, frame).items()}

    def arm_values(self, ids: list[int], frame: Frame) -> dict[str, list[tuple[int, float]]]:
        """Each arm's completed trials as (seed, metric), in trial order: what pairing by seed needs."""
        out: dict[str, list[tuple[int, float]]] = {}
        for t in self.trials(ids):
            if t.status != TrialStatus.COMPLETED.value:
                continue
            summary = self.summary(t)
            if summary is None:
                continue
            value = trial_metric(step_rewards(summary)[1], frame.metric, frame.metric_window)
            if value is not None:
                out.setdefault(t.arm, []).append((int(t.seed), value))  # type: ignore[arg-type]
        return out

    def interim_rewards(self, trial: Trial) -> list[float]:
        """The per-step rewards a trial has reported so far (early stopping reads them while it runs)."""
        return interim_rewards(trial_dir(self.cfg, trial.id) / "out")  # type: ignore[arg-type]

    def ingest(self, ids: list[int]) -> None:
        """Finished trials → MLflow child runs of the study run (+ RunSummary rows). Idempotent."""
        study = self.study()
        if not study.mlflow_run_id:
            return
        for t in self.trials(ids):
            if t.mlflow_run_id or t.status not in (TrialStatus.COMPLETED.value, TrialStatus.FAILED.value):
                continue
            summary = self.summary(t)
            rewards = step_rewards(summary)[1] if summary else []
            metrics = {
                "final_reward": trial_metric(rewards, "final_reward"),
                "reward_gain": trial_metric(rewards, "reward_gain"),
                "mean_reward": trial_metric(rewards, "mean_reward"),
                "wall_s": (summary or {}).get("wall_s"),
            }
            metrics = {k: float(v) for k, v in metrics.items() if v is not None}
            exp = t.config.get("experiment", {})
            params = {"task": exp.get("task"), "steps": exp.get("steps"), **exp.get("knobs", {})}
            status = tracking.run_status(t.status)
            own = None
            run_file = trial_dir(self.cfg, t.id) / "out" / "server" / "mlflow_run.json"  # type: ignore[arg-type]
            if run_file.exists():
                try:
                    own = json.loads(run_file.read_text())["run_id"]
                except (ValueError, KeyError):
                    own = None
            try:
                run_id = tracking.log_trial(
                    study.mlflow_run_id,
                    t.id,
                    t.arm,
                    t.seed,  # type: ignore[arg-type]
                    {**params, "study_id": self.study_id},
                    summary,
                    metrics,
                    status,
                    own_run_id=own,
                )
            except Exception as e:  # tracking must not stop the study; retried next time
                log.warning("trial %s: MLflow logging failed: %s", t.id, e)
                continue
            with Session(self.engine, expire_on_commit=False) as s:
                row = s.get(Trial, t.id)
                assert row is not None
                row.mlflow_run_id = run_id
                s.add(row)
                existing = s.exec(select(RunSummary).where(RunSummary.mlflow_run_id == run_id)).first()
                if existing is None:
                    s.add(RunSummary(mlflow_run_id=run_id, trial_id=t.id, metrics=metrics))
                s.commit()

    def round_plots(self, rnd: int, ids: list[int], result: dict, frame: Frame) -> list[str]:
        out_dir = Path(self.cfg.study_dir) / "report" / "plots"
        paths = []
        try:
            histories: dict[str, list] = {}
            for t in self.trials(ids):
                summary = self.summary(t) if t.status == TrialStatus.COMPLETED.value else None
                if summary:
                    histories.setdefault(t.arm, []).append(step_rewards(summary))
            if histories:
                paths.append(curves_plot(histories, out_dir / f"round{rnd}_reward_curves.png"))
            paths.append(
                metric_plot(result, out_dir / f"round{rnd}_{frame.metric}.png", frame.metric.replace("_", " "))
            )
        except Exception as e:  # a plot must not sink the analysis
            log.warning("round %s: plotting failed: %s", rnd, e)
        return [str(p) for p in paths]
