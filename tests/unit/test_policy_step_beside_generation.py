"""A policy's step runs beside the other policies' generation and steps (swarm/engine/policies.py,
adapter_routing.py, step_slots.py): the others keep generating and training while it trains, what
they generate and train is what they do alone, and the step trains what a step that holds the
whole model trains.

`ROOST_TEST_DEVICE=cuda` runs them on a GPU (bf16 weights; bench/gpu_acceptance.sh does): what is
compared bit for bit there is the same computation twice, and rows batched with other policies'
rows get a bf16 tolerance instead of 1e-5."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from swarm.config.lora import LoraSettings
from swarm.engine import GenerateRequest, SamplingParams, TrainBatch, TrainConfig, TrainSample
from swarm.engine.adapter_routing import adapter_parameters, route
from swarm.engine.policies import PolicyEngine, PolicyHost
from swarm.engine.step_slots import StepSlots
from swarm.model.build import build_untrained

DEVICE = os.environ.get("ROOST_TEST_DEVICE", "cpu")
MIXED_ATOL = 1e-5 if DEVICE == "cpu" else 5e-2  # a row batched with others: bf16 reorders its sums


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def _host(model_dir: Path, names=("a", "b"), dropout: float = 0.0) -> PolicyHost:
    host = PolicyHost(model_dir, seed=0, device=DEVICE)
    for i, name in enumerate(names):
        policy = host.add(name, LoraSettings(rank=4 + i, dropout=dropout))
        g = torch.Generator().manual_seed(i + 1)  # non-zero B: fresh adapters would all equal the base
        with torch.no_grad():
            for p in adapter_parameters(host.peft, policy.adapter):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    host.base.batcher.weights_changed()
    return host


def _batch(policy: PolicyEngine, **config: float) -> TrainBatch:
    samples = []
    for i in range(4):
        ids = [1, 5 + i, 9, 17, 33, 65 + i, 129, 200]
        samples.append(
            TrainSample(
                ids, [0, 0, 0, 1, 1, 1, 1, 1], [0.0, *policy.logprobs(ids)], f"e{i}", f"g{i // 2}", float(i % 2)
            )
        )
    return TrainBatch(samples, TrainConfig(lr=1e-3, **config))


async def _generate(policy: PolicyEngine, prompt: list[int]):
    return await policy.generate(
        GenerateRequest(prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    )


def test_another_policy_generates_while_a_step_is_halfway_and_gets_what_it_gets_alone(model_dir):
    host = _host(model_dir)
    a, b = host.policy("a"), host.policy("b")
    assert host.steps_beside_generation
    prompt = [1, 5, 9, 17]
    alone = asyncio.run(_generate(b, prompt))
    batch = _batch(a, kl_coef=0.1)  # the KL reference too runs in the step's thread only
    entered, release = threading.Event(), threading.Event()
    trainer: list[int] = []

    def hold_the_step(module, args):  # the step's forward waits here, between its layers and its loss
        if threading.get_ident() in trainer:
            entered.set()
            assert release.wait(60)

    handle = host.base.network.lm_head.register_forward_pre_hook(hold_the_step)
    result: dict = {}

    def step() -> None:
        trainer.append(threading.get_ident())
        result["metrics"] = a.train_step(batch)

    thread = threading.Thread(target=step)
    thread.start()
    try:
        assert entered.wait(60), "the step never reached its forward"
        beside = asyncio.run(asyncio.wait_for(_generate(b, prompt), 30))  # would time out behind a whole-step lock
        assert a.policy_version == 0, "the step had not updated yet: the generation really ran beside it"
    finally:
        release.set()
        thread.join(60)
        handle.remove()
    assert not thread.is_alive() and result["metrics"]["policy_version"] == 1.0
    assert beside.token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(beside.logprobs), torch.tensor(alone.logprobs), atol=1e-6)
    assert result["metrics"]["kl_ref"] > 0  # a's adapter differs from the base it was compared with


@pytest.mark.skipif(
    DEVICE != "cpu",
    reason="a GPU takes one step at a time (step_slots): autograd runs every CUDA backward on the device's one "
    "thread, so two steps' backwards would take turns there anyway (and a hook cannot tell them apart by thread)",
)
def test_two_policies_step_at_once_and_each_trains_what_it_trains_alone(model_dir):
    host, alone = _host(model_dir), _host(model_dir)
    host.slots = StepSlots(2)
    a, b = host.policy("a"), host.policy("b")
    # a clipping norm every step exceeds: a step that counted the other policy's gradients would scale its own
    batches = {"a": _batch(a, kl_coef=0.1, max_grad_norm=1e-4), "b": _batch(b, max_grad_norm=1e-4)}
    want = {}
    for name in "ab":
        want[name] = (alone.policy(name).train_step(batches[name]), alone.policy(name).adapter_state())
    entered, release = threading.Event(), threading.Event()
    trainer: list[int] = []

    def hold_the_backward(grad):  # a's backward waits here, the gradients of its later layers already in
        if threading.get_ident() in trainer:
            entered.set()
            assert release.wait(60)
        return grad

    first = next(p for n, p in host.peft.named_parameters() if f"layers.0.self_attn.q_proj.lora_A.{a.adapter}." in n)
    handle = first.register_hook(hold_the_backward)
    got: dict = {}

    def step_a() -> None:
        trainer.append(threading.get_ident())
        got["a"] = a.train_step(batches["a"])

    thread = threading.Thread(target=step_a)
    thread.start()
    try:
        assert entered.wait(60)
        assert any(p.grad is not None for n, p in host.peft.named_parameters() if f".{a.adapter}." in n)
        other = threading.Thread(target=lambda: got.update(b=b.train_step(batches["b"])))
        other.start()
        other.join(30)
        assert not other.is_alive(), "b's step waited for a's"
        assert b.policy_version == 1 and a.policy_version == 0
    finally:
        release.set()
        thread.join(60)
        handle.remove()
    for name in "ab":  # each clipped and updated its own gradients only
        state = host.policy(name).adapter_state()
        assert got[name]["grad_norm"] == pytest.approx(want[name][0]["grad_norm"], rel=1e-6), name
        assert all(torch.equal(state[k], want[name][1][k]) for k in state), name


def test_a_change_of_the_policies_waits_for_running_steps_and_goes_before_new_ones():
    slots = StepSlots(2)
    events: list[str] = []
    in_step, end_step = threading.Event(), threading.Event()

    def step(name: str, hold: bool = False) -> None:
        with slots.step():
            events.append(f"{name} in")
            if hold:
                in_step.set()
                assert end_step.wait(30)
            events.append(f"{name} out")

    def change() -> None:
        with slots.exclusive():
            events.append("change")

    first = threading.Thread(target=step, args=("first", True))
    first.start()
    assert in_step.wait(30)
    changer = threading.Thread(target=change)
    changer.start()
    while not slots.waiting:  # the change is queued behind the running step
        time.sleep(0.01)
    later = threading.Thread(target=step, args=("later",))
    later.start()
    time.sleep(0.2)
    assert events == ["first in"], "a step went past a waiting change, or the change past a running step"
    end_step.set()
    for t in (first, changer, later):
        t.join(30)
    assert events == ["first in", "first out", "change", "later in", "later out"]
    with pytest.raises(ValueError):
        StepSlots(0)


def test_a_policy_stepping_back_to_back_does_not_starve_another():
    slots = StepSlots(1)
    counts = {"a": 0, "b": 0}
    stop = threading.Event()

    def loop(name: str) -> None:
        while not stop.is_set():
            with slots.step():
                counts[name] += 1
                time.sleep(0.001)  # a step's work; the slot is taken again at once after it

    threads = [threading.Thread(target=loop, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(10)
    assert min(counts.values()) >= 0.3 * max(counts.values()), counts


def test_a_step_beside_generation_trains_what_a_step_holding_the_model_trains(model_dir):
    beside, holding = _host(model_dir), _host(model_dir)
    holding.steps_beside_generation = False  # train mode and the lock for the whole step, as with dropout
    states = []
    for host in (beside, holding):
        a = host.policy("a")
        metrics = a.train_step(_batch(a, kl_coef=0.1, entropy_coef=0.01))
        states.append((a.adapter_state(), host.policy("b").adapter_state(), metrics))
    (a1, b1, m1), (a2, b2, m2) = states
    assert all(torch.equal(a1[k], a2[k]) for k in a1), "eval mode without dropout trained differently"
    assert all(torch.equal(b1[k], b2[k]) for k in b1)
    for key in ("loss", "kl_ref", "entropy", "grad_norm"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-6, abs=1e-9), key


def test_dropout_anywhere_makes_every_step_hold_the_model(model_dir):
    host = _host(model_dir, names=("a",))
    assert host.steps_beside_generation
    host.add("d", LoraSettings(rank=4, dropout=0.1))  # train mode is the whole model's: no forward beside it
    assert not host.steps_beside_generation
    d = host.policy("d")
    d.train_step(_batch(d))
    assert not host.peft.training  # back to eval mode for generation
    host.remove("d")
    assert host.steps_beside_generation


def test_routes_are_per_thread_and_stack(model_dir):
    host = _host(model_dir)
    a, b = host.policy("a"), host.policy("b")
    ids = torch.tensor([[1, 5, 9, 17]], device=host.base.device)
    net = host.base.network

    def logits(**kw):
        with torch.inference_mode(), route(**kw):
            return net(input_ids=ids).logits

    la, lb, base = logits(adapter=a.adapter), logits(adapter=b.adapter), logits(off=True)
    assert not torch.allclose(la, lb) and not torch.allclose(la, base)
    with route(a.adapter):
        assert torch.equal(logits(off=True), base)  # the KL reference inside a step's route
        seen: list[torch.Tensor] = []
        other = threading.Thread(target=lambda: seen.append(logits(adapter=b.adapter)))
        other.start()
        other.join()
        assert torch.equal(seen[0], lb)  # another thread's route is its own
        with torch.inference_mode():
            assert torch.equal(net(input_ids=ids).logits, la)  # this thread's route is back after the inner one
    with torch.inference_mode(), route(rows=[a.adapter, b.adapter, "__base__"]):  # one adapter per row
        mixed = net(input_ids=ids.expand(3, -1)).logits
    for row, want in enumerate((la, lb, base)):
        assert torch.allclose(mixed[row], want[0], atol=MIXED_ATOL), row


def test_layers_wrapped_for_a_later_policys_targets_are_routed_too(model_dir):
    from peft.tuners.lora import LoraLayer

    from swarm.engine.adapter_routing import _Routed

    host = PolicyHost(model_dir, seed=0, device=DEVICE)
    a = host.add("a", LoraSettings(rank=4, targets="q_proj"))
    b = host.add("b", LoraSettings(rank=4))  # every linear layer: peft wraps the others now
    layers = [m for m in host.peft.modules() if isinstance(m, LoraLayer)]
    assert len(layers) > sum(1 for m in layers if a.adapter in m.lora_A)  # b's targets reach further than a's
    assert all(isinstance(m, _Routed) for m in layers)
    with torch.no_grad():
        for name, p in host.peft.named_parameters():
            if f".{b.adapter}." in name and "lora_B" in name and "q_proj" not in name:
                p.fill_(0.05)  # only the layers a does not wrap: they must follow the route
    ids = torch.tensor([[1, 5, 9, 17]], device=host.base.device)
    with torch.inference_mode():
        with route(b.adapter):
            lb = host.base.network(input_ids=ids).logits
        with route(off=True):
            base = host.base.network(input_ids=ids).logits
        with route(a.adapter):
            la = host.base.network(input_ids=ids).logits
    assert not torch.allclose(lb, base) and torch.allclose(la, base)  # a's B is 0: a is the base
