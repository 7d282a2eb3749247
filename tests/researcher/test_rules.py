import pytest

from researcher.planning import BudgetTooSmall, PlanDefaults, UnsupportedTopic, fit_to_budget
from researcher.rules import RulesPlanner


def plan(topic, **kw):
    p = RulesPlanner()
    d = PlanDefaults(**kw)
    f = p.frame(topic, d)
    h = p.hypothesize(topic, f, [])
    return f, h, p.design(f, h, d)


def test_learning_rate_topic():
    f, h, d = plan("Does the learning rate matter for arithmetic? Compare 0 and 3e-4", steps=12)
    # the metric window scales with the trial: 20 % of 12 steps, rounded up
    assert (f.task, f.knobs, f.metric, f.metric_window) == ("arith", ["lr"], "final_reward", 3)
    assert h.baseline_value == 0.0 and h.treatment_values == [3e-4] and h.direction == "greater"
    assert [a.knobs for a in d.arms] == [{"lr": 0.0}, {"lr": 3e-4}]
    assert d.baseline == d.arms[0].name and d.seeds == [0, 1, 2] and d.steps == 12
    assert len(d.trial_configs()) == 6


@pytest.mark.parametrize(
    "topic, knob, values, task",
    [
        ("Does group size matter on the guessing game? Compare 4 and 16", "group_size", [4, 16], "guess"),
        ("Compare a KL coefficient of 0.1 against none (0)", "kl_coef", [0.0, 0.1], "arith"),
        ("Is timeline merging on better than off?", "timeline_merge", [True, False], "arith"),
        ("Sampling temperature 0.7 vs 1.0 for arithmetic", "temperature", [0.7, 1.0], "arith"),
        ("Is RLOO better than GRPO?", "advantage", ["grpo", "rloo"], "arith"),
        ("Does the model matter? Try /models/a", "model", ["embedded", "/models/a"], "arith"),
        ("Does a task mix help?", "task", ["arith", "arith+guess"], "arith"),
        (
            "Does sequence-mean loss aggregation help a mix of arithmetic and guess?",
            "loss_agg",
            ["token-mean", "seq-mean-token-mean"],
            "arith+guess",
        ),
        ("Token-mean loss on the guessing game", "loss_agg", ["token-mean", "seq-mean-token-mean"], "guess"),
    ],
)
def test_knobs_are_parsed(topic, knob, values, task):
    p = RulesPlanner()
    f = p.frame(topic, PlanDefaults())
    h = p.hypothesize(topic, f, [])
    assert f.knobs == [knob] and f.task == task
    assert sorted(map(str, [h.baseline_value, *h.treatment_values])) == sorted(map(str, values))


def test_more_seeds_and_one_round_only():
    p = RulesPlanner()
    f, h, d = plan("learning rate 1e-4 vs 3e-4", seeds=5)
    assert d.seeds == [0, 1, 2, 3, 4]
    assert p.hypothesize("learning rate 1e-4 vs 3e-4", f, [{"round": 0}]) is None


@pytest.mark.parametrize(
    "topic, says",
    [
        ("Does Adam beat SGD?", "cannot study the optimizer"),
        ("Does a cosine schedule help arithmetic?", "cannot study a learning-rate schedule"),
        ("Do more layers help?", "cannot study the architecture"),
        ("Does weight decay help?", "found no knob"),
        ("Does training help on arithmetic?", "found no knob"),
        ("Does a bigger model help?", "name at least two values of model"),
    ],
)
def test_topics_outside_its_knobs_are_refused_with_what_it_can_study(topic, says):
    p = RulesPlanner()
    with pytest.raises(UnsupportedTopic, match=says) as e:
        p.hypothesize(topic, p.frame(topic, PlanDefaults()), [])
    if "no knob" in says or "cannot study" in says:
        assert "lr: learning rate" in str(e.value) and "group_size" in str(e.value)


def test_a_design_is_shrunk_to_the_trial_budget_arms_before_seeds():
    _, _, d = plan("Does group size matter? Compare 4, 8, 16 and 32", seeds=4)
    assert (len(d.arms), len(d.seeds)) == (4, 4)
    same, note = fit_to_budget(d, 16)
    assert same is d and note == ""
    fitted, note = fit_to_budget(d, 9)
    assert [a.name for a in fitted.arms] == ["group_size=4", "group_size=8"] and fitted.seeds == [0, 1, 2, 3]
    assert "dropped arm(s) group_size=16, group_size=32" in note and "8 of 16" in note
    fitted, note = fit_to_budget(d, 6)
    assert len(fitted.arms) == 2 and fitted.seeds == [0, 1, 2] and "3 seeds instead of 4" in note
    with pytest.raises(BudgetTooSmall, match="cannot cover even the smallest design"):
        fit_to_budget(d, 5)
