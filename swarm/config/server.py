"""`ServerConfig`: every knob of a swarm server, with help text, in one pydantic model.

This is the one definition of the server's settings: `swarm serve`'s options are
derived from these fields (swarm/config/options.py), `swarm serve --config FILE` reads
them from YAML/JSON, every run writes the settings it used to `OUT/config.yaml`,
`swarm train` nests this model in its `RunConfig`, and the researcher's knobs are
its fields. Training knobs live in `train` (the engine's `TrainConfig`,
live-editable on a running server).
"""

from __future__ import annotations

import secrets
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from store.paths import data_dir, default_model_dir
from swarm.algorithms.choices import DistillMode
from swarm.config.lora import LoraSettings
from swarm.config.options import Flag, errors_line
from swarm.config.policies import PolicySpec
from swarm.config.quotas import QuotaPhase, check_quotas, check_schedule
from swarm.config.train import TrainConfig
from swarm.config.verl import VerlSettings
from swarm.config.vllm import LORA_RANKS, VllmSettings


def _default_model_dir() -> Path:
    return default_model_dir()


def _default_out_dir() -> Path:
    return data_dir() / "runs" / "serve"


class EngineName(StrEnum):
    torch = "torch"
    fake = "fake"
    vllm = "vllm"
    verl = "verl"


class Continuity(StrEnum):
    exact = "exact"
    retokenize = "retokenize"


class ToolParserName(StrEnum):
    hermes = "hermes"
    json = "json"
    pythonic = "pythonic"


class FailedGroupPolicy(StrEnum):
    drop = "drop"
    keep = "keep"


class StalledGroupPolicy(StrEnum):
    """What a stalled group (leases.py) becomes: trained with the members it has, or dropped whole."""

    partial = "partial"
    drop = "drop"


