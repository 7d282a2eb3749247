"""The verdict rule holds its promises on simulated studies (normal seed noise, seconds, in CI).

* no true difference: the study calls "inconclusive" (never "supported"/"refuted")
  at least 95 % of the time, with one treatment and with three (Holm);
* a planted difference of `DETECTABLE_SDS` seed-to-seed SDs with the default seeds
  (`MIN_SEEDS` per arm) is called "supported" at least 80 % of the time;
* the same with adaptive rounds (more seeds under alpha spending) and early stopping on,
  paired (deterministic trials) or not, and with a planted effect on one of three
  treatments the other two stay unsupported at least 95 % of the time
  (docs/researcher-statistics.md, "Calibration").

Fixed seeds: the same simulated studies every run.
"""

from __future__ import annotations

import numpy as np
import pytest

from researcher.analysis import DETECTABLE_SDS, INCONCLUSIVE, SUPPORTED, analyze
from researcher.planning import PlanDefaults

REPS = 400


def calls(delta: float, treatments: int, direction: str, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    n = PlanDefaults().seeds
    out: dict[str, int] = {}
    for _ in range(REPS):
        metrics = {"base": list(0.3 + 0.05 * rng.standard_normal(n))}
        for i in range(treatments):
            shift = delta * 0.05 if i == 0 else 0.0
            metrics[f"arm{i}"] = list(0.3 + shift + 0.05 * rng.standard_normal(n))
        verdict = analyze(metrics, "base", direction)["verdict"]
        out[verdict] = out.get(verdict, 0) + 1
    return out


@pytest.mark.parametrize("treatments, direction", [(1, "greater"), (1, "two-sided"), (3, "two-sided")])
def test_no_true_difference_is_called_inconclusive_95_percent_of_the_time(treatments, direction):
    got = calls(0.0, treatments, direction, seed=11 + treatments)
    assert got.get(INCONCLUSIVE, 0) >= 0.95 * REPS, got


@pytest.mark.parametrize("direction", ["greater", "two-sided"])
def test_a_planted_difference_is_found_80_percent_of_the_time_with_the_default_seeds(direction):
    assert PlanDefaults().seeds == 3
    got = calls(DETECTABLE_SDS, 1, direction, seed=7)
    assert got.get(SUPPORTED, 0) >= 0.8 * REPS, got


# ---------------------------------------------------------------- adaptive studies
# The rules planner's own rounds (`next_round`: more seeds after an inconclusive look, under
# alpha spending), successive halving at two rungs (`halving_stops`) and the analysis the
# study graph runs (`analyze` with `sequential_look`), on simulated trials: each trial's
# metric is its arm's mean plus seed noise (SD `SIGMA`), and what it reports at a rung is
# that plus more noise, as a trial's running reward is a noisier estimate of its end. A
# study's verdict on its question is its comparison's last look.

import functools  # noqa: E402
import math  # noqa: E402

from researcher.analysis import sequential_look  # noqa: E402
from researcher.config import Adaptive  # noqa: E402
from researcher.experiment import Frame, HypothesisSpec, arm_name  # noqa: E402
from researcher.rules import RulesPlanner, next_round  # noqa: E402
from researcher.sequential import halving_stops  # noqa: E402

SIGMA = 0.05
SEED_CORR = 0.7  # deterministic trials: correlation of two arms' metrics at one seed
STUDIES = 400
ADAPTIVE = Adaptive(rounds=3, early_stop=True)  # max_seeds None: 2 × 3 seeds, two looks at most


@functools.cache
def first_round(topic: str) -> tuple[RulesPlanner, PlanDefaults, Frame, HypothesisSpec]:
    """The planner's frame and first hypothesis: the same for every simulated study of a topic."""
    p = RulesPlanner(ADAPTIVE)
    defaults = PlanDefaults(steps=30)
    frame = p.frame(topic, defaults)
    spec = p.hypothesize(topic, frame, [])
    assert spec is not None
    return p, defaults, frame, spec


def simulate(topic: str, effects: dict[float, float], seed: int, deterministic: bool = False) -> dict[str, str]:
    """One adaptive study on simulated trials; {arm: verdict of its comparison at the last look}.

    `effects`: planted shift of the metric per lr value, in seed-to-seed SDs. With
    `deterministic`, the arms' trials of one seed are correlated (`SEED_CORR`: the same
    seed fixes the data order and the initial sampling, the knob changes the rest), so
    pairing by seed removes part of the noise; else every trial draws its own.
    """
    rng = np.random.default_rng(seed)
    p, defaults, frame, spec = first_round(topic)
    seed_effect: dict[int, float] = {}

    def trial(value: float, s: int) -> tuple[float, list[float]]:
        shared = seed_effect.setdefault(s, float(rng.standard_normal()))
        own = float(rng.standard_normal())
        noise = SEED_CORR * shared + math.sqrt(1 - SEED_CORR**2) * own if deterministic else own
        final = 0.3 + SIGMA * (effects.get(value, 0.0) + noise)
        return final, [final + SIGMA * float(rng.standard_normal()) for _ in ADAPTIVE.rungs]

    history: list[dict] = []
    values: dict[str, list[tuple[int, float]]] = {}
    stopped: dict[str, str] = {}
    fractions: list[float] = []
    seeds_so_far: list[int] = []
    cap = ADAPTIVE.seeds_cap(defaults.seeds)
    while True:
        design = p.design(frame, spec, defaults)
        live = {a.name: a.knobs["lr"] for a in design.arms if a.name not in stopped}
        runs = {name: [(s, *trial(v, s)) for s in design.seeds] for name, v in live.items()}
        for r in range(len(ADAPTIVE.rungs)):  # successive halving, rung by rung
            interim = {name: [rungs[r] for _, _, rungs in rs] for name, rs in runs.items() if name not in stopped}
            stopped |= halving_stops(interim, design.baseline)
        for name, rs in runs.items():
            if name not in stopped:
                values.setdefault(name, []).extend((s, final) for s, final, _ in rs)
        seeds_so_far += design.seeds
        fractions.append(len(seeds_so_far) / cap)
        result = analyze(
            {a.name: [v for _, v in values.get(a.name, [])] for a in design.arms if a.name not in stopped},
            design.baseline,
            spec.direction,
            seeds={k: [s for s, _ in v] for k, v in values.items()},
            deterministic=deterministic,
            sequential=sequential_look(fractions, max_seeds=cap) if fractions[0] < 1 else None,
            stopped=stopped,
        )
        result["seeds"] = list(seeds_so_far)
        decision = next_round(frame, spec, result, history, True, ADAPTIVE)
        history.append({"round": len(history), "design": design.model_dump(mode="json"), "analysis": result})
        follow = decision.follow_ups[0] if decision.follow_ups else None
        if follow is None or follow.extends is None:  # the question is answered (a bracket asks another)
            return {c["arm"]: c["verdict"] for c in result["comparisons"]}
        spec = follow


TWO_ARMS = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
FOUR_ARMS = "Does the learning rate matter for arithmetic? Compare 0, 1e-4, 3e-4 and 1e-3"
TWO_SIDED = "Does the learning rate matter for arithmetic? Compare 1e-4, 3e-4, 1e-3 and 3e-3"  # no lr 0: two-sided


def rate(
    topic: str, effects: dict[float, float], seed: int, supported_arm: str | None = None, studies: int = STUDIES, **kw
) -> float:
    """Share of studies calling `supported_arm` (None: any arm) supported."""
    hits = 0
    for i in range(studies):
        verdicts = simulate(topic, effects, seed * 100_000 + i, **kw)
        arms = [supported_arm] if supported_arm else list(verdicts)
        hits += any(verdicts.get(a) == SUPPORTED for a in arms)
    return hits / studies


@pytest.mark.parametrize(
    "topic, deterministic", [(TWO_ARMS, False), (TWO_ARMS, True), (FOUR_ARMS, False), (TWO_SIDED, True)]
)
def test_adaptive_study_with_no_true_effect_is_not_supported_95_percent_of_the_time(topic, deterministic):
    # the paired two-sided case runs closest to the limit (3.7 % over 3000 studies): more studies, so
    # the estimate's own spread (±0.6 %) does not decide the test
    studies = 1000 if topic == TWO_SIDED else STUDIES
    assert rate(topic, {}, seed=21, deterministic=deterministic, studies=studies) <= 0.05


@pytest.mark.parametrize("deterministic", [False, True])
def test_adaptive_study_finds_a_planted_4_sd_effect_80_percent_of_the_time(deterministic):
    assert rate(TWO_ARMS, {3e-4: DETECTABLE_SDS}, seed=22, deterministic=deterministic) >= 0.80


def test_adaptive_study_keeps_the_other_treatments_unsupported_beside_a_planted_effect():
    planted, others = arm_name("lr", 3e-4), [arm_name("lr", 1e-4), arm_name("lr", 1e-3)]
    found = false_positive = 0
    for i in range(STUDIES):
        verdicts = simulate(FOUR_ARMS, {3e-4: DETECTABLE_SDS}, 2_300_000 + i)
        found += verdicts.get(planted) == SUPPORTED
        false_positive += any(verdicts.get(a) == SUPPORTED for a in others)
    assert false_positive / STUDIES <= 0.05 and found / STUDIES >= 0.80
