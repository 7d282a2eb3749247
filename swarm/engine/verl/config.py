"""Roost's settings as verl's: `ServerConfig` (with its `TrainConfig`) -> verl's PPO config.

`verl_overrides` is pure (strings out, no verl): the Hydra overrides of verl's
`ppo_trainer.yaml` that say what Roost's fields say. `verl_config` composes them
with verl's own yaml and runs verl's own checks (`verl.utils.config.validate_config`,
the same call `verl.trainer.main_ppo.main` makes, which also builds and validates
the actor's `ActorConfig` dataclass) plus the rollout's `RolloutConfig`.

The mapping, field by field (docs/verl.md, "Config mapping", says why):

| Roost | verl |
|---|---|
| `train.advantage` grpo / rloo / reinforce_pp | `algorithm.adv_estimator` grpo / rloo / reinforce_plus_plus_baseline |
| `train.normalize_std` | `algorithm.norm_adv_by_std_in_grpo` |
| `train.lr`, `weight_decay`, `max_grad_norm` | `actor.optim.lr`, `actor.optim.weight_decay`, `actor.grad_clip` |
| `train.clip_eps`, `clip_eps_high` | `actor.clip_ratio_low`, `actor.clip_ratio_high`; dual clip off (`clip_ratio_c` 1e9: Roost has none) |
| `train.kl_coef` (k3 to the initial model) | `actor.use_kl_loss`, `kl_loss_coef`, `kl_loss_type=low_var_kl` (k3) |
| `train.entropy_coef` | `actor.entropy_coeff` |
| `train.loss_agg` | `actor.loss_agg_mode` (same names) |
| `train.micro_batch_tokens` | `actor.ppo_max_token_len_per_gpu` (dynamic batch size; at least one whole sample) |
| `batch_groups` (B), `group_size` (n) | `data.train_batch_size`, `rollout.n`; `ppo_mini_batch_size = B`: one mini-batch, the whole step's, as Roost |
| `train.ppo_epochs` | `actor.ppo_epochs` (an optimizer step per pass over that one mini-batch) |
| `temperature` / `default_temperature` | `rollout.temperature` (verl recomputes logprobs at one temperature) |
| `max_steps`, `checkpoint_every`, `out_dir`, `seed` | `trainer.total_training_steps`, `save_freq`, `default_local_dir`, `actor.data_loader_seed` |
| `verl.*` | cluster layout, trainer mode, memory split (`swarm.config.verl`) |

Refused with a clear error: `per_episode_norm` (verl has no per-sample loss weight), and an lr
schedule (`lr_warmup_steps`, `lr_decay_steps`: verl's optimizer runs its own scheduler).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm.algorithms.choices import Advantage
from swarm.config.server import ServerConfig

ADV_ESTIMATOR = {
    Advantage.grpo: "grpo",
    Advantage.rloo: "rloo",
    Advantage.reinforce_pp: "reinforce_plus_plus_baseline",
}

ADAPTER_CLASS = "swarm.engine.verl.adapter.SwarmRolloutAdapter"
SLOTS_MODULE = "swarm.engine.verl.slots"
# verl's config defaults "as large as it gets" for an unbounded run (its LR horizon)
UNBOUNDED_STEPS = 1_000_000


class VerlConfigError(ValueError):
    """A Roost setting that verl cannot express, or a config verl's validation refused."""


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def verl_overrides(server: ServerConfig) -> list[str]:
    """Hydra overrides of verl's `ppo_trainer.yaml` that express `server` (pure; no verl needed)."""
    t, v = server.train, server.verl
    if server.per_episode_norm:
        raise VerlConfigError(
            "per_episode_norm has no verl equivalent (verl has no per-sample loss weight); "
            "turn it off for --engine verl"
        )
    if t.lr_warmup_steps or t.lr_decay_steps:
        raise VerlConfigError(
            "lr_warmup_steps / lr_decay_steps are applied by Roost's own step, and verl steps with its own "
            "optimizer and scheduler; leave them 0 for --engine verl"
        )
    if v.rollout_tp > v.nodes * v.gpus_per_node:
        raise VerlConfigError(f"rollout tensor parallel {v.rollout_tp} exceeds the {v.nodes * v.gpus_per_node} GPUs")
    seq_len = v.max_prompt_tokens + v.max_response_tokens
    kl = t.kl_coef > 0
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    o: dict[str, Any] = {
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": v.mode.value,
        "trainer.v1.sampler.max_off_policy_threshold": v.max_off_policy,
        "trainer.nnodes": v.nodes,
        "trainer.n_gpus_per_node": v.gpus_per_node,
        "trainer.total_training_steps": server.max_steps or UNBOUNDED_STEPS,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": server.checkpoint_every or -1,
        "trainer.resume_mode": "auto" if server.resume else "disable",
        "trainer.default_local_dir": str(Path(server.out_dir).absolute() / "verl"),
        "trainer.logger": "[console]",
        "trainer.project_name": "roost",
        "trainer.experiment_name": Path(server.out_dir).name or "swarm",
        "data.custom_cls.path": f"pkg://{SLOTS_MODULE}",
        "data.custom_cls.name": "SlotDataset",
        "data.train_files": "swarm-slots",
        "data.val_files": "swarm-slots",
        "data.shuffle": False,
        "data.dataloader_num_workers": 0,
        "data.train_batch_size": server.batch_groups,
        "data.max_prompt_length": v.max_prompt_tokens,
        "data.max_response_length": v.max_response_tokens,
        "actor_rollout_ref.model.path": str(Path(server.model_dir).absolute()),
        "actor_rollout_ref.model.use_remove_padding": True,
        f"{a}.strategy": v.strategy.value,
        f"{a}.optim.lr": t.lr,
        f"{a}.optim.weight_decay": t.weight_decay,
        f"{a}.grad_clip": t.max_grad_norm,
        f"{a}.clip_ratio": t.clip_eps,
        f"{a}.clip_ratio_low": t.clip_eps,
        f"{a}.clip_ratio_high": t.clip_eps_high if t.clip_eps_high is not None else t.clip_eps,
        f"{a}.clip_ratio_c": 1e9,
        f"{a}.entropy_coeff": t.entropy_coef,
        f"{a}.loss_agg_mode": t.loss_agg.value,
        f"{a}.use_kl_loss": kl,
        f"{a}.kl_loss_coef": t.kl_coef,
        f"{a}.kl_loss_type": "low_var_kl",
        f"{a}.ppo_mini_batch_size": server.batch_groups,
        f"{a}.ppo_epochs": t.ppo_epochs,
        f"{a}.use_dynamic_bsz": True,
        f"{a}.ppo_max_token_len_per_gpu": max(t.micro_batch_tokens, seq_len),
        f"{a}.data_loader_seed": server.seed,
        f"{a}.fsdp_config.param_offload": v.param_offload,
        f"{a}.fsdp_config.optimizer_offload": v.param_offload,
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": max(t.micro_batch_tokens, seq_len),
        f"{r}.name": "vllm",
        f"{r}.mode": "async",
        f"{r}.n": server.group_size,
        f"{r}.temperature": server.temperature if server.temperature is not None else server.default_temperature,
        f"{r}.top_p": 1.0,
        f"{r}.top_k": -1,
        f"{r}.tensor_model_parallel_size": v.rollout_tp,
        f"{r}.gpu_memory_utilization": v.gpu_memory_utilization,
        f"{r}.max_model_len": seq_len,
        f"{r}.calculate_log_probs": True,
        f"{r}.free_cache_engine": True,
        f"{r}.log_prob_max_token_len_per_gpu": max(t.micro_batch_tokens, seq_len),
        f"{r}.checkpoint_engine.backend": "naive",
        "algorithm.adv_estimator": ADV_ESTIMATOR[t.advantage],
        "algorithm.norm_adv_by_std_in_grpo": t.normalize_std,
        "algorithm.use_kl_in_reward": False,
        "transfer_queue.enable": True,
    }
    out = [f"{k}={_fmt(val)}" for k, val in o.items()]
    # keys absent from verl's yaml need Hydra's `+` (docs/verl.md, "Config mapping")
    out.append(f"+{r}.agent.agent_loop_manager_class={ADAPTER_CLASS}")
    return out