class ServerConfig(BaseModel):
    """A swarm server: which model, how episodes become batches, where state goes."""

    model_config = ConfigDict(extra="forbid")
    cli_panel: ClassVar[str] = "server"  # the --help panel of its fields (swarm/config/options.py)

    host: Annotated[str, Flag(studied=False)] = Field(
        "127.0.0.1", description="bind address; loopback unless told otherwise"
    )
    port: Annotated[int, Flag(studied=False)] = Field(
        8000, ge=0, le=65535, description="0 picks a free port (printed at start)"
    )
    ssl_certfile: Annotated[Path | None, Flag(studied=False, default_text="none: plain HTTP")] = Field(
        None, description="PEM certificate (chain): serve HTTPS, with --ssl-keyfile"
    )
    ssl_keyfile: Annotated[Path | None, Flag(studied=False, default_text="none")] = Field(
        None, description="PEM private key of --ssl-certfile"
    )
    public_url: Annotated[str | None, Flag(studied=False, default_text="the URL the claim came in on")] = Field(
        None, description="URL clients reach this server by (behind a proxy)"
    )
    model_dir: Annotated[
        Path, Flag(name="--model", knob="model", default_text="the embedded model (ROOST_HOME/models/tiny-qwen2)")
    ] = Field(default_factory=_default_model_dir, description="Hugging Face causal-LM directory")
    model_name: Annotated[str | None, Flag(studied=False, default_text="the model dir's name")] = Field(
        None, description="name served on /v1/models"
    )
    engine: EngineName = Field(
        EngineName.torch,
        description="generation/training engine (fake: random tokens through the model's tokenizer, "
        "no weights run, no learning; for tests and benchmarks)",
    )
    device: Annotated[str | None, Flag(studied=False, default_text="cuda if available, else cpu")] = Field(
        None, description="torch device"
    )
    seed: Annotated[int, Flag(studied=False)] = Field(
        0, description="seed of sampling and training (and of `swarm train`'s datasets)"
    )
    deterministic: Annotated[bool, Flag(studied=False)] = Field(
        False,
        description="the same config and seed give the same run: calls seeded by their place, steps in "
        "lockstep, batches in dataset order; slower (docs/researcher-statistics.md)",
    )

    group_size: Annotated[int, Flag(short="-n", study=(2, 64), panel="training")] = Field(
        8, ge=1, description="n: episodes per task_id in a group (GRPO baseline)"
    )
    batch_groups: Annotated[int, Flag(short="-B", study=(1, 64), panel="training")] = Field(
        4, ge=1, description="B: complete groups per optimisation step"
    )
    max_steps: Annotated[int | None, Flag(studied=False)] = Field(
        None, ge=1, description="stop the server after this many steps"
    )
    checkpoint_every: Annotated[int, Flag(studied=False)] = Field(
        10, ge=0, description="k: checkpoint every k steps (0: never)"
    )
    checkpoint_on_stop: Annotated[bool, Flag(studied=False)] = Field(
        True, description="write a last checkpoint when stopping"
    )
    keep_checkpoints: Annotated[int | None, Flag(studied=False)] = Field(
        None, ge=1, description="keep only the newest N checkpoints"
    )
    out_dir: Annotated[Path, Flag(name="--out", studied=False, default_text="ROOST_HOME/runs/serve")] = Field(
        default_factory=_default_out_dir, description="metrics, checkpoints, rollouts, config.yaml"
    )
    resume: Annotated[bool, Flag(studied=False)] = Field(
        True,
        description="resume from out_dir/checkpoints/latest when present (`swarm serve --no-resume` refuses "
        "a folder that holds a trained run: give a fresh --out)",
    )

    token: Annotated[str | None, Flag(envvar="ROOST_TOKEN", studied=False, default_text="generated and printed")] = (
        Field(None, description="worker token (Bearer) for claims and status")
    )
    admin_token: Annotated[
        str | None, Flag(envvar="ROOST_ADMIN_TOKEN", studied=False, default_text="generated and printed")
    ] = Field(None, description="admin token for /swarm/v1/admin/*")
    secret: Annotated[
        str | None, Flag(envvar="ROOST_SECRET", studied=False, default_text="generated, kept in OUT/secrets.json")
    ] = Field(None, description="HMAC secret of episode keys")

    train: TrainConfig = Field(default_factory=TrainConfig)
    teacher: Annotated[str | None, Flag(studied=False, panel="training")] = Field(
        None,
        description="distil from this teacher: a model directory or run folder, or the URL of an "
        "OpenAI-compatible server returning prompt logprobs; the student's tokenizer (docs/distillation.md)",
    )
    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description="a LoRA adapter over the frozen base (torch engine; rank 0: full fine-tuning)",
    )
    verl: VerlSettings = Field(
        default_factory=VerlSettings, description="the verl engine's cluster layout (--engine verl)"
    )
    vllm: VllmSettings = Field(
        default_factory=VllmSettings, description="the vllm engine's server process (--engine vllm)"
    )
    merge: Annotated[bool, Flag(knob="timeline_merge")] = Field(
        True, description="merge an episode's prefix-sharing calls into one sample"
    )
    per_episode_norm: bool = Field(False, description="an episode's samples share a total loss weight of 1")
    continuity: Continuity = Field(
        Continuity.exact, description="exact: reuse generated ids in later prompts; retokenize: render afresh"
    )
    temperature: Annotated[float | None, Flag(default_text="the workflow's")] = Field(
        None, ge=0.0, le=2.0, description="force this sampling temperature on every call"
    )
    default_temperature: float = Field(
        1.0, ge=0.0, le=2.0, description="sampling temperature of a call that names none"
    )
    quotas: dict[str, float] | None = Field(
        None,
        description="share of the B groups of a batch per task family, e.g. {math: 0.4, code: 0.6}; "
        "unnamed families share `other` (see swarm/server/quotas.py)",
    )
    quota_schedule: list[QuotaPhase] | None = Field(
        None, description="quotas over steps: [{from_step: 0, quotas: {...}}, {from_step: 50, ...}]"
    )
    log_rollouts: Annotated[bool, Flag(studied=False)] = Field(
        True, description="append finished episodes to out_dir/rollouts.jsonl"
    )
    mlflow: Annotated[bool, Flag(studied=False)] = Field(
        False, description="also log params, per-step metrics and checkpoints to MLflow"
    )
    mlflow_experiment: Annotated[str, Flag(studied=False)] = Field("swarm", description="MLflow experiment name")
    mlflow_run_name: Annotated[str | None, Flag(studied=False)] = Field(
        None, description="MLflow run name; default: the out_dir name"
    )
    mlflow_parent_run_id: Annotated[str | None, Flag(name="--mlflow-parent", studied=False)] = Field(
        None, description="nest the run under this one (a study)"
    )

    default_max_tokens: Annotated[int, Flag(name="--max-tokens")] = Field(
        256, ge=1, description="when a request names no max_tokens"
    )
    max_tokens_limit: Annotated[int, Flag(studied=False)] = Field(
        4096, ge=1, description="largest max_tokens a request may ask"
    )
    max_body_bytes: Annotated[int, Flag(studied=False)] = Field(
        8 << 20, ge=1024, description="larger request bodies get 413"
    )
    max_prompt_chars: Annotated[int, Flag(studied=False)] = Field(
        1_000_000,
        ge=1,
        description="longer prompts (characters of messages and tools) get 400 "
        "prompt_too_long before rendering; a shorter one whose bytes / the "
        "longest token already reach the context gets 400 "
        "context_length_exceeded untokenized, and the rest are tokenized, over "
        "128k characters one at a time (docs/server-control.md)",
    )
    tool_parser: Annotated[ToolParserName, Flag(studied=False)] = Field(
        ToolParserName.hermes,
        description="how tool calls are parsed out of generated text: hermes (Qwen2.5, "
        "the embedded model), json (Llama-3.1 style), pythonic ([f(a=1)])",
    )
    served_model_names: list[str] | None = Field(
        None,
        description="names a request's `model` may use (--served-model-name, repeatable); "
        "default: the served model name; others get 404 model_not_found",
    )
    policies: list[PolicySpec] | None = Field(
        None,
        description="several named LoRA policies on this one base (--policy NAME, repeatable; a config "
        "file's `policies:` list gives each its own settings); requests pick one by `model`",
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        description="episode lease: the SDK heartbeats every third of it, so a dead or frozen "
        "client is detected within it; an agent without the SDK must call or heartbeat this often",
    )
    retry_after_s: Annotated[float, Flag(studied=False)] = Field(1.0, gt=0, description="Retry-After sent with 429s")
    stop_grace_s: Annotated[float, Flag(studied=False)] = Field(
        1.0,
        ge=0,
        description="when stopping, let episodes in flight finish this long (new claims and "
        "calls get 503 'stopping'), then take the last checkpoint and exit",
    )
    closed_episodes_kept: Annotated[int, Flag(studied=False)] = Field(
        100_000, ge=1, description="finished ids kept for idempotency"
    )
    # robustness (leases.py, recovery.py): what survives dead clients, hung engines and kill -9
    group_stall_s: Annotated[float | None, Flag(zero_is_none=True)] = Field(
        60.0,
        gt=0,
        description="bound on how long one group may hold up training: a group without progress "
        "(no claim, no finish) for this long, with free slots nobody plays or while the "
        "rest of a full window waits on it, is resolved by stalled_group_policy; its "
        "open episodes are fenced (409). None: wait forever",
    )
    stalled_group_policy: Annotated[StalledGroupPolicy, Flag(studied=False)] = Field(
        StalledGroupPolicy.partial,
        description="a stalled group: partial = train the members that finished; "
        "drop = train none of it (its slot in the batch stays empty)",
    )
    durable_buffer: Annotated[bool, Flag(name="--durable", off="--no-durable")] = Field(
        True,
        description="persist each finished episode (out_dir/buffer.sqlite, "
        "WAL, synchronous=FULL) before acknowledging it",
    )
    quota_borrow_s: Annotated[float | None, Flag(zero_is_none=True)] = Field(
        30.0,
        gt=0,
        description="once a window is this old, a family over its quota may take a slot another "
        "family left unclaimed (a dead fleet cannot stall training); None: never",
    )
    compact_buffer: bool = Field(
        True,
        description="after each checkpoint, drop the token ids of buffered "
        "rows no restart can replay (keeps the buffer bounded)",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="k: a sample is trained by a policy at most k versions newer than the one that "
        "generated it. 0: on-policy. k >= 1: episodes are played while a step trains (lag <= 1), "
        "corrected by the PPO ratio; one over k is dropped and counted (dropped_stale)",
    )
    claims_during_step: Annotated[bool, Flag(name="--claims-during-step", off="--no-claims-during-step")] = Field(
        True,
        description="on-policy (k = 0): the next window's episodes are claimed while a step trains and "
        "their model calls wait for the new weights (lag stays 0; a step's calls reach the engine "
        "together). Off: claims get 429 `training` until the step ends (for agents whose model "
        "calls time out sooner than a step takes)",
    )
    replay_staleness: Annotated[int | None, Flag(studied=False, default_text="every acknowledged episode")] = Field(
        None,
        ge=0,
        description="after a restart, episodes acknowledged before it may be this many versions from "
        "the policy that trains them (PPO ratio); None: as far as the replay needs, so none is "
        "dropped as stale",
    )
    failed_group_policy: FailedGroupPolicy = Field(
        FailedGroupPolicy.drop,
        description="a group with a failed episode: drop it, or keep training the rest (>= 2 left)",
    )
    generate_timeout_s: Annotated[float | None, Flag(zero_is_none=True)] = Field(
        300.0, gt=0, description="an engine call running longer gets a 504 JSON error; None: no limit"
    )

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return None if value is None else check_quotas(value)

    @field_validator("quota_schedule")
    @classmethod
    def _schedule(cls, value: list[QuotaPhase] | None) -> list[QuotaPhase] | None:
        return None if value is None else check_schedule(value)

    @model_validator(mode="after")
    def _lora_engine(self) -> ServerConfig:
        if self.lora.enabled and self.engine == EngineName.verl:
            raise ValueError(
                "--lora-rank: LoRA runs in the torch and vllm engines, not --engine verl "
                "(export a merged model with `swarm model export --merge` to serve it elsewhere)"
            )
        if self.lora.enabled and self.engine == EngineName.vllm and self.lora.rank > LORA_RANKS[-1]:
            raise ValueError(f"--lora-rank {self.lora.rank}: vLLM serves adapters of rank at most {LORA_RANKS[-1]}")
        return self

    @model_validator(mode="after")
    def _policies(self) -> ServerConfig:
        if not self.policies:
            return self
        names = [p.name for p in self.policies]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"policies: {', '.join(twice)} named more than once")
        if self.engine not in (EngineName.torch, EngineName.vllm, EngineName.fake):
            raise ValueError(
                "policies: several policies on one base run in the torch and vllm engines, "
                f"not --engine {self.engine.value}"
            )
        full = [p.name for p in self.policies if not self.policy_lora(p).enabled]
        if full and self.engine in (EngineName.torch, EngineName.vllm):
            raise ValueError(
                f"policies {', '.join(full)}: policies that share a base train LoRA adapters, and a "
                "full-parameter policy would change the base under the others; give --lora-rank r > 0 "
                "(or a `lora:` per policy), or serve a full-parameter policy on a server of its own"
            )
        if self.engine == EngineName.vllm:  # each vLLM process (replica) serves every policy's adapters
            wide = [p.name for p in self.policies if self.policy_lora(p).rank > LORA_RANKS[-1]]
            if wide:
                raise ValueError(f"policies {', '.join(wide)}: vLLM serves adapters of rank at most {LORA_RANKS[-1]}")
        for p in self.policies:
            try:
                TrainConfig(**{**self.train.model_dump(), **p.train})
            except ValidationError as exc:  # one line: the knob and what is wrong with it
                raise ValueError(f"policy {p.name}: {errors_line(exc.errors())}") from None
        return self

    def policy_lora(self, spec: PolicySpec) -> LoraSettings:
        """A policy's LoRA settings: the server's, with the fields its `lora` gives. Whole, they replaced
        the server's: `lora_alpha=32` alone was a rank-0 (full-parameter) policy, refused as such."""
        if spec.lora is None:
            return self.lora
        return LoraSettings(**{**self.lora.model_dump(), **spec.lora.model_dump(exclude_unset=True)})

    def for_policy(self, spec: PolicySpec) -> ServerConfig:
        """The config of one policy's own `Swarm`: the server's, with the spec's differences, its name
        as the model name and its own out folder (`OUT/policies/NAME`: buffer, checkpoints, metrics)."""
        given = {
            k: v
            for k in ("group_size", "batch_groups", "max_staleness", "max_steps", "temperature", "seed")
            if (v := getattr(spec, k)) is not None
        }
        run = self.mlflow_run_name
        return self.model_copy(
            update={
                **given,
                "policies": None,
                "model_name": spec.name,
                "served_model_names": None,
                "out_dir": Path(self.out_dir) / "policies" / spec.name,
                "lora": self.policy_lora(spec),
                "train": TrainConfig(**{**self.train.model_dump(), **spec.train}),
                "mlflow_run_name": f"{run}-{spec.name}" if run else spec.name,
            }
        )

    @model_validator(mode="after")
    def _distillation(self) -> ServerConfig:
        """A teacher without a coefficient (or the reverse) would silently do nothing: refused."""
        if self.teacher and not self.train.distill_coef:
            raise ValueError("--teacher: give --distill-coef > 0 (the weight of the teacher's per-token advantage)")
        if self.train.distill_coef and not self.teacher:
            raise ValueError("--distill-coef: give --teacher MODEL_DIR_OR_URL to distill from")
        if not self.train.reward_coef and not self.teacher:
            raise ValueError("--reward-coef 0 trains nothing without --teacher")
        if (self.teacher or self.train.reward_coef != 1.0) and self.engine == EngineName.verl:
            raise ValueError(
                "--teacher/--reward-coef: distillation runs in the torch and vllm engines, not --engine verl"
            )
        url_teacher = (self.teacher or "").startswith(("http://", "https://"))  # no logits: one logprob a token
        if self.train.distill_mode == DistillMode.full and url_teacher:
            raise ValueError(
                "--distill-mode full reads the teacher's logits in the step: give a local teacher (a model "
                "directory or run), or --distill-mode sampled for a URL"
            )
        if self.train.teacher_temperature != 1.0 and url_teacher:
            raise ValueError(
                "--teacher-temperature rescales the teacher's logits: give a local teacher (a model directory or "
                "run folder); a URL teacher returns one logprob per token, which no temperature can be applied to"
            )
        if self.train.teacher_temperature != 1.0 and not self.teacher:
            raise ValueError("--teacher-temperature: give --teacher MODEL_DIR to distill from")
        if self.train.distill_mode != DistillMode.sampled and not self.teacher:  # accepted in silence before
            mode = self.train.distill_mode.value
            raise ValueError(f"--distill-mode {mode}: give --teacher MODEL_DIR to distill from")
        if self.teacher and self.policies:
            raise ValueError("--teacher: a server of several policies cannot distill yet; serve the student alone")
        return self

    @model_validator(mode="after")
    def _lockstep(self) -> ServerConfig:
        """Deterministic runs are on-policy in lockstep: a claim during a step would let timing decide which
        weights its first tokens see, so claims wait for the step (`claims_during_step` off)."""
        if not self.deterministic:
            return self
        if self.max_staleness:
            raise ValueError("--deterministic runs on-policy in lockstep: not with --max-staleness > 0")
        self.claims_during_step = False  # (a run's defaults set it on: overriding it here is the rule, not an error)
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            given, missing = (
                ("--ssl-certfile", "--ssl-keyfile") if self.ssl_keyfile is None else ("--ssl-keyfile", "--ssl-certfile")
            )
            raise ValueError(f"{given} needs {missing}: HTTPS takes the certificate and its key")
        return self

    @property
    def tls(self) -> bool:
        """Whether the server answers HTTPS (`ssl_certfile` and `ssl_keyfile`)."""
        return self.ssl_certfile is not None

    @model_validator(mode="after")
    def _one_quota_source(self) -> ServerConfig:
        if self.quotas is not None and self.quota_schedule is not None:
            raise ValueError("give quotas or quota_schedule, not both")
        return self

    def with_secrets(self) -> ServerConfig:
        """A copy with every missing token/secret generated (printed once by `serve`)."""
        return self.model_copy(
            update={
                "token": self.token or "swt-" + secrets.token_urlsafe(24),
                "admin_token": self.admin_token or "swa-" + secrets.token_urlsafe(24),
                "secret": self.secret or secrets.token_hex(32),
            }
        )

    @property
    def wants_gpu(self) -> bool:
        """Whether this server's engine will put a model on a CUDA device (checked before it starts)."""
        return bool(self.device and self.device.startswith("cuda") and self.engine in ("torch", "vllm"))

    @property
    def served_model_name(self) -> str:
        first = self.served_model_names[0] if self.served_model_names else None
        return self.model_name or first or Path(self.model_dir).name or "roost"

    @property
    def model_aliases(self) -> frozenset[str]:
        """Every `model` a request may name."""
        return frozenset([self.served_model_name, *(self.served_model_names or ())])
