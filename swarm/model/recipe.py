"""The embedded model's recipe as data: the warm start's settings and the marker a finished build carries.

Why a module of its own, without torch: `swarm model init` on a model that is already built (the
README's first command, run again) only has to read the marker and compare it with this recipe;
importing `swarm.model.build` for that took seconds of torch and transformers imports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from swarm.model.version import BUILD_VERSION, read_marker

VOCAB_SIZE = 512


@dataclass(frozen=True)
class WarmStartConfig:
    """The warm-start recipe; recorded in the model's marker file.

    The figures in the comments below were measured on earlier builds, on whatever processor built
    them. Build 7, on pinned numerics (swarm/model/numerics.py), measures (200 episodes each, greedy /
    temperature 1): arith 0.85 / 0.285, calc 0.94 / 0.34, duet 0.77 / 0.27, guess 0.48 at T = 1.
    """

    arith_examples: int = 20000
    guess_examples: int = 2000
    #: Near-miss answers in `arith`'s data. Why not clean: the one logit scale below serves every
    #: task. With clean arith data next to `calc`, arith's answers are so sharp that reaching the
    #: target needs a scale under 0.3, which flattens calc's ~30-token calls into noise (calc needs
    #: the final scale near `calc_train_scale`); arith then sampled at ≈0.4 at the 0.3 floor. At
    #: 0.15 arith's unscaled reward is ≈0.75, the scale ends at ≈0.38 and both tasks sample
    #: in range (arith ≈0.25, calc ≈0.18 at T=1), greedy arith still ≈0.99.
    arith_noise: float = 0.15
    guess_noise: float = 0.7
    arith_batch: int = 32
    guess_batch: int = 4  # small batches, many steps: the game is learned sooner
    #: `calc` (tool calls): both copies are learned (question -> call arguments, tool result ->
    #: answer): greedy calc ≈0.5, temperature-1 ≈0.18 (partial credit included), and GRPO lifts
    #: it (0.20 -> 0.42 in 150 steps of `swarm train --task calc`, measured). ≈+75 s of build.
    #: 0 leaves calc out (the model then never calls a tool).
    calc_examples: int = 4000
    calc_noise: float = 0.4
    calc_batch: int = 4  # small batches, many steps: the copies are learned sooner
    #: `calc` is trained through logits multiplied by this (near the scale the calibration
    #: below ends at), so that after calibration its ~30 generated tokens sample about as the
    #: data does: the tool-call format stays well formed, and RL's room is the data's noise
    #: (answers without the tool, miscopied arguments) rather than a format torn apart by a
    #: flattened distribution. 1.0: trained like the others. (0.5: calc samples too flat at
    #: T=1, 0.03; 0.3: not learned in the budget, greedy 0.16.)
    calc_train_scale: float = 0.4
    #: `duet`'s planner (worded sum -> "What is A+B?"): without it neither duet role ever sees a
    #: reward. Trained through scaled logits like calc (its ~9 generated tokens must survive the
    #: calibration's flattening), with `duet_noise` of the plans wrong: the planner then samples a
    #: usable plan part of the time and the executor (arith's format) answers those as in arith.
    duet_examples: int = 2000
    duet_noise: float = 0.5
    duet_batch: int = 8
    duet_train_scale: float = 0.4
    epochs: int = 1
    lr: float = 1e-3
    warmup_frac: float = 0.05
    weight_decay: float = 0.0
    #: After training, all logits are scaled (through the final RMSNorm weight) so that
    #: the expected `arith` reward when sampling at temperature 1 is about this value;
    #: greedy decoding is unchanged. The "knows more than it samples" gap RL closes.
    #: None: no scaling.
    target_arith_reward: float | None = 0.25
    min_logit_scale: float = 0.3
    #: One thread: on 2 shared cores, 2 threads are 2-3x slower under contention.
    threads: int = 1

    def as_dict(self) -> dict:
        return asdict(self)

    def parts(self) -> list[tuple[str, int, float, int, float]]:
        """(task, examples, noise, batch size, logit scale in training) of each task trained on."""
        return [
            ("arith", self.arith_examples, self.arith_noise, self.arith_batch, 1.0),
            ("guess", self.guess_examples, self.guess_noise, self.guess_batch, 1.0),
            ("calc", self.calc_examples, self.calc_noise, self.calc_batch, self.calc_train_scale),
            ("duet", self.duet_examples, self.duet_noise, self.duet_batch, self.duet_train_scale),
        ]


def marker_for(seed: int, config: WarmStartConfig) -> dict:
    """What a finished build of this recipe, `seed` and warm start writes into its marker file."""
    return {"version": BUILD_VERSION, "seed": seed, "vocab_size": VOCAB_SIZE, "warm_start": config.as_dict()}


def is_complete(model_dir: Path, seed: int | None = None) -> bool:
    """True when `model_dir` holds a finished build of this recipe (and `seed`, if given)."""
    marker = read_marker(model_dir)
    if marker is None or marker.get("version") != BUILD_VERSION:
        return False
    return seed is None or marker.get("seed") == seed


def matches(model_dir: Path, seed: int, config: WarmStartConfig | None = None) -> bool:
    """True when `model_dir` is a finished build of exactly this seed and warm start (default: the embedded one)."""
    return read_marker(model_dir) == marker_for(seed, config or WarmStartConfig())
