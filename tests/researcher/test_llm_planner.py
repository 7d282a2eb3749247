"""The `llm` planner against a scripted chat model: never the network."""

from __future__ import annotations

import json

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from sqlmodel import Session, select

from researcher.config import Budget, StudyConfig
from researcher.experiment import Frame
from researcher.llm import (ModelRequestsForbidden, OpenAIChatModel, ScriptedChatModel, StructuredOutputError,
                            override_model, structured)
from researcher.llm_planner import LLMPlanner
from researcher.planning import PlanDefaults
from researcher.runner import create_study, drive, make_context, store_engine
from store.models import Hypothesis, Study, Trial

FRAME = {"question": "Does lr matter on arith?", "task": "arith", "metric": "final_reward",
         "metric_window": 5, "knobs": ["lr"], "baseline": {}}
HYP = {"statement": "lr 3e-4 beats lr 0", "rationale": "lr 0 cannot learn", "knob": "lr",
       "baseline_value": 0.0, "treatment_values": [3e-4], "direction": "greater"}
DESIGN = {"task": "arith", "steps": 99, "seeds": [0, 1, 2], "baseline": "zero",
          "arms": [{"name": "zero", "knobs": {"lr": 0.0}}, {"name": "high", "knobs": {"lr": 3e-4}}]}
BAD_DESIGN = {**DESIGN, "seeds": [0, 1]}


def scripted_replies() -> ScriptedChatModel:
    """Replies by step (read from the prompt); the first design is invalid (2 seeds)."""
    designs = [json.dumps(BAD_DESIGN), "```json\n" + json.dumps(DESIGN) + "\n```"]
    decisions = [json.dumps({"stop": False, "notes": "Is a smaller rate enough?",
                             "follow_ups": [{**HYP, "statement": "lr 1e-4 beats lr 0",
                                             "treatment_values": [1e-4]}]}),
                 json.dumps({"stop": True, "follow_ups": [], "notes": "lr 0 does not learn."})]

    def reply(messages):
        prompt = str(messages[1].content)
        if "Frame it as a study" in prompt:
            return json.dumps(FRAME)
        if "most informative next hypothesis" in prompt:
            return "Here you go: " + json.dumps(HYP)
        if "Design the experiment" in prompt:
            if designs:
                return designs.pop(0)
            return json.dumps({**DESIGN, "arms": [{"name": "zero", "knobs": {"lr": 0.0}},
                                                  {"name": "low", "knobs": {"lr": 1e-4}}]})
        if "Decide whether the study should go on" in prompt:
            return decisions.pop(0)
        raise AssertionError(f"unexpected prompt: {prompt[:200]}")

    return ScriptedChatModel(script=reply)


def test_real_model_requests_are_forbidden_in_tests():
    model = OpenAIChatModel(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ModelRequestsForbidden):
        model.invoke([HumanMessage(content="hi")])


def test_structured_retries_with_the_validation_error():
    model = GenericFakeChatModel(messages=iter([AIMessage(content="not json"),
                                                AIMessage(content=json.dumps(FRAME))]))
    got = structured(model, [HumanMessage(content="frame")], Frame)
    assert got.knobs == ["lr"]
    bad = ScriptedChatModel(script=['{"question": "x"}'] * 3)
    with pytest.raises(StructuredOutputError, match="after 3 attempts"):
        structured(bad, [HumanMessage(content="frame")], Frame)
    assert "That output was invalid" in str(bad.calls[1][-1].content)


def test_design_retry_sees_the_error_and_user_steps_win():
    model = scripted_replies()
    p = LLMPlanner(model)
    f = p.frame("topic", PlanDefaults())
    h = p.hypothesize("topic", f, [])
    d = p.design(f, h, PlanDefaults(steps=7))
    assert d.steps == 7 and d.baseline == "zero" and len(d.trial_configs()) == 6
    retry = str(model.calls[-1][-1].content)
    assert "not valid" in retry and "at least 3" in retry
    assert p.tokens_used > 0


def test_token_budget_is_checked_before_each_call():
    p = LLMPlanner(scripted_replies(), token_budget=1)
    p.frame("topic", PlanDefaults())
    from researcher.llm import BudgetExceeded

    with pytest.raises(BudgetExceeded):
        p.hypothesize("topic", Frame.model_validate(FRAME), [])


def test_llm_study_end_to_end(fake_program):
    model = scripted_replies()
    cfg = StudyConfig(topic="Does lr matter?", planner="llm", trial_program=fake_program,
                      defaults=PlanDefaults(steps=10), poll_s=0.2, llm_base_url="http://127.0.0.1:9/v1",
                      llm_model="fake", budget=Budget(llm_tokens=100_000))
    with override_model(model):
        sid = create_study(cfg)
        step = drive(sid, poll_s=0.2)
    assert step.state == "done"
    with Session(store_engine()) as s:
        study = s.get(Study, sid)
        trials = s.exec(select(Trial)).all()
        hyps = s.exec(select(Hypothesis).order_by(Hypothesis.id)).all()
    assert study.status == "COMPLETED" and len(trials) == 12
    assert {t.arm for t in trials} == {"zero", "high", "low"}
    assert [h.statement for h in hyps] == [HYP["statement"], "lr 1e-4 beats lr 0"]
    assert {h.status for h in hyps} == {"SUPPORTED"}
    assert "lr 0 does not learn." in study.report and "**zero is worse than high**" in study.report
    assert "## Round 2: lr 1e-4 beats lr 0" in study.report
    # frame, hypothesize, design ×2 (one retry), decide (follow-up), design, decide (stop)
    assert len(model.calls) == 7
    assert make_context(sid, planner=object()).cfg.planner == "llm"


def test_prompts_are_versioned_files(tmp_path, monkeypatch):
    from researcher import prompts

    assert set(LLMPlanner.prompt_versions()) == {"system", "frame", "hypothesize", "design", "decide", "retry"}
    (tmp_path / "frame.v1.txt").write_text("old $topic")
    (tmp_path / "frame.v2.txt").write_text("new $topic {json: braces}")
    monkeypatch.setenv(prompts.ENV_DIR, str(tmp_path))
    assert prompts.render("frame", topic="T") == "new T {json: braces}"
    assert prompts.render("frame", version=1, topic="T") == "old T"
    with pytest.raises(KeyError):
        prompts.render("frame")  # a missing placeholder is an error, not a silent gap


def test_the_metric_window_follows_the_trial_length_not_the_model():
    p = LLMPlanner(scripted_replies())  # FRAME says metric_window 5
    assert p.frame("topic", PlanDefaults(steps=2)).metric_window == 1
    assert p.frame("topic", PlanDefaults(steps=100)).metric_window == 5
