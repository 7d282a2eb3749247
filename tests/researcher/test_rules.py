import pytest

from researcher.planning import BudgetTooSmall, PlanDefaults, UnsupportedTopic, fit_to_budget
from researcher.rules import RulesPlanner
from researcher.topic import detect_knobs, detect_values, out_of_range, studied_knobs, topic_counts


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
        # the knobs by the names the refusal lists them under
        ("Compare group_size 4 and 8", "group_size", [4, 8], "arith"),
        ("Compare kl_coef 0 and 0.1", "kl_coef", [0.0, 0.1], "arith"),
        ("batch_groups 2 vs 4 on guess", "batch_groups", [2, 4], "guess"),
        ("Compare timeline_merge true and false", "timeline_merge", [True, False], "arith"),
        ("loss_agg on a mix of arith and guess", "loss_agg", ["token-mean", "seq-mean-token-mean"], "arith+guess"),
    ],
)
def test_knobs_are_parsed(topic, knob, values, task):
    p = RulesPlanner()
    f = p.frame(topic, PlanDefaults())
    h = p.hypothesize(topic, f, [])
    assert f.knobs == [knob] and f.task == task
    assert sorted(map(str, [h.baseline_value, *h.treatment_values])) == sorted(map(str, values))


def test_every_knob_the_refusal_lists_is_recognised_by_that_name():
    for knob in studied_knobs():
        if knob != "task":  # a task mix is asked for in words ("a task mix"); "the arith task" is no knob
            assert detect_knobs(f"Does {knob} matter?") == [knob], knob
    assert detect_knobs("Does lr matter on the arith task?") == ["lr"]


@pytest.mark.parametrize(
    "topic, base, treatments",
    [
        ("Does the LoRA rank matter? Compare 8 and 32", 8, [32]),
        ("Does LoRA rank 8 learn as well as full fine-tuning?", 0, [8]),  # full fine-tuning is the control
        ("Does LoRA help on arithmetic?", 0, [8]),  # the default arms
    ],
)
def test_lora_rank_is_a_knob_with_full_fine_tuning_as_its_control(topic, base, treatments):
    _, h, d = plan(topic)
    assert (h.knob, h.baseline_value, h.treatment_values) == ("lora_rank", base, treatments)
    assert {a.knobs["lora_rank"] for a in d.arms} == {base, *treatments}
    assert bracket_values("lora_rank", 16, [8, 16, 32]) == [11, 23]  # log-midpoints, as ranks go by factors


def test_a_number_that_is_no_value_of_the_knob_leaves_the_default_arms():
    """A step count in the topic is no learning rate: with no value named, the default arms stand."""
    _, h, _ = plan("Does the learning rate matter over 40 steps?")
    assert (h.baseline_value, h.treatment_values) == (0.0, [3e-4])


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
        ("Does bf16 matter?", "cannot study numeric precision"),
        ("Does weight decay help?", "found no knob"),
        ("Does training help on arithmetic?", "found no knob"),
        ("Does a bigger model help?", "name at least two values of model"),
        # one value kept, one past the range dropped: it compared 8 with the default 0 instead
        ("Does the LoRA rank matter? Compare 8 and 256", r"names 256 for lora_rank, outside .* \(\[0, 64\]\)"),
        # the only value past the range: it planned the knob's default arms (lr 0 vs 3e-4; group size 4, 8, 16)
        ("Does lr 5 help?", r"names 5 for lr, outside the range"),
        ("Does group size 0 help?", r"names 0 for group_size, outside the range"),
        # tasks against each other read as "no knob" though the list below it showed `task`
        ("Does arith learn faster than guess?", "task knob compares one task against a task mix"),
        # the second comparison was dropped without a word: lr alone was planned
        ("Compare lr 0 and 3e-4 and group size 4 and 16", r"more than one knob \(lr: 0.0, 0.0003; group_size: 4, 16\)"),
        ("Does RLOO beat GRPO at lr 1e-4 and 3e-4?", "more than one knob"),
        # one value twice became lr 0 against 3e-4 (its natural baseline) in silence
        ("Compare lr 3e-4 and 3e-4", "names lr 0.0003 2 times and no other value"),
    ],
)
def test_topics_outside_its_knobs_are_refused_with_what_it_can_study(topic, says):
    p = RulesPlanner()
    with pytest.raises(UnsupportedTopic, match=says) as e:
        p.hypothesize(topic, p.frame(topic, PlanDefaults()), [])
    if "no knob" in says or "cannot study" in says:
        assert "lr: learning rate" in str(e.value) and "group_size" in str(e.value)


