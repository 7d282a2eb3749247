"""The embedded model: a tiny Qwen2 with its own ChatML tokenizer, warm-started on the built-in tasks.

* `swarm.model.build`: `init_model` (idempotent build + warm start), `build_untrained`
  (seconds, for tests), `build_tokenizer`, `rich_progress`.
* `swarm.model.tokenizer`: the BPE tokenizer and chat template.
* `swarm.model.presets`: real architectures (Qwen2.5-0.5B) with random weights, their real
  tokenizer and chat template: architecture stand-ins (`swarm model init --preset`).
* `swarm.model.warmstart`: the supervised pass and its calibration.
* `swarm.model.evaluate`: score a model directory on the built-in tasks in process
  (`swarm eval --model DIR`); `swarm.model.team_eval` a team run's roles together;
  `swarm.model.eval_cli` the `swarm eval` command.
* `swarm.model.numerics`: the build's pinned CPU numerics (the same weights on any x86-64 host).

Importing this package imports nothing heavy; the modules pull in torch.
"""
