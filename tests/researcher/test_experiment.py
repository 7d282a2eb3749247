import pytest
from pydantic import ValidationError

from researcher.experiment import Arm, Design, ExperimentConfig, HypothesisSpec, swarm_train_flags


def _design(**kw):
    base = dict(
        task="arith",
        steps=10,
        seeds=[0, 1, 2],
        baseline="a",
        arms=[Arm(name="a", knobs={"lr": 0.0}), Arm(name="b", knobs={"lr": 3e-4})],
    )
    return Design(**{**base, **kw})


def test_valid_design_renders_swarm_train_flags():
    d = _design()
    cfgs = d.trial_configs()
    assert len(cfgs) == 6
    assert cfgs[3].argv("/o") == ["--task", "arith", "--steps", "10", "--seed", "0", "--out", "/o", "--lr", "0.0003"]
    d.check_program(swarm_train_flags())  # lr is a real `swarm train` flag


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"seeds": [0, 1]}, "at least 3"),
        ({"seeds": [0, 0, 1]}, "distinct"),
        ({"baseline": "zzz"}, "baseline"),
        ({"arms": [Arm(name="a", knobs={"lr": 0.0}), Arm(name="b", knobs={"lr": 0.0})]}, "identical"),
        ({"task": "chess"}, "unknown task"),
    ],
)
def test_invalid_designs_are_refused(kw, msg):
    with pytest.raises(ValidationError, match=msg):
        _design(**kw)


@pytest.mark.parametrize(
    "knobs, msg",
    [
        ({"learning_rate": 1e-4}, "unknown knob"),
        ({"lr": 5.0}, "outside the allowed range"),
        ({"group_size": 3.5}, "integer"),
        ({"advantage": "ppo"}, "one of"),
    ],
)
def test_knob_validation(knobs, msg):
    with pytest.raises(ValidationError, match=msg):
        ExperimentConfig(arm="x", seed=0, steps=5, knobs=knobs)


def test_knob_without_a_train_flag_is_refused_for_swarm_train():
    d = _design(arms=[Arm(name="a", knobs={"temperature": 1.0}), Arm(name="b", knobs={"temperature": 0.7})])
    flags = frozenset({"--task", "--steps", "--seed", "--out", "--lr"})
    with pytest.raises(ValueError, match="not supported by `swarm train`"):
        d.check_program(flags)


def test_task_mixes_reach_swarm_train():
    flags = frozenset({"--task", "--steps", "--seed", "--out"})
    d = _design(arms=[Arm(name="a", knobs={"task": "arith"}), Arm(name="b", knobs={"task": "arith=0.75+guess=0.25"})])
    d.check_program(flags)  # `swarm train --task` takes mixes
    cfg = ExperimentConfig(arm="b", seed=0, steps=5, task="arith+guess")
    assert cfg.argv("/o")[:2] == ["--task", "arith+guess"]
    bad = _design(arms=[Arm(name="a", knobs={"task": "arith"}), Arm(name="b", knobs={"task": "arith=0+guess=1"})])
    with pytest.raises(ValueError, match="positive"):
        bad.check_program(flags)


def test_hypothesis_baseline_cannot_be_a_treatment():
    with pytest.raises(ValidationError, match="baseline value"):
        HypothesisSpec(statement="x y z", knob="lr", baseline_value=0, treatment_values=[0.0])


def test_public_api_is_exactly_all():
    import researcher

    assert researcher.__all__ == sorted(researcher.__all__)
    for name in researcher.__all__:
        assert getattr(researcher, name) is not None
