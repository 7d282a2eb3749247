"""Rows of different LoRA adapters in one forward of the continuous batcher (peft's per-row
`adapter_names`, entered by `adapter_scope`): several policies on one shared base.

The checks that matter: every row gets exactly what it gets alone with its own adapter (in a
prefill, a fused step, decodes, as rows finish and leave), and nothing computed for one adapter
serves another (the prompt cache, twins in one prefill, a shared prefix), while one adapter's
weights changing leaves the others' cached prefills alone. The adapters are random (peft starts
B at zero, which would make every adapter the base and every check trivial).
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from swarm.engine.base import SamplingParams, TokenChunk
from swarm.engine.continuous import ContinuousBatcher

TOL = 1e-5  # fp32: one row batched beside other adapters vs the same row alone
VOCAB = 64
ADAPTERS = ("alice", "bob", "carol")  # not "a": peft warns on names inside its "lora_" prefix
Out = tuple[list[int], list[float]]


@pytest.fixture(scope="module")
def peft_model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(Qwen2ForCausalLM(config), lora, adapter_name=ADAPTERS[0])
        for name in ADAPTERS[1:]:
            model.add_adapter(name, lora)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def _batcher(peft_model, scoped: bool = True, entered: list[list[str]] | None = None, **kw) -> ContinuousBatcher:
    """As the engine builds it: the HF model inside the peft wrapper, peft's hooks as the scope
    (`entered` records the names of every scope entered). A long `gather_s` so that rows
    submitted together surely share their first forward."""

    def scope(names: list[str]):
        if entered is not None:
            entered.append(list(names))
        return peft_model.base_model._enable_peft_forward_hooks(adapter_names=names)

    kw = {"gather_s": 0.05, "gather_max_s": 1.0, **kw}
    return ContinuousBatcher(
        peft_model.get_base_model(),
        threading.Lock(),
        eos_ids=set(),
        max_positions=256,
        decode=lambda ids: "",
        vocab_size=VOCAB,
        adapter_scope=scope if scoped else None,
        **kw,
    )


@pytest.fixture()
def entered() -> list[list[str]]:
    return []


@pytest.fixture()
def batcher(peft_model, entered):
    b = _batcher(peft_model, entered=entered)
    yield b
    b.close()


def _params(max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _submit(b: ContinuousBatcher, prompt: list[int], adapter: str | None, max_tokens: int = 6, then=None):
    """Submit one greedy row; (its output, an event set when it finished). `then()` runs (in the
    worker) right after the row's first token: rows submitted there join a running batch."""
    out: Out = ([], [])
    done = threading.Event()

    def emit(chunk: TokenChunk) -> None:
        nonlocal then
        out[0].extend(chunk.token_ids)
        out[1].extend(chunk.logprobs)
        if then is not None:
            then, call = None, then
            call()
        if chunk.finish_reason is not None:
            done.set()

    b.submit(prompt, _params(max_tokens), emit, adapter=adapter)
    return out, done


def _run(b: ContinuousBatcher, rows: list[tuple[list[int], str | None]], max_tokens: int = 6) -> list[Out]:
    """Rows submitted together (one burst: one prefill), their outputs in order."""
    subs = [_submit(b, p, a, max_tokens) for p, a in rows]
    for _, done in subs:
        assert done.wait(20)
    return [out for out, _ in subs]


def _alone(peft_model, prompt: list[int], adapter: str | None, max_tokens: int = 6) -> Out:
    """The row by itself, nothing cached or batched with it. No adapter: the base model, peft's
    adapters off (unscoped, the peft model would run its active adapter)."""
    b = _batcher(peft_model, gather_s=0)
    try:
        if adapter is None:
            with peft_model.disable_adapter():
                return _run(b, [(prompt, None)], max_tokens)[0]
        return _run(b, [(prompt, adapter)], max_tokens)[0]
    finally:
        b.close()


def _same(got: Out, want: Out) -> None:
    assert got[0] == want[0]
    assert max(abs(a - b) for a, b in zip(got[1], want[1])) < TOL


