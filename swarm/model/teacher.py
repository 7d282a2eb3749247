"""The teacher of on-policy distillation: logprobs of the student's own tokens under another model.

    info = check_teacher("runs/arith-teacher", student_tokenizer)   # refused here (TeacherError, one line)
    teacher = open_teacher(info, device="cpu")
    advantages, kl = await distill_terms(teacher, samples, coef=1.0)  # per token, for `TrainBatch`

A teacher is one of two things, behind one `Teacher` interface (`logprobs(sequences)`):

* `LocalTeacher`: a model directory, a checkpoint, or a `swarm train` run folder (its last
  checkpoint, as `swarm eval --model` resolves it), loaded frozen into the server's process and run
  teacher-forced over each sample's ids (batched under a token budget, no grad);
* `HttpTeacher`: any OpenAI-compatible server that returns prompt logprobs on `/v1/completions`
  (the prompt as token ids, `echo: true`, `logprobs: 1`, `max_tokens: 1`): vLLM does, and so does
  Roost's own `swarm serve` (torch engine). A bearer token, if the server wants one, comes from
  `ROOST_TEACHER_API_KEY`.

Both are checked before anything starts (`check_teacher`), because a teacher that cannot score the
student's ids would only show up as garbage advantages: a local teacher's tokenizer must have the
student's vocabulary exactly (`get_vocab()` equal); a URL must answer a probe (the student's ids of a
fixed text plus ids spread over its vocabulary) with a finite logprob for every prompt token but the
first, and its echoed tokens must spell the student's text for those ids (so its tokenizer maps
them the same way).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from swarm.samples import TrainSample

#: the fixed text of the URL probe: ASCII words, digits and punctuation, as the built-in tasks use
PROBE_TEXT = "What is 17 + 25? Answer: 42. The quick brown fox jumps over the lazy dog."
#: how many more ids of the probe are spread over the student's vocabulary
PROBE_SPREAD = 24
API_KEY_ENV = "ROOST_TEACHER_API_KEY"


class TeacherError(ValueError):
    """A teacher that cannot be used (unreachable, no prompt logprobs, another tokenizer): one line why."""


class Teacher(Protocol):
    """Scores token sequences: `logprobs(seqs)[k][i]` = log p_teacher(seqs[k][i] | seqs[k][:i]) for
    i >= 1, and 0.0 at i = 0 (nothing predicts the first token): aligned with a sample's ids, as its
    rollout logprobs are."""

    async def logprobs(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TeacherInfo:
    """A checked teacher: a local model directory, or a URL with the model name it serves."""

    spec: str
    model_dir: Path | None = None
    url: str | None = None
    model: str | None = None

    @property
    def is_url(self) -> bool:
        return self.url is not None


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def _api_base(url: str) -> str:
    """`http://host:port`, `.../`, `.../v1` -> the URL the OpenAI paths (`/v1/...`) hang off."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _headers() -> dict[str, str]:
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def completion_body(model: str, ids: Sequence[int]) -> dict[str, Any]:
    """The request that makes an OpenAI-compatible server score a prompt: echo it with logprobs.
    `max_tokens: 1` (not 0) because servers differ on 0; the one generated token is ignored."""
    return {"model": model, "prompt": list(ids), "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0.0}


def parse_prompt_logprobs(body: Any, n: int) -> list[float]:
    """The prompt logprobs of an echoed `/v1/completions` answer for a prompt of `n` ids (first 0.0);
    TeacherError when the answer carries none (a server that ignores `echo` or `logprobs`)."""
    try:
        lps = body["choices"][0]["logprobs"]["token_logprobs"]
    except (KeyError, IndexError, TypeError):
        lps = None
    if not isinstance(lps, list) or len(lps) < n:
        raise TeacherError("its /v1/completions returned no prompt logprobs for echo=true, logprobs=1")
    out = [0.0]
    for v in lps[1:n]:
        if not isinstance(v, int | float) or not math.isfinite(v):
            raise TeacherError(f"its /v1/completions returned a prompt logprob that is not a finite number: {v!r}")
        out.append(float(v))
    return out


def _echoed_tokens(body: Any, n: int) -> list[str] | None:
    try:
        tokens = body["choices"][0]["logprobs"]["tokens"]
    except (KeyError, IndexError, TypeError):
        return None
    return list(tokens[:n]) if isinstance(tokens, list) and len(tokens) >= n else None


def probe_ids(tokenizer: Any) -> list[int]:
    """The student's ids of `PROBE_TEXT` and `PROBE_SPREAD` ids spread over its vocabulary whose
    text is plain printable ASCII (what every server detokenizes alike)."""
    ids = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    size = len(tokenizer)
    step = max(1, size // (PROBE_SPREAD * 4))
    spread: list[int] = []
    for i in range(0, size, step):
        text = tokenizer.decode([i])
        if i not in special and text.isascii() and text.isprintable() and text.strip():
            spread.append(i)
    stride = max(1, len(spread) // PROBE_SPREAD)
    return ids + spread[::stride][:PROBE_SPREAD]


def _token_matches(echoed: list[str], ids: list[int], tokenizer: Any) -> bool:
    """Do the teacher's echoed tokens name the student's ids? vLLM may echo `token_id:N`; others echo
    each token's text (compared joined, so detokenizers that split text differently still agree)."""
    if echoed and all(t.startswith("token_id:") for t in echoed):
        return [int(t.split(":", 1)[1]) for t in echoed] == ids
    return "".join(echoed) == "".join(tokenizer.decode([i]) for i in ids)


def _check_url(spec: str, tokenizer: Any, timeout: float) -> TeacherInfo:
    base = _api_base(spec)
    try:
        with httpx.Client(base_url=base, headers=_headers(), timeout=timeout) as client:
            r = client.get("/v1/models")
            if r.status_code in (401, 403):  # a swarm serve's worker token, or the provider's key
                why = (
                    f"its key in {API_KEY_ENV} is not accepted"
                    if os.environ.get(API_KEY_ENV)
                    else (f"set {API_KEY_ENV} to its key (a swarm serve's worker token)")
                )
                raise TeacherError(f"{base}/v1/models answered {r.status_code}: {why}")
            if r.status_code != 200:
                raise TeacherError(f"{base}/v1/models answered {r.status_code}")
            models = [m.get("id") for m in r.json().get("data", []) if isinstance(m, dict)]
            if not models or not isinstance(models[0], str):
                raise TeacherError(f"{base}/v1/models names no model")
            model = models[0]
            ids = probe_ids(tokenizer)
            r = client.post("/v1/completions", json=completion_body(model, ids))
            if r.status_code != 200:
                detail = r.text.strip().replace("\n", " ")[:200]
                raise TeacherError(
                    f"its /v1/completions refused a prompt-logprob request ({r.status_code}: {detail}); "
                    "a teacher must return prompt logprobs (echo=true, logprobs=1)"
                )
            body = r.json()
    except httpx.HTTPError as exc:
        raise TeacherError(f"cannot reach {base}: {type(exc).__name__}: {exc}") from None
    except ValueError as exc:
        if isinstance(exc, TeacherError):
            raise
        raise TeacherError(f"{base} answered something that is not JSON") from None
    parse_prompt_logprobs(body, len(ids))
    echoed = _echoed_tokens(body, len(ids))
    if echoed is None or not _token_matches(echoed, ids, tokenizer):
        raise TeacherError(
            f"model {model!r} does not tokenize as the student does (the echoed tokens of the student's "
            "probe ids differ): the teacher's logprobs would score other tokens; use a teacher with the "
            "student's tokenizer"
        )
    return TeacherInfo(spec=spec, url=base, model=model)


def _check_local(spec: str, tokenizer: Any) -> TeacherInfo:
    from transformers import AutoTokenizer  # lazy: transformers takes seconds

    from swarm.model.adapter import tokenizer_dir  # lazy: adapter imports torch and transformers
    from swarm.model.evaluate import run_models  # lazy: evaluate pulls in the task runner

    path = Path(spec).expanduser()
    if not path.exists():
        raise TeacherError(f"{path} does not exist (a model directory, a checkpoint, a run folder or a URL)")
    try:
        model_dir, _ = run_models(path)
    except ValueError as exc:
        raise TeacherError(str(exc)) from None
    try:
        theirs = AutoTokenizer.from_pretrained(tokenizer_dir(model_dir))
    except (OSError, ValueError) as exc:
        raise TeacherError(f"{model_dir} has no tokenizer: {exc}".splitlines()[0]) from None
    ours, other = tokenizer.get_vocab(), theirs.get_vocab()
    if ours != other:
        differ = len(set(ours.items()) ^ set(other.items()))
        raise TeacherError(
            f"{model_dir} has another tokenizer than the student ({len(other)} tokens vs {len(ours)}, "
            f"{differ} (token, id) pairs differ): its logprobs would score other tokens"
        )
    if not (model_dir / "config.json").is_file() and not (model_dir / "adapter_config.json").is_file():
        raise TeacherError(f"{model_dir} is not a model directory (no config.json)")
    return TeacherInfo(spec=spec, model_dir=model_dir)


def check_teacher(spec: str, student_tokenizer: Any, timeout: float = 30.0) -> TeacherInfo:
    """Check a `--teacher` before anything starts; `TeacherError` (one line) says what is wrong."""
    try:
        return _check_url(spec, student_tokenizer, timeout) if is_url(spec) else _check_local(spec, student_tokenizer)
    except TeacherError as exc:
        raise TeacherError(f"--teacher {spec}: {exc}") from None


def check_teacher_of(spec: str, student_dir: Path) -> TeacherInfo | None:
    """`check_teacher` against the student model directory's tokenizer (before its engine is built);
    None when the student is not there yet (the embedded model is built at start: the server checks)."""
    from transformers import AutoTokenizer  # lazy: transformers takes seconds

    from swarm.model.adapter import tokenizer_dir  # lazy: adapter imports torch and transformers

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(Path(student_dir)))
    except (OSError, ValueError):
        return None
    return check_teacher(spec, tokenizer)


class LocalTeacher:
    """A frozen causal LM in this process, scoring teacher-forced under a token budget per forward."""

    def __init__(self, model_dir: Path, device: str | None = None, budget_tokens: int = 8192) -> None:
        import torch  # lazy: torch takes seconds; a URL teacher never needs it

        from swarm.model.adapter import load_causal_lm  # lazy: adapter imports torch and transformers

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model = load_causal_lm(model_dir)
        if self.device.type == "cuda":
            model = model.to(torch.bfloat16)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.budget = budget_tokens
        self._lock = asyncio.Lock()  # one scoring at a time: the forward is this model's only user

    def score(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        """Teacher-forced logprobs, right-padded micro-batches sorted by length (no grad); of the
        teacher's distribution at `temperature` (its logits divided by it)."""
        import torch  # lazy: see __init__

        from swarm.engine.policy_step import micro_batches  # lazy: policy_step imports torch

        out: list[list[float]] = [[] for _ in sequences]
        with torch.inference_mode():
            for part in micro_batches([len(s) for s in sequences], self.budget):
                width = max(len(sequences[i]) for i in part)
                ids = torch.zeros((len(part), width), dtype=torch.long)
                attn = torch.zeros((len(part), width), dtype=torch.long)
                for row, i in enumerate(part):
                    ids[row, : len(sequences[i])] = torch.tensor(list(sequences[i]))
                    attn[row, : len(sequences[i])] = 1
                ids, attn = ids.to(self.device), attn.to(self.device)
                logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
                if temperature != 1.0:
                    logits = logits / temperature
                lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).cpu()
                for row, i in enumerate(part):
                    out[i] = [0.0, *lp[row, : len(sequences[i]) - 1].tolist()]
        return out

    async def logprobs(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        async with self._lock:
            return await asyncio.to_thread(self.score, sequences, temperature)

    async def close(self) -> None:
        self.model = None  # type: ignore[assignment]


class HttpTeacher:
    """An OpenAI-compatible server scoring each sequence by an echoed `/v1/completions` request."""

    def __init__(self, url: str, model: str, concurrency: int = 8, timeout: float = 120.0) -> None:
        self.model = model
        self._client = httpx.AsyncClient(base_url=url, headers=_headers(), timeout=timeout)
        self._slots = asyncio.Semaphore(concurrency)

    async def _one(self, ids: Sequence[int]) -> list[float]:
        async with self._slots:
            r = await self._client.post("/v1/completions", json=completion_body(self.model, ids))
        if r.status_code != 200:
            raise TeacherError(f"teacher answered {r.status_code}: {r.text[:200]}")
        return parse_prompt_logprobs(r.json(), len(ids))

    async def logprobs(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        if temperature != 1.0:  # ServerConfig refuses it at start; a caller of this class directly is told here
            raise TeacherError("a URL teacher returns one logprob per token: no temperature can be applied to it")
        return list(await asyncio.gather(*(self._one(s) for s in sequences)))

    async def close(self) -> None:
        await self._client.aclose()


def open_teacher(info: TeacherInfo, device: str | None = None) -> Teacher:
    """The teacher a checked `TeacherInfo` names (a local one is loaded here: seconds)."""
    if info.url is not None:
        return HttpTeacher(info.url, info.model or "")
    assert info.model_dir is not None
    return LocalTeacher(info.model_dir, device=device)


async def distill_terms(
    teacher: Teacher, samples: Sequence[TrainSample], coef: float, temperature: float = 1.0
) -> tuple[list[list[float]], dict[str, float]]:
    """Per-sample token advantages (aligned with each sample's ids) and the step's metrics:
    `distill_kl`, the token mean of log pi_student - log pi_teacher over the trained tokens (the
    teacher's logprobs at `temperature`)."""
    import torch  # lazy: see LocalTeacher

    from swarm.algorithms.distill import distill_advantages, reverse_kl  # lazy: imports torch

    teacher_lp = await teacher.logprobs([s.input_ids for s in samples], temperature)
    advantages: list[list[float]] = []
    kl_sum, tokens = 0.0, 0
    for s, t in zip(samples, teacher_lp):
        student = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        theirs = torch.tensor(t, dtype=torch.float32)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        mask[0] = False  # nothing predicts the first token
        advantages.append(distill_advantages(student, theirs, mask, coef).tolist())
        kl_sum += float(reverse_kl(student, theirs)[mask].sum())
        tokens += int(mask.sum())
    return advantages, {"distill_kl": kl_sum / tokens if tokens else 0.0, "distill_tokens": float(tokens)}


__all__ = [
    "API_KEY_ENV",
    "HttpTeacher",
    "LocalTeacher",
    "Teacher",
    "TeacherError",
    "TeacherInfo",
    "check_teacher",
    "check_teacher_of",
    "distill_terms",
    "open_teacher",
    "parse_prompt_logprobs",
    "probe_ids",
]