@pytest.mark.parametrize(
    "topic, knob, values",
    [
        # the counts were arms: group sizes 16, 4, 40 and 3
        ("Does a group size of 16 beat 4 over 40 steps with 3 seeds?", "group_size", [16, 4]),
        ("Compare learning rates 1e-4 and 3e-4 over 100 training steps", "lr", [1e-4, 3e-4]),
        ("Does lr 3e-4 beat 0 in 12 trials on 20% harder sums?", "lr", [3e-4, 0.0]),
        ("Does a group of 8 episodes beat 4?", "group_size", [8, 4]),  # episodes are what a group holds
    ],
)
def test_counts_of_the_study_are_not_values_of_its_knob(topic, knob, values):
    assert detect_values(topic, knob) == values
    assert out_of_range(topic, knob) == []


def test_the_steps_and_seeds_a_topic_names():
    assert topic_counts("Does lr 3e-4 beat 0 over 100 steps with 5 random seeds?") == {"steps": 100, "seeds": 5}
    assert topic_counts("Compare lr 0 and 3e-4 in 12 trials of 30 minutes") == {}
    with pytest.raises(UnsupportedTopic, match="names 100 and 40 steps"):
        topic_counts("lr 0 vs 3e-4 over 100 steps, not 40 steps")


@pytest.mark.parametrize(
    "topic, arms",
    [
        # it studied group sizes 4, 8 and 16: group_size comes before advantage in the patterns
        (
            "Does RLOO beat GRPO on arithmetic with a group size of 8?",
            [{"group_size": 8, "advantage": "grpo"}, {"group_size": 8, "advantage": "rloo"}],
        ),
        # numbers go to the knob named just before them: 16 and 4 are group sizes, 1e-4 a rate
        ("Does a group size of 16 beat 4 at lr 1e-4?", [{"lr": 1e-4, "group_size": 4}, {"lr": 1e-4, "group_size": 16}]),
        # before any mention, to the first knob named after them
        (
            "Compare 0 and 3e-4 for the learning rate with a group size of 8",
            [{"group_size": 8, "lr": 0.0}, {"group_size": 8, "lr": 3e-4}],
        ),
        # one value each: the knob introduced as a setting ("at", "with") is held, the other compared
        ("Does a group size of 32 help at lr 1e-4?", [{"lr": 1e-4, "group_size": 8}, {"lr": 1e-4, "group_size": 32}]),
        (
            "With a group size of 8, is lr 1e-3 too high?",
            [{"group_size": 8, "lr": 3e-4}, {"group_size": 8, "lr": 1e-3}],
        ),
    ],
)
def test_a_topic_naming_several_knobs_compares_one_and_holds_the_others(topic, arms):
    f, h, d = plan(topic)
    assert [{**d.common, **a.knobs} for a in d.arms] == arms
    assert d.baseline == d.arms[0].name and "as the question says" in h.rationale


@pytest.mark.parametrize(
    "topic, base, treatments, direction",
    [
        # "Does A beat B?" measures A against B, and asks one side: B was the baseline only when named first
        ("Does a learning rate of 1e-3 beat 3e-4 on arith?", 3e-4, [1e-3], "greater"),
        ("Is a group size of 16 better than 4?", 4, [16], "greater"),
        ("Does RLOO outperform GRPO?", "grpo", ["rloo"], "greater"),
        ("Is a temperature of 0.7 worse than 1.0?", 1.0, [0.7], "less"),
        ("Does lr 3e-4 beat 0?", 0.0, [3e-4], "greater"),  # the natural control anyway
        ("Compare lr 1e-3 and 3e-4", 1e-3, [3e-4], "two-sided"),  # no side taken: the first named, both ways
    ],
)
def test_a_topic_saying_which_value_is_beaten_makes_it_the_baseline(topic, base, treatments, direction):
    f, h, d = plan(topic)
    assert (h.baseline_value, h.treatment_values, h.direction) == (base, treatments, direction)
    assert d.baseline == d.arms[0].name and d.arms[0].knobs[h.knob] == base


@pytest.mark.parametrize(
    "topic, base, treatments",
    [
        ("Does a group size of 32 help?", 8, [32]),  # against the default; it was 32 against 4, 8 and 16
        ("Is a KL penalty of 0.05 better than none?", 0.0, [0.05]),
        ("Is lr=1e-3 too high?", 3e-4, [1e-3]),
        ("Does a group size of 8 help?", 8, [4, 16]),  # the default itself: the default arms around it
    ],
)
def test_one_value_named_is_compared_with_the_knobs_default(topic, base, treatments):
    _, h, _ = plan(topic)
    assert (h.baseline_value, h.treatment_values) == (base, treatments)


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


