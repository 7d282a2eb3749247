"""`researcher study --shared-base`: trials as policies of one server; what cannot differ is refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlmodel import Session, select

from researcher import shared_base
from researcher.config import StudyConfig
from researcher.experiment import Arm, Design
from researcher.plan_steps import check_program
from researcher.planning import PlanDefaults
from researcher.runner import create_study, drive, make_context
from store.models import Job, Study, Trial
from store.schema import init_db
from swarm.model.build import build_untrained

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"


def test_knobs_one_server_cannot_vary_are_named() -> None:
    varied = ["lr", "seed", "model", "engine", "timeline_merge", "lora_rank", "group_size", "task", "lease_seconds"]
    assert shared_base.problems(varied) == ["engine", "lease_seconds", "model", "timeline_merge"]
    with pytest.raises(ValueError, match="engine, model cannot differ between trials") as info:
        shared_base.check_design(["engine", "lr", "model"])
    assert "may vary" in str(info.value) and "lr" in str(info.value).rpartition("may vary")[2]


def test_a_full_parameter_arm_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """lora_rank 0 is full fine-tuning: its trial's policy would be refused by the shared server mid-study."""
    arms = [Arm(name="lora_rank=0", knobs={"lora_rank": 0}), Arm(name="lora_rank=8", knobs={"lora_rank": 8})]
    design = Design(task="arith", steps=2, seeds=[0, 1, 2], baseline="lora_rank=0", arms=arms)
    shared = StudyConfig(topic=TOPIC, shared_base=True, study_dir=str(tmp_path))
    with pytest.raises(ValueError, match="lora_rank=0 is full fine-tuning, which cannot share a base"):
        check_program(shared, design)
    check_program(StudyConfig(topic=TOPIC, study_dir=str(tmp_path)), design)  # on servers of their own: fine
    ranks = [Arm(name="lora_rank=4", knobs={"lora_rank": 4}), Arm(name="lora_rank=16", knobs={"lora_rank": 16})]
    check_program(shared, Design(task="arith", steps=2, seeds=[0, 1, 2], baseline="lora_rank=4", arms=ranks))


def test_a_design_varying_the_base_is_refused_before_anything_starts(tmp_path: Path) -> None:
    design = Design(
        task="arith",
        steps=2,
        seeds=[0, 1, 2],
        baseline="merge=on",
        arms=[
            Arm(name="merge=on", knobs={"timeline_merge": True}),
            Arm(name="merge=off", knobs={"timeline_merge": False}),
        ],
    )
    shared = StudyConfig(topic=TOPIC, shared_base=True, study_dir=str(tmp_path))
    with pytest.raises(ValueError, match="timeline_merge cannot differ"):
        check_program(shared, design)
    check_program(shared.model_copy(update={"shared_base": False}), design)  # fine without it


@pytest.mark.integration
@pytest.mark.slow
def test_shared_base_study_runs_every_trial_as_a_policy_of_one_server(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    cfg = StudyConfig(
        topic=TOPIC, shared_base=True, parallel=6, model_dir=str(model), defaults=PlanDefaults(steps=2), poll_s=0.5
    )
    sid = create_study(cfg)
    step = drive(sid, poll_s=0.5)
    assert step.state == "done"
    cfg = make_context(sid).cfg
    with Session(init_db()) as s:
        trials = list(s.exec(select(Trial).where(Trial.study_id == sid)).all())
        jobs = list(s.exec(select(Job)).all())
    assert len(trials) == 6
    assert {t.status for t in trials} == {"COMPLETED"}, [(t.id, t.status, t.config.get("reason")) for t in trials]
    (server_job,) = [j for j in jobs if j.group_key == shared_base.group_key(sid)]
    manager = make_context(sid).launcher.manager
    end = time.monotonic() + 60
    while manager.get(server_job.id).state.value == "RUNNING" and time.monotonic() < end:  # type: ignore[union-attr]
        manager.reconcile([server_job.id])
        time.sleep(0.5)
    assert manager.get(server_job.id).state.value == "CANCELLED"  # type: ignore[union-attr]  # stopped by the study's end
    served = shared_base.server_dir(cfg)
    for t in trials:
        out = Path(cfg.study_dir) / "trials" / f"t{t.id:04d}" / "out"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["attached"]["policy"] == f"t{t.id:04d}" and summary["steps_done"] == 2
        assert summary["config"]["seed"] == t.seed
        assert len((served / "policies" / f"t{t.id:04d}" / "metrics.jsonl").read_text().splitlines()) == 2
    with Session(init_db()) as s:  # the report says what its trials were: it read as full fine-tuning
        report = s.get(Study, sid).report
    assert "--shared-base: each trial a LoRA adapter (a policy) of one server's base model" in report, report[:2000]