def _prompt(seed: int, n: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_mixed_batch_gives_every_row_its_own_adapter(peft_model, batcher, entered):
    # three adapters and a base row, prompts of different lengths, rows finishing at different steps
    rows = [(_prompt(1, 5), "alice"), (_prompt(2, 9), "bob"), (_prompt(3, 7), "carol"), (_prompt(4, 6), None)]
    lengths = [6, 3, 8, 5]
    subs = [_submit(batcher, p, a, n) for (p, a), n in zip(rows, lengths)]
    for _, done in subs:
        assert done.wait(20)
    assert batcher.steps == max(lengths)  # one prefill, then decodes: every row in every forward
    # each forward names the rows still running, in batch order
    names = ["alice", "bob", "carol", "__base__"]
    assert entered == [[a for a, n in zip(names, lengths) if n > step] for step in range(max(lengths))]
    for (out, _), (p, a), n in zip(subs, rows, lengths):
        _same(out, _alone(peft_model, p, a, n))
    # the adapters really differ: one prompt, four models, four answers
    p = _prompt(5, 6)
    outs = _run(batcher, [(p, a) for a in (*ADAPTERS, None)])
    assert len({tuple(o[0]) for o in outs}) > 1
    assert min(abs(x[1][0] - y[1][0]) for i, x in enumerate(outs) for y in outs[i + 1 :]) > 1e-3


def test_rows_of_other_adapters_join_a_running_batch_in_a_fused_step(peft_model):
    b = _batcher(peft_model, fuse_pad_tokens=10_000)  # always fuse newcomers into the running forward
    try:
        late: list = []
        late_rows = [(_prompt(11, 8), "bob"), (_prompt(12, 4), "carol"), (_prompt(13, 6), None)]
        first = _submit(
            b, _prompt(10, 5), "alice", 12, then=lambda: late.extend(_submit(b, p, a) for p, a in late_rows)
        )
        assert first[1].wait(20)
        for _, done in late:
            assert done.wait(20)
        assert b.fused_steps == 1
        _same(first[0], _alone(peft_model, _prompt(10, 5), "alice", 12))
        for (out, _), (p, a) in zip(late, late_rows):
            _same(out, _alone(peft_model, p, a))
    finally:
        b.close()


def test_a_prompt_is_reused_only_under_its_own_adapter(peft_model, batcher):
    p = _prompt(20, 7)
    want = {a: _alone(peft_model, p, a) for a in ("alice", "bob")}
    assert want["alice"][1] != want["bob"][1]
    # one burst: the same prompt under two adapters, twice each: twins share within an adapter only
    outs = _run(batcher, [(p, "alice"), (p, "bob"), (p, "alice"), (p, "bob")])
    assert batcher.prompts_reused == 2
    for out, a in zip(outs, ["alice", "bob", "alice", "bob"]):
        _same(out, want[a])
    # later: each adapter's cached prefill serves that adapter; a third adapter prefills its own
    outs = _run(batcher, [(p, "bob"), (p, "alice"), (p, "carol")])
    assert batcher.prompts_reused == 4
    _same(outs[0], want["bob"])
    _same(outs[1], want["alice"])
    _same(outs[2], _alone(peft_model, p, "carol"))
    assert outs[2][1] != want["alice"][1]


def test_a_shared_prefix_is_shared_only_within_one_adapter(peft_model, batcher):
    head = _prompt(30, 12)  # a chat template, a system prompt
    rows = [(head + _prompt(31, 3), "alice"), (head + _prompt(32, 5), "bob"), (head + _prompt(33, 2), "alice")]
    outs = _run(batcher, rows)
    assert batcher.prefix_tokens_saved == 0  # two adapters: the prefix computed per row
    for out, (p, a) in zip(outs, rows):
        _same(out, _alone(peft_model, p, a))
    one = [(head + _prompt(34, 3), "bob"), (head + _prompt(35, 4), "bob")]
    outs = _run(batcher, one)
    assert batcher.prefix_tokens_saved >= len(head)  # one adapter: computed once, under that adapter
    for out, (p, a) in zip(outs, one):
        _same(out, _alone(peft_model, p, a))


def test_one_adapters_new_weights_drop_only_its_cached_prefills(batcher):
    pa, pb = _prompt(40, 6), _prompt(41, 6)
    _run(batcher, [(pa, "alice"), (pb, "bob"), (pb, None)])
    keys = set(batcher.prompts._entries)
    assert keys == {("alice", tuple(pa)), ("bob", tuple(pb)), tuple(pb)}
    with batcher.lock:
        batcher.weights_changed("alice")
    assert set(batcher.prompts._entries) == keys - {("alice", tuple(pa))}
    reused = batcher.prompts_reused
    _run(batcher, [(pa, "alice"), (pb, "bob")])
    assert batcher.prompts_reused == reused + 1  # bob's prefill kept, alice's computed afresh
    with batcher.lock:
        batcher.weights_changed()  # the base changed: nothing holds
    assert len(batcher.prompts) == 0


def test_a_budget_counts_prompt_tokens_whatever_the_adapter(batcher):
    _run(batcher, [(_prompt(50, 6), "alice"), (_prompt(51, 4), "bob"), (_prompt(52, 5), None)])
    assert batcher.prompts._tokens == 15


def test_an_adapter_needs_a_scope(peft_model):
    b = _batcher(peft_model, scoped=False)
    try:
        with pytest.raises(ValueError, match="adapter_scope"):
            b.submit([1, 2, 3], _params(), lambda chunk: None, adapter="alice")
    finally:
        b.close()


def test_rows_without_adapters_enter_no_scope(batcher, entered):
    _run(batcher, [(_prompt(60, 5), None), (_prompt(61, 6), None)])
    assert entered == []
    _run(batcher, [(_prompt(62, 5), None), (_prompt(63, 6), "carol")])
    assert entered == [["__base__", "carol"]] * 6
