"""Team episodes: one workflow, several swarm servers, one role (one trainable model) each.

    team = TeamClient({"planner": SwarmClient(url1, tok1), "executor": SwarmClient(url2, tok2)})
    with team.episode(task_id="duet-0-3", task_family="duet") as t:
        plan = t["planner"].openai.chat.completions.create(model=t["planner"].model, messages=[...])
        answer = t["executor"].openai.chat.completions.create(model=t["executor"].model, messages=[...])
        t.finish({"planner": 1.0, "executor": 0.5})      # or t.finish(1.0): one reward for every role

Each server sees an ordinary episode (claimed with `roles=[role]` and the team id
in its metadata), records only the calls made through its own role's endpoint
and trains its own model on them. The team is finished or aborted together:

* an exception in the block, or leaving it without `finish`, aborts every member;
* a claim refused on one server aborts the members already claimed;
* `finish` validates all rewards before sending any, and finishes nothing when a
  member is already gone (its lease lapsed, a fleet's Ctrl-C gave it back):
  every member is given back and the team plays again (`TeamLost`);
* when finishing one member fails, the members not yet finished are aborted without
  their slots (those already finished stay finished: a server cannot un-train a sealed
  episode) and `TeamError` says which. Such a team is not played again
  (`replayable` is False), nor one with a member finished by hand (`t["planner"].finish(...)`):
  a replay would add a surplus copy of the task on the servers that hold its finished
  half, a group nobody else fills; its other members give their slots up.

A fleet's Ctrl-C (`abort_open`) gives each team back whole or leaves it to finish:
the members share one lock (`Episode.guard`), and a team that began finishing is
`sealing`, as is a member whose own finish is in flight (`Episode._finish`): it is left to
land. A member it gives back whose teammate was (or is being) finished by hand gives up its
slot (`release=False`), by the rule of `replayable`.

No torch here, like the rest of the client.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from swarm.client._client import Episode, SwarmClient
from swarm.client._retry import SwarmError
from swarm.protocol import FinishResponse


class TeamError(SwarmError):
    """A team operation failed on some members; the rest were aborted where possible."""

    def __init__(
        self,
        message: str,
        errors: Mapping[str, BaseException],
        finished: list[str] | None = None,
        aborted: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.errors = dict(errors)
        self.finished = list(finished or [])
        self.aborted = list(aborted or [])


class TeamLost(TeamError):
    """A member was gone before the team finished: nothing was finished, every member was given back."""


class TeamEpisode:
    """The members of one team episode by role: `t["planner"]` is an ordinary `Episode`."""

    def __init__(self, team_id: str, episodes: dict[str, Episode]) -> None:
        self.id = team_id
        self.episodes = episodes
        self.results: dict[str, FinishResponse] = {}
        self.choices = 1  # what a fleet sets on an episode: a team's members make ordinary calls
        guard = threading.Lock()
        for ep in episodes.values():
            ep.guard = guard  # `abort_open` on any member's client sees the team's one decision
            ep.siblings = [other for other in episodes.values() if other is not ep]

    # -- what `run_fleet` reads of an episode, so a fleet plays teams as it plays episodes --------------
    @property
    def policy_version(self) -> int:
        return min(ep.policy_version for ep in self.episodes.values())

    @property
    def lost(self) -> bool:
        return any(ep.lost for ep in self.episodes.values())

    @property
    def replayable(self) -> bool:
        """False once some member finished (through `finish`, or by hand: `t["planner"].finish(...)`):
        playing the team again would overfill that member's group."""
        return all(ep.result is None for ep in self.episodes.values())

    @property
    def result(self) -> FinishResponse | None:
        """After `finish`: the first member's answer with the team's mean reward (the fleet's statistic)."""
        if len(self.results) < len(self.episodes):
            return None
        first = next(iter(self.results.values()))
        mean = sum(r.reward for r in self.results.values()) / len(self.results)
        return first.model_copy(update={"reward": mean})

    def _abort_quietly(self, reason: str, release: bool = True) -> None:
        self._abort_rest(reason, release)

    @property
    def roles(self) -> list[str]:
        return list(self.episodes)

    @property
    def done(self) -> bool:
        return all(ep.done for ep in self.episodes.values())

    def __getitem__(self, role: str) -> Episode:
        try:
            return self.episodes[role]
        except KeyError:
            raise KeyError(f"no role {role!r} in this team; roles: {', '.join(self.episodes)}") from None

    def __contains__(self, role: object) -> bool:
        return role in self.episodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.episodes)

    def items(self) -> Any:
        return self.episodes.items()

    def _rewards(self, reward: float | Mapping[str, float]) -> dict[str, float]:
        if isinstance(reward, Mapping):
            missing = [r for r in self.episodes if r not in reward]
            extra = [r for r in reward if r not in self.episodes]
            if missing or extra:
                raise ValueError(f"rewards must name every role exactly: missing {missing}, unknown {extra}")
            return {role: float(reward[role]) for role in self.episodes}
        return {role: float(reward) for role in self.episodes}

    def finish(
        self, reward: float | Mapping[str, float], metrics: dict[str, float] | None = None
    ) -> dict[str, FinishResponse]:
        """Finish every member: one reward for all roles, or `{role: reward}` naming each role."""
        rewards = self._rewards(reward)  # a bad reward dict raises before anything is sent
        members = list(self.episodes.values())
        with members[0].guard:
            for role, ep in self.episodes.items():
                if ep.done and ep.result is not None:  # finished on its own (`t["planner"].finish(...)`)
                    self.results[role] = ep.result
            gone = [r for r, ep in self.episodes.items() if r not in self.results and (ep.lost or ep.done)]
            if not gone:
                for ep in members:
                    ep.sealing = True
        if gone:
            reason = f"team {self.id}: {', '.join(gone)} gone before the finish"
            aborted = self._abort_rest(reason)
            if self.results:  # a member finished already: not replayable, as a finish failing half way
                raise self._partly_finished(f"{', '.join(gone)} gone before the finish", {}, aborted)
            raise TeamLost(
                f"team episode {self.id}: {', '.join(gone)} gone before the finish (lease lapsed or given back); "
                "nothing finished, every member given back",
                {},
            )
        errors: dict[str, BaseException] = {}
        for role, ep in self.episodes.items():
            if role in self.results:  # finished on its own: collected above
                continue
            try:
                self.results[role] = ep.finish(rewards[role], metrics)
            except SwarmError as exc:
                errors[role] = exc
                break
        if errors:  # a member finished keeps its slot; the rest give theirs up (`replayable`)
            reason = f"team {self.id}: finishing {', '.join(errors)} failed"
            aborted = self._abort_rest(reason)
            what = f"finish failed for {', '.join(errors)}: {next(iter(errors.values()))}"
            raise self._partly_finished(what, errors, aborted)
        return dict(self.results)

    def _partly_finished(self, what: str, errors: Mapping[str, BaseException], aborted: list[str]) -> TeamError:
        """The error of a team left finished on some servers and aborted on the others (not replayable)."""
        message = f"team episode {self.id}: {what}; finished {sorted(self.results)}, aborted {aborted}"
        return TeamError(message, errors, sorted(self.results), aborted)

    def abort(self, reason: str | None = None, release: bool = True) -> None:
        """Abort every member not yet finished; raises `TeamError` if some abort failed."""
        errors: dict[str, BaseException] = {}
        for role, ep in self.episodes.items():
            if ep.done:
                continue
            try:
                ep.abort(reason, release=release)
            except SwarmError as exc:
                ep.done = True  # the server is gone or the episode closed: nothing left to undo
                errors[role] = exc
        if errors:
            raise TeamError(f"team episode {self.id}: abort failed for {', '.join(errors)}", errors)

    def _abort_rest(self, reason: str, release: bool = True) -> list[str]:
        """Abort every member not done, never raising; the roles whose abort went through. A team that is
        not `replayable` gives its slots up whatever `release` says: nobody would claim them again."""
        release = release and self.replayable
        aborted = []
        for role, ep in self.episodes.items():
            if ep.done:
                continue
            try:
                ep.abort(reason[:1000], release=release)
                aborted.append(role)
            except SwarmError:
                ep.done = True  # gone or already closed on its server: nothing left to undo
        return aborted

    def close(self) -> None:
        for ep in self.episodes.values():
            ep.close()

    def __repr__(self) -> str:
        return f"TeamEpisode(id={self.id!r}, roles={self.roles})"