def verl_config(server: ServerConfig, extra: list[str] | None = None) -> Any:
    """verl's composed, validated `DictConfig` for `server` (needs verl: `pip install 'roost[verl]'`).

    `extra` overrides go last (a site's cluster tweaks). Raises `VerlConfigError`
    naming verl's complaint when verl's validation refuses the result.
    """
    import verl.trainer.config as verl_config_pkg  # lazy: as above
    from hydra import compose, initialize_config_dir  # lazy: hydra ships with verl, an optional extra
    from hydra.core.global_hydra import GlobalHydra  # lazy: as above

    overrides = verl_overrides(server) + list(extra or [])
    config_dir = str(Path(verl_config_pkg.__file__).parent)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
    except Exception as exc:  # hydra's errors name the bad key; keep that, say where it came from
        raise VerlConfigError(f"verl could not compose the config: {exc}") from exc
    finally:
        GlobalHydra.instance().clear()
    validate(cfg)
    return cfg


def validate(cfg: Any) -> None:
    """Run verl's own validation on `cfg`, as `verl.trainer.main_ppo.main` does before training."""
    from hydra.errors import InstantiationException  # lazy: verl is optional
    from verl.trainer.ppo.utils import need_critic, need_reference_policy  # lazy: as above
    from verl.utils.config import omega_conf_to_dataclass, validate_config  # lazy: as above

    try:
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # RolloutConfig.__post_init__ checks
    except (AssertionError, ValueError, TypeError, InstantiationException) as exc:
        raise VerlConfigError(f"verl's validation refused the config: {exc}") from exc


__all__ = ["ADV_ESTIMATOR", "VerlConfigError", "validate", "verl_config", "verl_overrides"]
