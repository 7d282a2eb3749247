"""The swarm wire protocol: request and response bodies of `/swarm/v1/*`.

Shared by the server (validation, OpenAPI spec) and the client SDK (parsing), so
it imports nothing heavier than pydantic: a client machine needs no torch.
docs/design.md ("Routes") sketches the routes; these models are the truth.

    POST /swarm/v1/episodes                  ClaimRequest   -> ClaimResponse   (worker token)
    POST /swarm/v1/episodes/{id}/heartbeat   -              -> HeartbeatResponse (episode key)
    POST /swarm/v1/episodes/{id}/finish      FinishRequest  -> FinishResponse  (episode key)
    POST /swarm/v1/episodes/{id}/abort       AbortRequest   -> AbortResponse   (episode key)
    POST /swarm/v1/claims                    ClaimBatch     -> BatchResponse   (worker token)
    POST /swarm/v1/finishes                  FinishBatch    -> BatchResponse   (worker token + each key)
    GET  /swarm/v1/status                    -              -> StatusResponse  (worker token)
    POST /swarm/v1/admin/stop|checkpoint     -              -> AdminResponse   (admin token)

Every 4xx/5xx body is an `ErrorResponse`: `{"error": {"message", "type", "code"}}`.
A claim refused for flow control is a 429 with a `Retry-After` header; a server
that is shutting down answers 503 with code `"stopping"`.

The two batch routes carry what concurrent episodes of one client send at the same
moment (the SDK coalesces them): one request, one group commit. Each item is judged
on its own (validated, authorized by its episode key, fenced by its epoch) and
answered by a `BatchResult` holding the status and body its single route would have
sent, so a batch never turns one item's error into another's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

#: Rewards beyond this magnitude are refused: almost surely a bug in the workflow,
#: and one such value would swamp a whole batch's advantages.
REWARD_ABS_MAX = 1e6
API_PREFIX = "/swarm/v1"
AGENT_HEADER = "X-Roost-Agent"

#: Numbers on the wire are JSON numbers: "0.5" (a string) or true is a client bug, refused with 400
#: `invalid_request` rather than coerced. An integer is a valid `Number`; a float is not a `Count`.
Number = Annotated[float, Strict()]
Count = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]


class _Request(BaseModel):
    # Unknown fields are ignored (newer clients, older servers); NaN/inf never pass.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- errors -----------------------------------------------------------------------


class ErrorDetail(_Response):
    message: str
    type: str
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorDetail


# -- episodes ---------------------------------------------------------------------


class ClaimRequest(_Request):
    task_id: str = Field(min_length=1, max_length=512, description="groups episodes for baselines")
    task_family: str = Field("default", min_length=1, max_length=128)
    roles: list[str] | None = Field(
        None,
        max_length=64,
        description="the roles this episode plays (a team's member claims with its own); kept in the "
        "episode's metadata as `roles`, beside what `metadata` says",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    claim_key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="idempotency key: a retried claim with the same key gets the same episode",
    )
    wait_s: Number = Field(
        0.0,
        ge=0.0,
        le=30.0,
        description="long poll: wait up to this long for admission before answering 429",
    )
    policy: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="which policy of a server of several plays this episode (default: the first); "
        "an unknown one is 404 model_not_found",
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="the OpenAI name for the same thing: `policy`, as the claim's answer and the episode's "
        "calls spell it",
    )

    @model_validator(mode="after")
    def _one_policy(self) -> ClaimRequest:
        # A claim answers `model`, so clients send it back: silently ignoring it played the default policy.
        if self.model is not None:
            if self.policy is not None and self.policy != self.model:
                raise ValueError(f"policy {self.policy!r} and model {self.model!r} name different policies")
            self.policy = self.model
        return self

    def recorded_metadata(self) -> dict[str, Any]:
        """What the episode keeps: `metadata`, with `roles` added when claimed with them (what the
        client's own metadata says of its roles wins)."""
        if self.roles is None or "roles" in self.metadata:
            return self.metadata
        return {**self.metadata, "roles": list(self.roles)}


class ClaimResponse(_Response):
    episode_id: str
    base_url: str = Field(description="OpenAI-compatible base URL for this episode's calls")
    api_key: str = Field(description="server-signed episode key; the Bearer token of its calls")
    lease_expires_at: float
    lease_seconds: float | None = Field(
        None, description="lease length: heartbeats (or the episode's own calls) must come more often"
    )
    policy_version: int
    model: str
    group_id: str
    task_id: str


class HeartbeatResponse(_Response):
    episode_id: str
    lease_expires_at: float


#: Most choices one call may be scored for (the OpenAI routes' bound on `n`).
MAX_CHOICES = 128


class FinishRequest(_Request):
    #: Required unless `choice_rewards` is given (then it defaults to their mean, for the metrics).
    reward: Number | None = Field(None, ge=-REWARD_ABS_MAX, le=REWARD_ABS_MAX)
    agent_rewards: dict[str, Number] | None = Field(
        None, description="per-agent-tag rewards overriding `reward` for those agents"
    )
    #: A group sampled in one call: the episode made one chat call with `n` choices and scores
    #: each. Each choice trains as its own sample with its own reward, and the choices are
    #: the GRPO group (the server's group size is then 1 episode): one HTTP call per group.
    choice_rewards: list[Number] | None = Field(
        None,
        min_length=1,
        max_length=MAX_CHOICES,
        description="rewards of the choices of the episode's one call, in choice order",
    )
    status: Literal["completed", "truncated", "failed"] = "completed"
    metrics: dict[str, Number] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)

    @field_validator("agent_rewards")
    @classmethod
    def _bounded(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for agent, r in (value or {}).items():
            if abs(r) > REWARD_ABS_MAX:
                raise ValueError(f"agent reward for {agent!r} is out of range")
        return value

    @field_validator("choice_rewards")
    @classmethod
    def _choices_bounded(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(not abs(r) <= REWARD_ABS_MAX for r in value):
            raise ValueError("a choice reward is out of range")
        return value

    @model_validator(mode="after")
    def _a_reward(self) -> FinishRequest:
        if self.choice_rewards is not None:
            if self.agent_rewards:
                raise ValueError("choice_rewards and agent_rewards do not go together")
            if self.reward is None:
                self.reward = sum(self.choice_rewards) / len(self.choice_rewards)
        elif self.reward is None:
            raise ValueError("reward is required (or choice_rewards, one per choice of a call with n choices)")
        return self


class FinishResponse(_Response):
    episode_id: str
    status: Literal["finished"] = "finished"
    reward: float
    samples: int
    calls: int
    group_id: str
    policy_version: int
    step: int
    #: `agent_rewards` tags no call of the episode carried: they applied to nothing (a typo, or an agent
    #: that did not act this time; not an error, which would lose the episode's samples)
    unmatched_agents: list[str] = Field(default_factory=list)


class AbortRequest(_Request):
    reason: str | None = Field(None, max_length=2000)
    release: Bool = Field(
        True,
        description="free the slot so another claim of this task may take it; "
        "false gives the slot up for this round (its group completes smaller)",
    )


class AbortResponse(_Response):
    episode_id: str
    status: Literal["aborted"] = "aborted"


# -- batches ----------------------------------------------------------------------

#: Most items in one batch request (the SDK sends at most this many).
MAX_BATCH = 256


class ClaimBatch(_Request):
    claims: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_BATCH, description="`ClaimRequest` bodies, each validated on its own"
    )


class FinishBatch(_Request):
    finishes: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="`FinishRequest` bodies plus `episode_id` and `api_key` (the episode's key)",
    )