class TeamClient:
    """Several `SwarmClient`s, one per role; `episode()` claims one episode on each."""

    def __init__(self, members: Mapping[str, SwarmClient]) -> None:
        if not members:
            raise ValueError("a team needs at least one role")
        for role, client in members.items():
            if not isinstance(role, str) or not role:
                raise ValueError(f"role names are non-empty strings, got {role!r}")
            if not callable(getattr(client, "claim", None)):
                raise TypeError(f"role {role!r}: expected a SwarmClient, got {type(client).__name__}")
        self.members = dict(members)

    @property
    def roles(self) -> list[str]:
        return list(self.members)

    @property
    def stopping(self) -> bool:
        """A member's server said it is stopping (the team cannot play on without it)."""
        return any(getattr(c, "stopping", False) for c in self.members.values())

    def status(self) -> Any:
        """The first role's server status (`swarm client` checks its URL and token with it)."""
        return next(iter(self.members.values())).status()

    def abort_open(self, reason: str) -> None:
        """Every member's open episodes given back (a fleet's Ctrl-C)."""
        for client in self.members.values():
            client.abort_open(reason)

    def claim(
        self, task_id: str, task_family: str = "default", metadata: dict | None = None, **claim_kwargs: Any
    ) -> TeamEpisode:
        """Claim one episode per role (in role order); on any failure abort those claimed, re-raise."""
        team_id = uuid.uuid4().hex
        episodes: dict[str, Episode] = {}
        try:
            for role, client in self.members.items():
                meta = {**(metadata or {}), "team": {"id": team_id, "role": role, "roles": self.roles}}
                episodes[role] = client.claim(task_id, task_family, meta, roles=[role], **claim_kwargs)
        except BaseException:
            for ep in episodes.values():
                ep._abort_quietly(f"team {team_id}: another member's claim failed")
                ep.close()
            raise
        return TeamEpisode(team_id, episodes)

    @contextmanager
    def episode(
        self, task_id: str, task_family: str = "default", metadata: dict | None = None, **claim_kwargs: Any
    ) -> Iterator[TeamEpisode]:
        """Claim the team, yield it, and abort every member unless `finish` succeeded in the block."""
        team = self.claim(task_id, task_family, metadata, **claim_kwargs)
        try:
            yield team
        except BaseException as exc:
            team._abort_rest(f"exception in team episode block: {type(exc).__name__}: {exc}")
            raise
        finally:
            if not team.done:
                team._abort_rest("left the team episode block without finish")
            team.close()

    def close(self) -> None:
        for client in self.members.values():
            client.close()

    def __enter__(self) -> TeamClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
