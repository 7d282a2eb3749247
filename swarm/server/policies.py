"""`PolicyRouter`: which policy's `Swarm` a request is for, on a server of one or several policies.

    router.default                  # the first policy (a one-policy server's only one)
    router.by_model("planner")      # a request's `model` / a claim's `policy`; 404 model_not_found else
    router.owner(episode_id)        # the policy an episode belongs to; 409 policy_removed when it is gone

Every policy is a whole `Swarm` (state.py): its own windows, groups, leases, durable buffer,
trainer, checkpoints and metrics, on its own engine view (a `PolicyEngine` of one shared base).
All of them share the server's tokens and its episode-key secret, so a key is verified once and
its episode found in the registry of the policy that issued it. The router holds no episode
state itself: it only asks the policies.
"""

from __future__ import annotations

from collections.abc import Iterator

from swarm.server.exceptions import Conflict, EpisodeNotFound, NotFound
from swarm.server.state import Swarm


class PolicyRouter:
    """The policies of one server, by name, in the order they were added."""

    def __init__(self, swarms: dict[str, Swarm]) -> None:
        if not swarms:
            raise ValueError("a server has at least one policy")
        self.swarms: dict[str, Swarm] = dict(swarms)
        self.removed: dict[str, Swarm] = {}  # kept to answer for their episodes: 409, not 404

    @property
    def default(self) -> Swarm:
        return next(iter(self.swarms.values()))

    @property
    def several(self) -> bool:
        return len(self.swarms) > 1 or bool(self.removed)

    def __iter__(self) -> Iterator[Swarm]:
        return iter(list(self.swarms.values()))

    def names(self) -> list[str]:
        return list(self.swarms)

    def by_model(self, name: str | None) -> Swarm:
        """The policy a request's `model` (or a claim's `policy`) names; None: the default one."""
        if name is None:
            return self.default
        for swarm in self.swarms.values():
            if name in swarm.config.model_aliases:
                return swarm
        served = self.served()
        if name in self.removed:
            raise NotFound("model_not_found", f"policy {name!r} was removed; served: {', '.join(served)}")
        raise NotFound(
            "model_not_found",
            f"model {name!r} is not served here; served: {', '.join(served)}",
            details={"models": served, "policies": [n for n in self.swarms if n]},  # [] : none named
        )

    def served(self) -> list[str]:
        """The names a request may use, one per policy: a server without policies keeps its one under ""
        (which "served: " listed as nothing), and serves it by its model name."""
        return [name or swarm.config.served_model_name for name, swarm in self.swarms.items()]

    def owner(self, episode_id: str) -> Swarm:
        """The policy whose registry holds `episode_id` (open, recently closed, or in its buffer)."""
        for swarm in self.swarms.values():
            reg = swarm.registry
            if episode_id in reg.open or episode_id in reg.closed:
                return swarm
        for name, swarm in self.removed.items():
            reg = swarm.registry
            if episode_id in reg.open or episode_id in reg.closed:
                raise Conflict(
                    "policy_removed",
                    f"episode {episode_id} belongs to policy {name!r}, which was removed from this server; "
                    "nothing more of it is recorded",
                )
        if len(self.swarms) == 1:
            return self.default  # its registry answers (its buffer, or EpisodeNotFound)
        for swarm in self.swarms.values():
            try:
                swarm.registry.get(episode_id)  # the durable buffer of a closed episode
                return swarm
            except EpisodeNotFound:
                continue
        raise EpisodeNotFound(episode_id)

    def add(self, name: str, swarm: Swarm) -> None:
        if name in self.swarms:
            raise Conflict("policy_exists", f"a policy named {name!r} is already served")
        self.removed.pop(name, None)
        self.swarms[name] = swarm

    def remove(self, name: str) -> Swarm:
        if name not in self.swarms:
            raise NotFound("model_not_found", f"no policy {name!r}; served: {', '.join(self.swarms)}")
        if len(self.swarms) == 1:
            raise Conflict("last_policy", f"{name!r} is the server's last policy: stop the server instead")
        swarm = self.swarms.pop(name)
        self.removed[name] = swarm
        return swarm


__all__ = ["PolicyRouter"]