class BatchResult(_Response):
    status: int = Field(description="the HTTP status this item's single route would have answered")
    body: dict[str, Any] = Field(description="that route's body: the response, or an `ErrorResponse`")
    retry_after: int | None = Field(None, description="its Retry-After header, if any")


class BatchResponse(_Response):
    results: list[BatchResult] = Field(description="one per item, in order")


# -- status and admin -------------------------------------------------------------


class GroupStatus(_Response):
    group_id: str
    task_id: str
    claimed: int
    finished: int
    dropped: int


class StatusResponse(_Response):
    model: str
    step: int
    policy_version: int
    group_size: int
    batch_groups: int
    training: bool
    stopping: bool
    open_episodes: int
    buffered_groups: int = Field(description="complete groups waiting for the batch")
    groups: list[GroupStatus]
    counters: dict[str, int]
    last_checkpoint: str | None = None
    max_steps: int | None = None
    policies: list[str] | None = Field(None, description="every policy of a server of several (`?policy=NAME`)")


class AdminResponse(_Response):
    ok: bool = True
    message: str = ""
    path: str | None = None
    step: int | None = None


__all__ = [
    "API_PREFIX",
    "AGENT_HEADER",
    "REWARD_ABS_MAX",
    "AbortRequest",
    "AbortResponse",
    "AdminResponse",
    "BatchResponse",
    "BatchResult",
    "Bool",
    "ClaimBatch",
    "ClaimRequest",
    "ClaimResponse",
    "Count",
    "ErrorDetail",
    "ErrorResponse",
    "FinishBatch",
    "FinishRequest",
    "FinishResponse",
    "GroupStatus",
    "HeartbeatResponse",
    "MAX_BATCH",
    "Number",
    "StatusResponse",
]
