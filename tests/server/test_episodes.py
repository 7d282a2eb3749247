"""Episode keys and the registry (pure)."""

from __future__ import annotations

import pytest

from swarm.server.episodes import EpisodeRegistry, KeySigner
from swarm.server.errors import status_of
from swarm.server.exceptions import SwarmError


def _registry(secret: str = "s1") -> EpisodeRegistry:
    return EpisodeRegistry(KeySigner(secret), lease_seconds=60, closed_kept=2)


def test_signed_key_round_trip_and_forgeries() -> None:
    reg = _registry()
    ep = reg.create(reg.new_id(), "t", "default", "t#w0g0", {}, 0)
    key = reg.key_for(ep)
    assert reg.authorize(key) is ep
    assert reg.authorize(key, ep.id) is ep
    forged = KeySigner("another-secret").sign(ep.id, ep.epoch)
    tampered = key[:-1] + ("0" if key[-1] != "0" else "1")
    for bad in (forged, tampered, "rk.x.1.y", "garbage", "", f"rk.{ep.id}.2.{key.split('.')[-1]}"):
        with pytest.raises(SwarmError) as e:
            reg.authorize(bad)
        assert status_of(e.value) == 401


def test_wrong_episode_unknown_and_stale_epoch() -> None:
    reg = _registry()
    a = reg.create(reg.new_id(), "t", "default", "g", {}, 0)
    b = reg.create(reg.new_id(), "t", "default", "g", {}, 0)
    with pytest.raises(SwarmError) as e:
        reg.authorize(reg.key_for(a), b.id)
    assert status_of(e.value) == 403
    ghost = reg.signer.sign("0" * 32, 1)
    with pytest.raises(SwarmError) as e:
        reg.authorize(ghost)
    assert status_of(e.value) == 404
    old = reg.key_for(a)
    a.epoch += 1  # the lease moved on (later: expiry + re-grant)
    with pytest.raises(SwarmError) as e:
        reg.authorize(old)
    assert status_of(e.value) == 409


def test_closed_episodes_are_bounded_and_refuse_work() -> None:
    reg = _registry()
    eps = [reg.create(reg.new_id(), "t", "default", "g", {}, 0) for _ in range(3)]
    for ep in eps:
        reg.close(ep, "finished")
    with pytest.raises(SwarmError) as e:
        reg.require_open(eps[-1])
    assert status_of(e.value) == 409
    assert list(reg.closed) == [eps[1].id, eps[2].id]
    with pytest.raises(SwarmError):
        reg.get(eps[0].id)


def test_claim_key_finds_the_open_episode_only() -> None:
    reg = _registry()
    ep = reg.create(reg.new_id(), "t", "default", "g", {}, 0, claim_key="k1")
    assert reg.by_claim_key("k1") is ep
    assert reg.by_claim_key("k2") is None
    reg.close(ep, "aborted")
    assert reg.by_claim_key("k1") is None
