"""The teacher of on-policy distillation against real servers on loopback: Roost's own `/v1/completions`
echoes prompt logprobs (what a teacher URL must answer), a URL teacher scores as the same model loaded
locally, and teachers that cannot serve are refused with one line saying why."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from swarm.model.teacher import API_KEY_ENV, LocalTeacher, TeacherError, check_teacher, open_teacher, probe_ids

AUTH = {"Authorization": "Bearer worker-token"}


@pytest.fixture
def torch_server(make_server, model_dir):
    from swarm.engine.torch_engine import TorchEngine  # lazy: torch takes seconds

    return make_server(engine=TorchEngine(model_dir, seed=0, device="cpu"))


@pytest.fixture
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def _echo(url: str, ids: list[int], **extra) -> httpx.Response:
    body = {"model": "tiny-model", "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=60)


def test_completions_echo_returns_the_prompt_logprobs(torch_server, tokenizer) -> None:
    ids = tokenizer.encode("What is 12 + 30?", add_special_tokens=False)
    r = _echo(torch_server.url, ids)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(torch_server.engine.logprobs(ids), abs=1e-5)
    assert "".join(lp["tokens"][: len(ids)]) == tokenizer.decode(ids)
    assert choice["text"].startswith("What is 12 + 30?")
    assert lp["text_offset"][: len(ids)] == sorted(lp["text_offset"][: len(ids)])
    r = _echo(torch_server.url, ids, stream=True)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_echo"


def test_a_url_teacher_scores_as_the_same_model_loaded_locally(torch_server, tokenizer, model_dir, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "worker-token")
    info = check_teacher(torch_server.url + "/v1", tokenizer)
    assert info.url == torch_server.url and info.model == "tiny-model"
    seqs = [probe_ids(tokenizer), tokenizer.encode("1 + 1 = 2", add_special_tokens=False)]
    local = LocalTeacher(model_dir, device="cpu", budget_tokens=16)  # one sequence per forward

    async def both() -> tuple[list[list[float]], list[list[float]]]:
        remote = open_teacher(info)  # its client lives in this loop, as in the server's
        try:
            return await remote.logprobs(seqs), await local.logprobs(seqs)
        finally:
            await remote.close()

    got, want = asyncio.run(both())
    assert [len(x) for x in got] == [len(s) for s in seqs] and got[0][0] == 0.0
    for a, b in zip(got, want):
        assert a == pytest.approx(b, abs=1e-4)


def test_a_url_without_prompt_logprobs_is_refused_in_one_line(server, tokenizer, monkeypatch) -> None:
    """The fake engine cannot score a prompt: its server refuses echo, so it cannot be a teacher."""
    monkeypatch.setenv(API_KEY_ENV, "worker-token")
    with pytest.raises(TeacherError) as err:
        check_teacher(server.url, tokenizer)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"--teacher {server.url}: ")
    assert "prompt logprobs" in message and "unsupported_echo" in message
    with pytest.raises(TeacherError, match="cannot reach"):
        check_teacher("http://127.0.0.1:9", tokenizer, timeout=2)
    # a 401 names the variable its key goes in ("answered 401" alone before)
    monkeypatch.delenv(API_KEY_ENV)
    with pytest.raises(TeacherError, match=f"answered 401: set {API_KEY_ENV} to its key"):
        check_teacher(server.url, tokenizer)
    monkeypatch.setenv(API_KEY_ENV, "wrong")
    with pytest.raises(TeacherError, match=f"answered 401: its key in {API_KEY_ENV} is not accepted"):
        check_teacher(server.url, tokenizer)


def test_a_local_teacher_with_another_tokenizer_is_refused(model_dir, tokenizer, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    theirs = AutoTokenizer.from_pretrained(other)
    theirs.add_tokens(["<teacher-only>"])
    theirs.save_pretrained(other)
    assert check_teacher(str(model_dir), tokenizer).model_dir == model_dir
    with pytest.raises(TeacherError) as err:
        check_teacher(str(other), tokenizer)
    assert "\n" not in str(err.value) and "another tokenizer than the student" in str(err.value)
    with pytest.raises(TeacherError, match="does not exist"):
        check_teacher(str(tmp_path / "nowhere"), tokenizer)


def test_full_mode_the_trainer_hands_the_local_teacher_to_the_engines_step(model_dir, tokenizer) -> None:
    """`--distill-mode full` through the server's `Trainer` and a real `TorchEngine`: no per-token
    advantages are built (distill_terms is not called), the engine's step reads the local teacher's
    logits, and the step's row carries the exact reverse KL to that teacher, computed here from two
    plain forwards (a teacher perturbed away from the student, so it is not 0)."""
    import torch

    from swarm.config.train import TrainConfig
    from swarm.engine.torch_engine import TorchEngine
    from swarm.samples import TrainSample
    from swarm.server.batcher import Batcher, FinishedEpisode
    from swarm.server.trainer import GenerationGate, Trainer

    engine = TorchEngine(model_dir, seed=0, device="cpu", reference=False)
    teacher = LocalTeacher(model_dir, device="cpu")
    with torch.no_grad():
        for p in teacher.model.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    ids = tokenizer.encode("What is 12+30? 42", add_special_tokens=False)
    mask = [0] * (len(ids) - 2) + [1, 1]
    with torch.no_grad():
        s = torch.log_softmax(engine.model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        t = torch.log_softmax(teacher.model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    own = [0.0, *s.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).tolist()]
    kl = (s.exp() * (s - t)).sum(-1)[-2:].mean().item()
    assert kl > 1e-4

    batcher = Batcher(group_size=2, batch_groups=1)
    g = batcher.admit("t", "e1")
    batcher.admit("t", "e2")
    for e, reward in (("e1", 1.0), ("e2", 0.0)):
        batcher.finish(g.group_id, FinishedEpisode(e, reward, [TrainSample(ids, mask, own, e, g.group_id, reward)]))
    rows: list[dict] = []

    class Rows:
        def write(self, record: dict) -> None:
            rows.append(record)

    config = TrainConfig(distill_coef=1.0, reward_coef=0.0, distill_mode="full")
    trainer = Trainer(engine, batcher, GenerationGate(), config, Rows(), teacher=teacher)

    async def step() -> None:
        trainer.kick()
        await trainer.wait()

    asyncio.run(step())
    assert trainer.errors == 0 and len(rows) == 1, trainer.last_error
    assert rows[0]["distill_kl"] == pytest.approx(kl, rel=1e-4) and rows[0]["distill_tokens"] == 4
    assert rows[0]["grad_norm"] > 0
