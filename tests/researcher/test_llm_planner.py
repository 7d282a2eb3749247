"""The `llm` planner against a scripted chat model (never the network), and `structured`'s
retries, token counting, timeouts and backoff through the real `ChatOpenAI` against a
scripted OpenAI-compatible HTTP server on loopback (tests/researcher/openai_stub.py)."""

from __future__ import annotations

import json
import time

import pytest
from langchain_core.messages import HumanMessage
from sqlmodel import Session, select

from researcher.config import Budget, StudyConfig
from researcher.experiment import Frame, HypothesisSpec
from researcher.llm import (
    COMPACT_JSON,
    ModelRequestsForbidden,
    StructuredOutputError,
    answer_token_limit,
    make_chat_model,
    max_answer_chars,
    override_model,
    structured,
)
from researcher.llm_planner import (
    LLMPlanner,
    decision_schema,
    design_schema,
    frame_schema,
    hypothesis_schema,
    plannable_knobs,
)
from researcher.planning import BudgetTooSmall, PlanDefaults
from researcher.runner import create_study, drive, make_context
from researcher.scripted_model import ScriptedChatModel
from store.models import Hypothesis, Study, Trial
from store.schema import init_db

FRAME = {
    "question": "Does lr matter on arith?",
    "task": "arith",
    "metric": "final_reward",
    "metric_window": 5,
    "knobs": ["lr"],
    "baseline": {},
}
HYP = {
    "statement": "lr 3e-4 beats lr 0",
    "rationale": "lr 0 cannot learn",
    "knob": "lr",
    "baseline_value": 0.0,
    "treatment_values": [3e-4],
    "direction": "greater",
}
DESIGN = {
    "task": "arith",
    "steps": 99,
    "seeds": [0, 1, 2],
    "baseline": "zero",
    "arms": [{"name": "zero", "knobs": {"lr": 0.0}}, {"name": "high", "knobs": {"lr": 3e-4}}],
}
BAD_DESIGN = {**DESIGN, "seeds": [0, 1]}


def scripted_replies() -> ScriptedChatModel:
    """Replies by step (read from the prompt); the first design is invalid (2 seeds)."""
    designs = [json.dumps(BAD_DESIGN), json.dumps(DESIGN)]
    decisions = [
        json.dumps(
            {
                "stop": False,
                "notes": "Is a smaller rate enough?",
                "follow_ups": [{**HYP, "statement": "lr 1e-4 beats lr 0", "treatment_values": [1e-4]}],
            }
        ),
        json.dumps({"stop": True, "follow_ups": [], "notes": "lr 0 does not learn."}),
    ]

    def reply(messages):
        prompt = str(messages[1].content)
        if "Frame it as a study" in prompt:
            return json.dumps(FRAME)
        if "most informative next hypothesis" in prompt:
            return json.dumps(HYP)
        if "Design the experiment" in prompt:
            if designs:
                return designs.pop(0)
            return json.dumps(
                {**DESIGN, "arms": [{"name": "zero", "knobs": {"lr": 0.0}}, {"name": "low", "knobs": {"lr": 1e-4}}]}
            )
        if "Decide whether the study should go on" in prompt:
            return decisions.pop(0)
        raise AssertionError(f"unexpected prompt: {prompt[:200]}")

    return ScriptedChatModel(script=reply)


def test_real_model_requests_are_forbidden_in_tests():
    model = make_chat_model({"llm_base_url": "http://127.0.0.1:9/v1", "llm_model": "m"})
    assert type(model).__mro__[1].__name__ == "ChatOpenAI"
    with pytest.raises(ModelRequestsForbidden):
        model.invoke([HumanMessage(content="hi")])
    with pytest.raises(ModelRequestsForbidden):  # through structured output too, and never retried
        structured(model, [HumanMessage(content="frame")], Frame)


def test_structured_retries_with_the_validation_error():
    model = ScriptedChatModel(script=["Here you go: not json", json.dumps(FRAME)])
    got = structured(model, [HumanMessage(content="frame")], Frame)
    assert got.knobs == ["lr"]
    assert "not valid JSON" in str(model.calls[1][-1].content)
    assert str(model.calls[1][-2].content) == "Here you go: not json"  # the answer is quoted back
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


