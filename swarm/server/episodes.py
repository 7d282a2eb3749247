"""The episode registry: open and recently closed episodes, and their signed keys.

Pure bookkeeping (no I/O, no engine): the routes call it from the event loop, so
it needs no locks. An episode key is `rk.<episode id>.<epoch>.<hmac>`; the HMAC
of id and epoch under the server secret makes a forged key fail before any
lookup, and the epoch fences leases (leases.py): when a lease expires the epoch
moves on and the episode is handed to the next claim of its task; the old
holder's key raises `StaleLease`.

A closed episode stays findable (the newest `closed_kept` in memory, older ones
through `fallback`, the durable buffer) so that a retried finish gets the answer
stored with it (`Swarm.finish`) instead of an error.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from swarm.samples import Call
from swarm.server.exceptions import EpisodeClosed, EpisodeNotFound, InvalidKey, StaleLease, WrongEpisode

State = Literal["open", "finished", "aborted", "expired"]  # expired: lease lapsed (leases.py)


@dataclass
class Episode:
    id: str
    task_id: str
    task_family: str
    group_id: str
    metadata: dict[str, Any]
    policy_version: int
    created_at: float
    lease_expires_at: float
    epoch: int = 1
    state: State = "open"
    calls: list[Call] = field(default_factory=list)  # its LLM calls so far, recorded by the OpenAI routes
    claim_key: str | None = None
    finish_key: str | None = None
    finish_response: dict | None = None
    finish_body: dict | None = None  # the finish's request less its key: a retry must match it (None: recovered)
    reward: float | None = None
    drift: int = 0  # calls whose re-rendered prompt would have tokenized differently
    # a finish being committed (group commit): retries with its key wait for it, nothing else may act
    finishing: Any = field(default=None, repr=False)


def same_secret(given: str, expected: str | None) -> bool:
    """Constant-time comparison that also copes with non-ASCII input (a header can carry any)."""
    if not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


class KeySigner:
    """HMAC-signed episode keys: `rk.<id>.<epoch>.<sig>`."""

    PREFIX = "rk"

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    def _sig(self, episode_id: str, epoch: int) -> str:
        msg = f"{episode_id}:{epoch}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()[:40]

    def sign(self, episode_id: str, epoch: int) -> str:
        return f"{self.PREFIX}.{episode_id}.{epoch}.{self._sig(episode_id, epoch)}"

    def verify(self, key: str) -> tuple[str, int]:
        """(episode id, epoch) of a genuine key; `InvalidKey` for anything else."""
        parts = key.split(".")
        if len(parts) != 4 or parts[0] != self.PREFIX or not (parts[2].isascii() and parts[2].isdigit()):
            raise InvalidKey()
        episode_id, epoch = parts[1], int(parts[2])
        if not same_secret(parts[3], self._sig(episode_id, epoch)):
            raise InvalidKey()
        return episode_id, epoch


class EpisodeRegistry:
    """Open episodes by id, plus recently closed ones (for idempotent retries)."""

    def __init__(
        self,
        signer: KeySigner,
        lease_seconds: float,
        closed_kept: int = 100_000,
        fallback: Callable[[str], Episode | None] | None = None,
    ) -> None:
        self.signer = signer
        self.lease_seconds = lease_seconds
        self.closed_kept = closed_kept
        self.open: dict[str, Episode] = {}
        self.closed: OrderedDict[str, Episode] = OrderedDict()
        self._by_claim_key: dict[str, str] = {}
        # episodes closed before a restart, looked up in the durable buffer (recovery.py)
        self.fallback = fallback

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def create(
        self,
        episode_id: str,
        task_id: str,
        task_family: str,
        group_id: str,
        metadata: dict[str, Any],
        policy_version: int,
        claim_key: str | None = None,
        epoch: int = 1,
    ) -> Episode:
        """A new open episode; `epoch` > 1 hands over an expired one (same id, its old key fenced)."""
        now = time.time()
        ep = Episode(
            id=episode_id,
            task_id=task_id,
            task_family=task_family,
            group_id=group_id,
            metadata=dict(metadata),
            policy_version=policy_version,
            created_at=now,
            lease_expires_at=now + self.lease_seconds,
            claim_key=claim_key,
            epoch=epoch,
        )
        self.closed.pop(ep.id, None)
        self.open[ep.id] = ep
        if claim_key:
            self._by_claim_key[claim_key] = ep.id
        return ep

    def by_claim_key(self, claim_key: str | None) -> Episode | None:
        """The still-open episode a retried claim already created, if any."""
        if not claim_key or claim_key not in self._by_claim_key:
            return None
        ep = self.open.get(self._by_claim_key[claim_key])
        return ep

    def key_for(self, ep: Episode) -> str:
        return self.signer.sign(ep.id, ep.epoch)

    def get(self, episode_id: str) -> Episode:
        ep = self.open.get(episode_id) or self.closed.get(episode_id)
        if ep is None and self.fallback is not None:
            ep = self.fallback(episode_id)
            if ep is not None:
                self.closed[ep.id] = ep
        if ep is None:
            raise EpisodeNotFound(episode_id)
        return ep

    def authorize(self, key: str, episode_id: str | None = None) -> Episode:
        """The episode a key names; checks signature, path id, existence and epoch."""
        key_id, epoch = self.signer.verify(key)
        if episode_id is not None and key_id != episode_id:
            raise WrongEpisode()
        ep = self.get(key_id)
        if epoch != ep.epoch:
            raise StaleLease()
        return ep

    @staticmethod
    def require_open(ep: Episode) -> None:
        if ep.state != "open":
            raise EpisodeClosed(ep.id, ep.state)
        if ep.finishing is not None:  # its finish is being committed: as good as finished
            raise EpisodeClosed(ep.id, "finished")

    def heartbeat(self, ep: Episode) -> float:
        if ep.finishing is not None:  # being committed: alive, and no sweeper may take it now
            return time.time() + self.lease_seconds
        self.require_open(ep)
        ep.lease_expires_at = time.time() + self.lease_seconds
        return ep.lease_expires_at

    def close(self, ep: Episode, state: State) -> None:
        """Move an open episode to `state` and into the bounded closed list."""
        ep.state = state
        ep.calls = []  # samples were built (or dropped); free the token lists
        self.open.pop(ep.id, None)
        if ep.claim_key:
            self._by_claim_key.pop(ep.claim_key, None)
        self.closed[ep.id] = ep
        while len(self.closed) > self.closed_kept:
            self.closed.popitem(last=False)