# ---------------------------------------------------------------- adaptive rounds

from researcher.analysis import analyze, sequential_look  # noqa: E402
from researcher.config import Adaptive  # noqa: E402
from researcher.rules import bracket_values, next_round  # noqa: E402

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"


def first(topic=TOPIC):
    p = RulesPlanner(Adaptive(rounds=3))
    f = p.frame(topic, PlanDefaults())
    return p, f, p.hypothesize(topic, f, [])


def looked(metrics, baseline, fractions, seeds=(0, 1, 2), direction="greater"):
    r = analyze(metrics, baseline, direction, sequential=sequential_look(fractions, max_seeds=6))
    r["seeds"] = list(seeds)
    return r


def test_brackets_are_log_midpoints_for_lr_and_midpoints_for_linear_knobs():
    assert bracket_values("lr", 3e-4, [0.0, 3e-4]) == [9.5e-05, 0.00095]  # half a decade out where 0 or none
    assert bracket_values("lr", 3e-4, [1e-4, 3e-4, 1e-3]) == [0.00017, 0.00055]  # √(1e-4·3e-4), √(3e-4·1e-3)
    assert bracket_values("temperature", 1.0, [0.7, 1.0]) == [0.85, 1.15]
    assert bracket_values("group_size", 8, [4, 8, 16]) == [6, 12]
    assert bracket_values("lr", 1e-2, [3e-3, 1e-2]) == [0.0055]  # the top of lr's study range: no value above
    assert bracket_values("timeline_merge", True, [True, False]) == []


def test_a_supported_round_is_followed_by_a_bracket_around_the_best_value_with_its_reason():
    p, f, h = first()
    r = looked({"lr=0": [0.20, 0.21, 0.19], "lr=0.0003": [0.61, 0.60, 0.62]}, "lr=0", [0.5])
    assert r["verdict"] == "supported"
    d = p.decide(f, h, r, [], True)
    (nxt,) = d.follow_ups
    assert not d.stop and nxt.baseline_value == 3e-4 and nxt.treatment_values == [9.5e-05, 0.00095]
    assert nxt.direction == "two-sided" and nxt.extends is None and nxt.seeds is None
    assert "brackets it with log-midpoints" in nxt.rationale and "lr=0.0003 was best" in nxt.rationale
    assert "Round 1 supported" in d.notes


def test_an_inconclusive_round_gets_more_seeds_on_the_same_arms_as_the_next_look():
    p, f, h = first()
    r = looked({"lr=0": [0.20, 0.30, 0.25], "lr=0.0003": [0.24, 0.33, 0.27]}, "lr=0", [0.5])
    assert r["verdict"] == "inconclusive"
    d = p.decide(f, h, r, [], True)
    (nxt,) = d.follow_ups
    assert nxt.seeds == [3, 4, 5] and nxt.extends == 0 and nxt.statement == h.statement
    assert "look 2" in nxt.rationale and "obrien-fleming alpha spending" in nxt.rationale
    p.trials_left = 5  # 2 arms × 3 seeds do not fit
    assert p.decide(f, h, r, [], True).stop
    # the last look (6 of at most 6 seeds) or an interval narrower than the precision target: stop
    last = looked({"lr=0": [0.2, 0.3, 0.25, 0.2, 0.3, 0.25], "lr=0.0003": [0.24, 0.33, 0.27] * 2}, "lr=0", [0.5, 1.0])
    last["seeds"] = [0, 1, 2, 3, 4, 5]
    d = next_round(f, nxt, last, [{"round": 0}], True, Adaptive(rounds=3))
    assert d.stop and "the most this study allows (6)" in d.notes
    d = next_round(f, h, r, [], True, Adaptive(rounds=3, precision=1.0))
    assert d.stop and "narrower than the precision target 1" in d.notes


def test_the_round_limit_and_the_budget_end_the_study_with_a_reason():
    p, f, h = first()
    r = looked({"lr=0": [0.20, 0.21, 0.19], "lr=0.0003": [0.61, 0.60, 0.62]}, "lr=0", [0.5])
    assert "limit is 1 round" in next_round(f, h, r, [], True, Adaptive()).notes
    assert "budget is spent" in next_round(f, h, r, [], False, Adaptive(rounds=3)).notes


def test_the_examples_in_the_modules_docstrings_hold():
    import doctest

    import researcher.rules
    import researcher.topic

    for module in (researcher.topic, researcher.rules):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