def _llm_study(fake_program: list[str], budget: Budget) -> StudyConfig:
    """An LLM-planned lr study of fake trials (the scripted model answers; the URL is never called)."""
    return StudyConfig(
        topic="Does lr matter?",
        planner="llm",
        trial_program=fake_program,
        defaults=PlanDefaults(steps=10),
        poll_s=0.2,
        llm_base_url="http://127.0.0.1:9/v1",
        llm_model="fake",
        budget=budget,
    )


def test_llm_study_end_to_end(fake_program):
    model = scripted_replies()
    cfg = _llm_study(fake_program, Budget(llm_tokens=100_000))
    with override_model(model):
        sid = create_study(cfg)
        step = drive(sid, poll_s=0.2)
    assert step.state == "done"
    with Session(init_db()) as s:
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


def test_no_follow_up_or_design_is_asked_for_that_the_trials_left_cannot_run(fake_program):
    """9 trials: the first round runs 6 and decide still asks (3 are left), with a schema that has no room
    for follow-ups; one named anyway is refused before its design is asked for: no LLM tokens spent on
    trials that could never run."""
    model = scripted_replies()
    cfg = _llm_study(fake_program, Budget(llm_tokens=100_000, max_trials=9))
    with override_model(model):
        sid = create_study(cfg)
        step = drive(sid, poll_s=0.2)
    assert step.state == "done"
    with Session(init_db()) as s:
        study = s.get(Study, sid)
        trials = s.exec(select(Trial)).all()
    assert study.status == "COMPLETED" and len(trials) == 6
    assert "a trial budget of 3 cannot cover even the smallest design" in " ".join(study.report.split())
    # frame, hypothesize, design ×2 (one retry), decide (follow-up): the follow-up's design is not asked for
    assert len(model.calls) == 5
    decide = str(model.calls[4][1].content)
    assert "no follow-up can run" in decide and '"follow_ups": {"type": "array"' in decide
    assert json.loads(decide.split("JSON schema:\n", 1)[1])["properties"]["follow_ups"]["maxItems"] == 0
    planner = LLMPlanner(scripted_replies())
    planner.trials_left = 5
    with pytest.raises(BudgetTooSmall, match="a trial budget of 5"):
        planner.design(Frame.model_validate(FRAME), HypothesisSpec.model_validate(HYP), PlanDefaults())
    assert planner.model.calls == []  # type: ignore[attr-defined]


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


# ---------------------------------------------------------------- through ChatOpenAI, over HTTP


class ScriptedEndpoint:
    """An OpenAI-compatible /v1/chat/completions on loopback answering from a script.

    Each entry: {"content": str} (answered as text, or as a call of the request's tool
    when it sent tools), {"status": int} (an error body), {"sleep": s} (answer late).
    Every request body is kept in `requests`.
    """

    def __init__(self, script: list[dict]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                step = outer.script.pop(0) if outer.script else {"status": 500}
                time.sleep(step.get("sleep", 0))
                status = step.get("status", 200)
                if status != 200:
                    reply = {"error": {"message": step.get("message", "scripted error"), "type": "x", "code": status}}
                else:
                    msg = {"role": "assistant", "content": step["content"]}
                    if body.get("tools"):
                        name = body["tools"][0]["function"]["name"]
                        msg = {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": name, "arguments": step["content"]},
                                }
                            ],
                        }
                    reply = {
                        "id": "c1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [{"index": 0, "message": msg, "finish_reason": step.get("finish", "stop")}],
                        "usage": {"prompt_tokens": 1000, "completion_tokens": 234, "total_tokens": 1234},
                    }
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint(monkeypatch):
    """`endpoint(script)` → a running ScriptedEndpoint; real requests allowed for this test only."""
    from researcher import llm

    made = []
    monkeypatch.setenv(llm.ENV_ALLOW, "1")
    with llm.model_requests_allowed(True):
        yield lambda script: made.append(ScriptedEndpoint(script)) or made[-1]
    for e in made:
        e.close()


