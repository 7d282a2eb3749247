"""The safetensors writer (swarm/engine/vllm/safetensors_writer.py) and the checks built on it (weights.py).

The writer replaces `safetensors.torch.save_file` for the weights vLLM reloads, so what it writes
must be what the library writes (the same bytes, where the library accepts the tensors) and load
back with the library's readers; and the trainer's weights, checked in memory before the write,
must be refused for the same reasons a file read whole is.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from swarm.engine.vllm import safetensors_writer as writer
from swarm.engine.vllm.weights import (
    CheckpointRefused,
    ServingDir,
    check_header,
    check_state,
    layout_of,
    validate,
    write_atomic,
)


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.layers.0.weight": torch.randn(8, 5, generator=g),
        "model.embed": torch.randn(7, 3, generator=g).to(torch.bfloat16),
        "half": torch.randn(3, 3, generator=g).half(),
        "double": torch.randn(2, generator=g).double(),
        "ids": torch.arange(5, dtype=torch.int64),
        "i32": torch.arange(3, dtype=torch.int32),
        "u8": torch.arange(3, dtype=torch.uint8),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(1.5),
        "scalar_bf16": torch.tensor(-2.0, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "odd": torch.randn(3, generator=g).to(torch.bfloat16),  # 6 bytes: the next tensor unaligned, if misordered
        "ünïcode.weight": torch.ones(2),
        "complex": torch.randn(2, generator=g, dtype=torch.complex64),
    }


def test_the_same_bytes_as_save_file(tmp_path: Path) -> None:
    state = _mixed()
    for metadata in ({"format": "pt"}, None):
        ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
        n = writer.save(state, ours, metadata=metadata)
        save_file(state, str(theirs), metadata=metadata)
        assert n == os.path.getsize(ours)
        assert ours.read_bytes() == theirs.read_bytes()


def test_round_trips_through_the_librarys_readers(tmp_path: Path) -> None:
    state = _mixed()
    path = tmp_path / "m.safetensors"
    writer.save(state, path, metadata={"format": "pt"})
    back = load_file(str(path))
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_slice("model.layers.0.weight")[2:4], state["model.layers.0.weight"][2:4])
    entries, metadata = writer.read_header(path)
    assert metadata == {"format": "pt"} and entries["ids"] == writer.Entry("I64", (5,), 0, 40)


def test_tied_and_non_contiguous_tensors_are_written_as_their_values(tmp_path: Path) -> None:
    """`save_file` refuses both; the writer writes each name's values (a tied tensor twice)."""
    base = torch.randn(4, 6)
    tied = torch.nn.Linear(6, 4, bias=False)
    state = {
        "embed": tied.weight,  # requires grad: written from its data
        "head": tied.weight,  # the same storage under a second name
        "transposed": base.t(),
        "strided": base[:, ::2],
        "slice_bf16": base.to(torch.bfloat16)[1:3],  # contiguous, at an offset in its storage
    }
    path = tmp_path / "m.safetensors"
    writer.save(state, path)
    back = load_file(str(path))
    for k, v in state.items():
        assert torch.equal(back[k], v.detach()), k
    plain = {k: v.detach().clone().contiguous() for k, v in state.items()}
    save_file(plain, str(tmp_path / "lib.safetensors"))
    assert path.read_bytes() == (tmp_path / "lib.safetensors").read_bytes()


def test_an_unknown_dtype_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="c: safetensors has no dtype"):
        writer.save({"a": torch.ones(2), "c": torch.ones(2, dtype=torch.complex128)}, tmp_path / "x")


def test_read_header_refuses_what_does_not_add_up(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    writer.save(_mixed(), good, metadata={"format": "pt"})
    data = good.read_bytes()
    cases = {
        "truncated": data[:-1],
        "extended": data + b"\0",
        "tiny": data[:5],
        "huge header": (10**9).to_bytes(8, "little") + data[8:],
        "not json": data[:8] + b"x" * (len(data) - 8),
    }
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ValueError):
            writer.read_header(tmp_path / name)
    # a hole between two tensors
    hole = writer.header_bytes({"a": torch.ones(2)}).replace(b"[0,8]", b"[4,12]")
    (tmp_path / "hole").write_bytes(hole + b"\0" * 12)
    with pytest.raises(ValueError, match="starts at byte 4"):
        writer.read_header(tmp_path / "hole")


