"""What sync and async episodes share (`EpisodeBase`): the claim's identity, the OpenAI endpoint
pointed at the episode and its clients, the bodies of a finish, and the flags a fleet's shutdown reads
(`done`, `lost`, `sealing`, the team's shared `guard`). `Episode` (`_client.py`) and `AsyncEpisode`
(`_async.py`) add the calls. No torch here.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from functools import cached_property, partial
from typing import Any

import httpx

from swarm.client._retry import InvalidReward, SwarmAPIError, amark_stopping, finite
from swarm.protocol import AGENT_HEADER, API_PREFIX, ClaimResponse, FinishResponse
from swarm.tls import tls_context

log = logging.getLogger(__name__)

_UNMATCHED_SAID: set[tuple[str, ...]] = set()


def _numbers(values: Mapping[str, Any] | None, where: str) -> dict[str, float]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise InvalidReward(f"{where} must be a dict of names to numbers, got {values!r}")
    return {k: finite(v, f"{where}[{k!r}]") for k, v in values.items()}


class EpisodeBase:
    """What sync and async episodes share: identity, the OpenAI endpoint, and its clients."""

    def __init__(self, claim: ClaimResponse, timeout: float) -> None:
        self.claim = claim
        self.id = claim.episode_id
        self.base_url = claim.base_url
        self.api_key = claim.api_key
        self.model = claim.model
        self.policy_version = claim.policy_version
        self.group_id = claim.group_id
        self.task_id = claim.task_id
        self.result: FinishResponse | None = None
        self.done = False
        self.lost = False  # gone on the server (lease moved on, server restarted): re-play, don't retry
        #: its finish is under way, its own (`Episode._finish`) or a team's: `abort_open` leaves it to land
        #: (its reward was sent; a team half finished, half given back would be re-played onto servers
        #: that already hold its finished half)
        self.sealing = False
        #: held while deciding to seal or to give back; one lock shared by a team's members
        self.guard = threading.Lock()
        #: the other members of its team (`_team.py`); empty for an ordinary episode
        self.siblings: list[EpisodeBase] = []
        #: Choices the fleet asks the episode's one call to sample (`n`); a workflow that honours it
        #: returns a reward per choice (`run_fleet(..., choices=k)`). 1: an ordinary episode.
        self.choices = 1
        self._timeout = timeout
        self._sync_clients: list[Any] = []
        self._shared_http: httpx.Client | None = None  # set by sync episodes: the SwarmClient's pool
        self._stopping: threading.Event | None = None  # the client's `stopping_event`, set by subclasses

    def _openai_kwargs(self, agent: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        base: dict[str, Any] = {"base_url": self.base_url, "api_key": self.api_key, "timeout": self._timeout}
        if agent:
            base["default_headers"] = {AGENT_HEADER: agent}
        return {**base, **kwargs}

    def openai_client(self, agent: str | None = None, **kwargs: Any) -> Any:
        """A new `openai.OpenAI` for this episode; `agent` tags its calls (multi-agent episodes).

        Extra keyword arguments go to `openai.OpenAI` (e.g. `max_retries`). Closed by `close()`.
        """
        import openai  # lazy: importing openai takes ~0.7 s; only episodes that call the model need it

        kw = self._openai_kwargs(agent, kwargs)
        shared = self._shared_http is not None and "http_client" not in kw
        if shared:
            kw["http_client"] = self._shared_http
        c = openai.OpenAI(**kw)
        if not shared:  # closing an OpenAI client closes its pool: never the shared one
            self._sync_clients.append(c)
        return c

    def async_openai_client(self, agent: str | None = None, **kwargs: Any) -> Any:
        """A new `openai.AsyncOpenAI` for this episode (tagged with `agent` if given)."""
        import openai  # lazy: importing openai takes ~0.7 s; only episodes that call the model need it

        kw = self._openai_kwargs(agent, kwargs)
        if "http_client" not in kw:  # the process's TLS context, not a new one per episode (~20 ms of CPU)
            hooks = None
            if self._stopping is not None:  # its 503 "stopping" reaches the client
                hooks = {"response": [partial(amark_stopping, stopping=self._stopping)]}
            kw["http_client"] = openai.DefaultAsyncHttpxClient(verify=tls_context(), event_hooks=hooks)
        return openai.AsyncOpenAI(**kw)

    @cached_property
    def openai(self) -> Any:
        """`openai.OpenAI` pointed at this episode (built on first use)."""
        return self.openai_client()

    @cached_property
    def async_openai(self) -> Any:
        """`openai.AsyncOpenAI` pointed at this episode (built on first use)."""
        return self.async_openai_client()

    def _path(self, action: str) -> str:
        return f"{API_PREFIX}/episodes/{self.id}/{action}"

    @staticmethod
    def _finish_body(reward: float, metrics: dict[str, float] | None, agent_rewards: dict[str, float] | None) -> dict:
        return {
            "reward": finite(reward, "reward"),
            "metrics": _numbers(metrics, "metrics"),
            "agent_rewards": _numbers(agent_rewards, "agent_rewards") if agent_rewards is not None else None,
            "idempotency_key": uuid.uuid4().hex,
        }

    @staticmethod
    def _choices_body(rewards: Sequence[float], metrics: dict[str, float] | None) -> dict:
        if isinstance(rewards, str | bytes) or not isinstance(rewards, Sequence):
            raise InvalidReward(f"choice rewards must be a list of numbers, one per choice, got {rewards!r}")
        return {
            "choice_rewards": [finite(r, f"choice reward [{i}]") for i, r in enumerate(rewards)],
            "metrics": _numbers(metrics, "metrics"),
            "idempotency_key": uuid.uuid4().hex,
        }

    async def aclose(self) -> None:
        """`close()`, plus the cached `async_openai` client (which needs the event loop)."""
        self.close()
        client = self.__dict__.pop("async_openai", None)
        if client is not None:
            await client.close()

    def _finished(self, data: Any) -> FinishResponse:
        self.result = FinishResponse.model_validate(data)
        self.done = True
        self._untrack()
        unmatched = tuple(self.result.unmatched_agents)
        if unmatched and unmatched not in _UNMATCHED_SAID:  # once per process and set of tags: fleets repeat it
            _UNMATCHED_SAID.add(unmatched)
            log.warning(
                "episode %s: agent_rewards for %s applied to nothing: no call of the episode carried that "
                "agent tag (a typo, or an agent that did not act); said once",
                self.id,
                ", ".join(map(repr, unmatched)),
            )
        return self.result

    def _untrack(self) -> None:
        """Stop heartbeats for this episode (finished, aborted, lost or closed)."""
        beats = getattr(getattr(self, "_client", None), "_heartbeats", None)
        if beats is not None:
            beats.remove(self)

    def _gone(self, exc: SwarmAPIError) -> None:
        if exc.status_code in (404, 409):
            self.lost = True
            self._untrack()

    def close(self) -> None:
        self._untrack()
        for c in self._sync_clients:
            try:
                c.close()
            except Exception:
                pass
        self._sync_clients.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, task_id={self.task_id!r}, policy_version={self.policy_version})"