def _model(url: str, timeout_s: float = 10.0):
    return make_chat_model({"llm_base_url": url, "llm_model": "m"}, timeout_s=timeout_s)


def test_json_schema_mode_and_tokens_from_usage(endpoint):
    ep = endpoint([{"content": json.dumps(FRAME)}, {"content": json.dumps(HYP)}])
    p = LLMPlanner(_model(ep.url))
    f = p.frame("Does lr matter?", PlanDefaults())
    assert f.knobs == ["lr"] and p.tokens_used == 1234  # the response's usage, not an estimate
    rf = ep.requests[0]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "Frame"
    assert "lr" in rf["json_schema"]["schema"]["properties"]["knobs"]["items"]["enum"]
    assert ep.requests[0]["max_completion_tokens"] == 1024 and "tools" not in ep.requests[0]  # the model's cap
    assert rf["json_schema"]["schema"]["x-guidance"] == COMPACT_JSON  # no optional whitespace
    h = p.hypothesize("Does lr matter?", f, [])
    assert h.knob == "lr" and p.tokens_used == 2468
    # the hypothesis' schema knows the frame's knob, its range, and its baseline (the default: the
    # frame set none), and keeps every treatment off the baseline value
    assert ep.requests[1]["max_completion_tokens"] < 1024  # one hypothesis needs less than the cap
    hs = ep.requests[1]["response_format"]["json_schema"]["schema"]["properties"]
    assert hs["knob"]["enum"] == ["lr"] and hs["baseline_value"] == {"enum": [3e-4]}
    assert hs["treatment_values"]["items"] == {
        "anyOf": [
            {"type": "number", "minimum": 0.0, "exclusiveMaximum": 3e-4},
            {"type": "number", "maximum": 0.01, "exclusiveMinimum": 3e-4},
        ]
    }


def test_a_server_refusing_response_format_gets_tool_calls(endpoint):
    ep = endpoint(
        [
            {"status": 400, "message": "response_format json_schema is not supported"},
            {"content": json.dumps(FRAME)},
            {"content": json.dumps(HYP)},
        ]
    )
    p = LLMPlanner(_model(ep.url))
    f = p.frame("t", PlanDefaults())
    p.hypothesize("t", f, [])
    assert p.policy.method == "function_calling" and f.knobs == ["lr"]
    assert [("response_format" in r, "tools" in r) for r in ep.requests] == [
        (True, False),
        (False, True),
        (False, True),
    ]


def test_invalid_answers_go_back_and_use_up_the_retries(endpoint):
    ep = endpoint([{"content": '{"question": "x"}'}] * 3)
    p = LLMPlanner(_model(ep.url), retries=2)
    with pytest.raises(StructuredOutputError, match="no valid Frame after 3 attempts"):
        p.frame("t", PlanDefaults())
    assert len(ep.requests) == 3 and p.tokens_used == 3 * 1234  # invalid answers cost tokens too
    last = ep.requests[-1]["messages"]
    assert last[-2] == {"role": "assistant", "content": '{"question": "x"}'} and "not valid" in last[-1]["content"]


def test_slow_and_failing_calls_are_retried_with_backoff(endpoint):
    from researcher.llm import CallPolicy

    ep = endpoint([{"sleep": 2.0, "content": "{}"}, {"status": 503}, {"content": json.dumps(FRAME)}])
    policy = CallPolicy(wait_s=30, backoff_s=0.05)
    slept: list[float] = []
    got = structured(
        _model(ep.url, timeout_s=0.5),
        [HumanMessage(content="frame")],
        Frame,
        policy=policy,
        sleep=lambda s: slept.append(s) or time.sleep(s),
    )
    assert got.knobs == ["lr"] and policy.transport_retries == 2
    assert len(slept) == 2 and slept[1] > slept[0]  # exponential