def test_write_atomic_leaves_no_temp_file_and_validates(tmp_path: Path) -> None:
    state = {"w": torch.randn(3, 2), "b": torch.zeros(2)}
    for durable in (True, False):
        path = write_atomic(state, tmp_path / f"m{durable}.safetensors", durable=durable)
        validate(path, layout_of(state))
        check_header(path, layout_of(state))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mFalse.safetensors", "mTrue.safetensors"]
    with pytest.raises(ValueError):  # a failed write removes its temp file and keeps the old one
        write_atomic({"c": torch.ones(1, dtype=torch.complex128)}, tmp_path / "mTrue.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mFalse.safetensors", "mTrue.safetensors"]
    assert torch.equal(load_file(str(tmp_path / "mTrue.safetensors"))["w"], state["w"])


def test_the_in_memory_check_refuses_what_validate_refuses(tmp_path: Path) -> None:
    state = {"w": torch.randn(4, 2), "b": torch.zeros(4), "n": torch.arange(3)}
    layout = layout_of(state)
    check_state(state, layout)
    big = torch.full((4, 2), 3e38)  # finite, but its sum overflows: checked element by element
    check_state({**state, "w": big}, layout)
    variants = {
        "NaN": {**state, "b": torch.tensor([0.0, math.nan, 0.0, 0.0])},
        "w holds NaN or inf": {**state, "w": torch.full((4, 2), -math.inf)},
        "names differ": {k: v for k, v in state.items() if k != "b"},
        r"\(4,\) float16": {**state, "b": state["b"].half()},
        r"\(3,\)": {**state, "b": torch.zeros(3)},
    }
    for words, bad in variants.items():
        with pytest.raises(CheckpointRefused, match=words):
            check_state(bad, layout)
        save_file(bad, str(tmp_path / "bad.safetensors"))
        with pytest.raises(CheckpointRefused, match=words):
            validate(tmp_path / "bad.safetensors", layout)


def _serving(tmp_path: Path, state: dict[str, torch.Tensor]) -> ServingDir:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    serving = ServingDir(tmp_path / "serve", layout_of(state))
    serving.prepare(model, state)
    return serving


def test_the_trainers_candidate_is_checked_in_memory_and_by_its_header(tmp_path: Path) -> None:
    state = {"w": torch.randn(4, 2), "b": torch.zeros(4)}
    serving = _serving(tmp_path, state)
    cand = serving.write_candidate({k: v + 1 for k, v in state.items()})
    serving.check_candidate(cand)  # header only: its tensors were checked before the write

    # replaced since it was written (the same size): read whole again, and so refused
    bad = {**state, "b": torch.full((4,), math.nan)}
    save_file(bad, str(tmp_path / "nan.safetensors"), metadata={"format": "pt"})
    os.replace(tmp_path / "nan.safetensors", cand)
    with pytest.raises(CheckpointRefused, match="b holds NaN"):
        serving.check_candidate(cand)

    # truncated after the write: its header no longer accounts for its size
    cand = serving.write_candidate(state)
    with open(cand, "r+b") as f:
        f.truncate(os.path.getsize(cand) - 4)
    with pytest.raises(CheckpointRefused, match="not a readable"):
        serving.check_candidate(cand)

    # tensors refused in memory are not written; the refusal is raised by the check
    cand = serving.write_candidate(state)
    assert cand.exists()
    refused = serving.write_candidate(bad)
    assert refused == serving.candidate and not refused.exists()
    with pytest.raises(CheckpointRefused, match="the trainer's weights: b holds NaN"):
        serving.check_candidate(refused)

    # a file from elsewhere is read whole
    save_file(bad, str(tmp_path / "nan.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointRefused, match="b holds NaN"):
        serving.check_candidate(serving.take_candidate(tmp_path / "nan.safetensors"))


def test_promotion_makes_the_candidate_the_last_good_file(tmp_path: Path) -> None:
    """The replaced last good file is unlinked in the background; a leftover goes at the next `prepare`."""
    state = {"w": torch.randn(4, 2), "b": torch.zeros(4)}
    serving = _serving(tmp_path, state)
    for step in (1, 2):
        cand = serving.write_candidate({k: v + step for k, v in state.items()})
        serving.check_candidate(cand)
        serving.promote(cand)
        assert not cand.exists() and torch.equal(load_file(str(serving.good))["b"], state["b"] + step)
    deadline = time.monotonic() + 10
    while [p for p in serving.root.rglob(".*")] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [p for p in serving.root.rglob(".*")]  # no temp or replaced file left
    (serving.root / ".model.safetensors.old-1-0").write_bytes(b"left by a process that died")
    serving.prepare(tmp_path / "model", state)
    assert sorted(p.name for p in serving.root.rglob("*")) == ["candidate", "config.json", "model.safetensors"]