def test_an_endpoint_that_stays_down_is_reported_after_wait_s(endpoint):
    import socket

    from researcher.llm import CallPolicy, LLMUnreachable

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    endpoint([])  # (allows requests)
    policy = CallPolicy(wait_s=1.0, backoff_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(LLMUnreachable, match="gave up after [1-9]+ retries"):
        structured(_model(url), [HumanMessage(content="frame")], Frame, policy=policy)
    assert 0.3 < time.monotonic() - t0 < 5


def test_a_refusal_is_not_retried(endpoint):
    from researcher.llm import LLMUnreachable

    ep = endpoint([{"status": 404, "message": "The model `m` does not exist."}])
    with pytest.raises(LLMUnreachable, match="refused the request for model 'm'"):
        structured(_model(ep.url), [HumanMessage(content="frame")], Frame)
    assert len(ep.requests) == 1


def test_settings_fall_back_to_the_openai_environment(monkeypatch):
    from researcher.llm import llm_settings

    for v in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        monkeypatch.delenv(v, raising=False)
    assert llm_settings() is None
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert llm_settings() is None  # no model named
    monkeypatch.setenv("OPENAI_MODEL", "gpt-x")
    assert llm_settings() == {"api_key": "sk-x", "model": "gpt-x"}  # OpenAI itself
    monkeypatch.setenv("ROOST_LLM_BASE_URL", "http://127.0.0.1:1/v1")
    assert llm_settings({"llm_model": "mine"}) == {
        "api_key": "sk-x",
        "model": "mine",
        "base_url": "http://127.0.0.1:1/v1",
    }


def test_a_cut_off_answer_is_an_invalid_one(endpoint):
    ep = endpoint([{"content": '{"question": "Does lr mat', "finish": "length"}, {"content": json.dumps(FRAME)}])
    p = LLMPlanner(_model(ep.url))
    assert p.frame("t", PlanDefaults()).knobs == ["lr"] and p.tokens_used == 2 * 1234
    assert "cut off at the token limit (234 tokens)" in ep.requests[1]["messages"][-1]["content"]


def test_every_planner_schema_bounds_its_answer():
    """Guided decoding ends an answer where its schema ends only if the schema ends: every
    string has a maxLength, every array a maxItems, every object is closed."""
    knobs = plannable_knobs()
    hyp = HypothesisSpec.model_validate(HYP)
    schemas = {
        "frame": frame_schema(knobs),
        "hypothesis": hypothesis_schema(["lr"], {}),
        "hypotheses": hypothesis_schema(knobs),
        "decision": decision_schema(knobs),
        "design": design_schema("arith", hyp, PlanDefaults(), ["kl_coef"]),
    }
    sizes = {name: max_answer_chars(js) for name, js in schemas.items()}
    assert all(n is not None and n < 2000 for n in sizes.values()), sizes
    scripted = {"frame": FRAME, "hypothesis": HYP, "hypotheses": HYP, "design": DESIGN}
    for name, answer in scripted.items():  # the answers the planner's tests script fit their schema's bound
        assert len(json.dumps(answer)) <= sizes[name], name
    # max_tokens follows the bound (with room for escapes), under the model's own cap
    assert answer_token_limit(schemas["design"], 2048) < 2 * sizes["design"] < 2048
    assert answer_token_limit(schemas["decision"], 1024) == 1024
    assert answer_token_limit(Frame.model_json_schema(), 256) == 256  # unbounded: the cap alone


def test_the_answer_bound_counts_the_longest_answer():
    text = {"type": "string", "maxLength": 10}
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "a": text,
            "b": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "maxItems": 2},
            "c": {"enum": ["xy", "long-one"]},
            "d": {"anyOf": [{"type": "boolean"}, text]},
        },
    }
    longest = {"a": "x" * 10, "b": [999, 999], "c": "long-one", "d": "y" * 10}
    assert max_answer_chars(schema) >= len(json.dumps(longest))
    assert max_answer_chars(schema) - len(json.dumps(longest)) <= 10  # tight, not a guess
    for loose in (
        {"type": "string"},
        {"type": "array", "items": text},
        {"type": "object", "properties": {"a": text}},
        {"$ref": "#/$defs/X"},
    ):
        assert max_answer_chars(loose) is None, loose
