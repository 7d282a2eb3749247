"""Put each new LoRA adapter into a running vLLM server as a new named version; unload the old one.

With `--lora-rank r` the `vllm` engine's vLLM serves the frozen base (the model directory
itself, never rewritten) with LoRA enabled (server.py), and after every training step only
the adapter travels: a few MB instead of the whole model (bench/sync_lora.py). A sync:

1. the trainer's adapter (`save_adapter`: adapter_model.safetensors + adapter_config.json)
   is written to a temp directory, fsynced and renamed to `adapters/v{N}`, then validated
   against the trainer's adapter (`validate_adapter`: readable, the same tensor names, shapes
   and dtypes, all finite, the same rank). A bad one is refused (`CheckpointRefused`) and
   deleted: vLLM never sees it and serves the last good version on;
2. `/v1/load_lora_adapter` loads it as `{served}-v{N}` while the old version keeps serving
   (`--max-loras 2`: both fit). vLLM refusing it (`VllmEngineError`) leaves the old version
   serving, nothing to roll back (a load that killed vLLM: a restart on the last good one);
3. the drain gate closes: new requests wait, those admitted under the old version finish (or
   are aborted after `drain_timeout_s`: `/pause?mode=abort`, then `/resume`). The served version
   becomes N: from now on requests name `{served}-v{N}` as their `model` and are labelled N. The
   gate opens;
4. `/v1/unload_lora_adapter` unloads every other version (counted in `unloaded`; one that fails
   is retried at the next sync) and the old directory is deleted.

So vLLM's `/v1/models` lists the base, the version serving and, during a sync, the next one
(`loaded`). The unload route only forgets the name; vLLM's worker keeps at most `--max-loras`
adapters in its LRU cache, the unloaded one being the first evicted by the next load. Version 0
is the trainer's fresh adapter (B = 0: the base's outputs), written and validated before vLLM
starts and loaded by `relabel`, the supervisor's `on_start`, which after a restart loads the last
good version again: every completion is labelled with an adapter version.

The API is `publisher.WeightPublisher`'s (`publish`, `offer`, `push`, `relabel`, `adopt`,
`served_version`, `counters`), plus `served_model`: the vLLM model name of the version serving, and
`unload` (every version out of vLLM: a policy removed from a shared vLLM, policies.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from swarm.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from swarm.engine.vllm.errors import VllmEngineError, post_route
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.publisher import Upstream
from swarm.engine.vllm.weights import CheckpointRefused, Layout, layout_of, validate
from swarm.tls import tls_context

log = logging.getLogger("swarm.engine.vllm")

#: writes an adapter (its two files) into the directory it is given
Save = Callable[[Path], None]


def adapter_layout(model: torch.nn.Module, adapter_name: str = "default") -> Layout:
    """Names, shapes and dtypes of the tensors `save_adapter(model, ..., adapter_name)` writes (what a sync
    must hold)."""
    from peft import get_peft_model_state_dict  # lazy: peft is loaded already (the trainer is a LoRA engine)

    return layout_of(get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False))


def validate_adapter(path: Path, layout: Layout, rank: int) -> None:
    """Refuse an adapter directory vLLM must not load (`CheckpointRefused` saying why): a config that is
    not JSON or of another rank, weights unreadable (truncated), of other names, shapes or dtypes, or
    holding NaN or inf."""
    path = Path(path)
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointRefused(f"{path.name}/{ADAPTER_CONFIG} is not readable JSON: {exc}") from None
    got = config.get("r") if isinstance(config, dict) else None
    if got != rank:
        raise CheckpointRefused(f"{path.name}: an adapter of rank {got!r}, the trainer's is {rank}")
    validate(path / ADAPTER_WEIGHTS, layout)


def write_adapter(save: Save, target: Path) -> Path:
    """`save` into a temp directory beside `target` (which must not exist), fsynced, renamed to `target`:
    a reader finds no adapter there or the whole of it, never a part."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    for f in tmp.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return target


def copy_adapter(src: Path) -> Save:
    """A `Save` that copies the adapter files of directory `src` (the missing ones fail validation)."""

    def save(dst: Path) -> None:
        dst.mkdir(parents=True)
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            if (Path(src) / name).is_file():
                shutil.copyfile(Path(src) / name, dst / name)

    return save


class AdapterPublisher:
    """Publishes LoRA adapters to the server `upstream` supervises as numbered versions, each under its own
    vLLM model name; directories live under `root` (the last good one, and a candidate during a sync)."""

    def __init__(
        self,
        root: Path,
        layout: Layout,
        rank: int,
        gate: DrainGate,
        upstream: Upstream,
        *,
        served_name: str,
        version: int,
        drain_timeout_s: float,
        abort_by_pause: bool = True,
    ) -> None:
        self.root = Path(root)
        self.layout = layout
        self.rank = rank
        self.gate = gate
        self.upstream = upstream
        self.served_name = served_name
        self.drain_timeout_s = drain_timeout_s
        #: how a drain that timed out ends the requests in flight: vLLM's `/pause?mode=abort` (every request
        #: of the process), or False: the streams end themselves on the gate's `aborting` (this adapter's
        #: only, where one vLLM serves several policies)
        self.abort_by_pause = abort_by_pause
        self.good_version = self.served_version = int(version)
        #: the last good adapter's directory: what serves, and what a restart loads
        self.good: Path | None = None
        #: the vLLM model name of the version serving ("" until loaded)
        self.served_model = ""
        #: the adapter names vLLM holds since its last start, oldest first
        self.loaded: list[str] = []
        #: syncs, sync_failures, refused, aborted_in_sync, unloaded, unload_failures
        self.counters: Counter[str] = Counter()
        self._aborted = False
        #: one client for every call (a new one per call costs ~25 ms: its TLS context), thread-safe; on the
        #: process's context, since a server of several policies and replicas has a publisher for each
        self._http = httpx.Client(timeout=120, verify=tls_context())

    def close(self) -> None:
        self._http.close()

    def prepare(self, save: Save) -> None:
        """Write and validate the trainer's adapter as the first last good (before vLLM starts; `relabel`
        loads it). Directories an earlier run left under `root` are removed."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        path = self.write(save, self.good_version)
        validate_adapter(path, self.layout, self.rank)
        self.good = path

    def write(self, save: Save, version: int) -> Path:
        """`save` written atomically as `root/v{version}` (`v{version}.2`, ... when that exists)."""
        target, n = self.root / f"v{version}", 1
        while target.exists():
            n += 1
            target = self.root / f"v{version}.{n}"
        return write_adapter(save, target)

    def _name(self, version: int) -> str:
        """The vLLM model name of `version`: `{served}-v{N}` (`.2`, ... when vLLM holds that name already)."""
        base = name = f"{self.served_name}-v{version}"
        n = 1
        while name in self.loaded:
            n += 1
            name = f"{base}.{n}"
        return name

    # -- versions ---------------------------------------------------------------
    def relabel(self) -> None:
        """The server (just started) serves the base alone: load the last good adapter, labelled with its version."""
        self.loaded.clear()
        if self.good is None:
            raise VllmEngineError("no adapter to serve: prepare() was not called")
        name = self._name(self.good_version)
        self._load(name, self.good)
        self.served_model, self.served_version = name, self.good_version
        log.info("vLLM serves adapter %s as version %d (%s)", self.good, self.good_version, name)

    def adopt(self, version: int) -> None:
        """Label the adapter served now `version` (a resume sets the trainer's after a load): it is loaded
        again under that version's name, and the old name unloaded."""
        with self.upstream.lock:
            if int(version) != self.served_version and self.good is not None:
                self._switch(self.good, int(version), keep_dir=True)

    # -- publishing -------------------------------------------------------------
    def publish(self, save: Save, version: int) -> dict[str, float]:
        """Serve the adapter `save` writes as `version`; the sync's timings as metrics."""
        t0 = time.perf_counter()
        path = self.write(save, version)
        return {"vllm_write_s": time.perf_counter() - t0, **self.push(path, version)}

    def offer(self, path: Path, version: int, *, validate_first: bool = True) -> dict[str, float]:
        """Serve the adapter in directory `path` as `version` (what `publish` does with the trainer's)."""
        return self.push(self.stage(path, version), version, validate_first=validate_first)

    def stage(self, path: Path, version: int, *, link: bool = False) -> Path:
        """A copy of the adapter directory `path` as this publisher's candidate for `version` (`link` is the
        weight publisher's; an adapter is a few MB, copied)."""
        return self.write(copy_adapter(path), version)

    def check(self, candidate: Path) -> None:
        """Validate the adapter directory `candidate`: a bad one is counted (`refused`), deleted, raised."""
        try:
            validate_adapter(candidate, self.layout, self.rank)
        except CheckpointRefused:
            self.counters["refused"] += 1
            shutil.rmtree(candidate, ignore_errors=True)
            raise

    def push(self, candidate: Path, version: int, validate_first: bool = True) -> dict[str, float]:
        """Validate the adapter directory `candidate`, load it, drain, serve it, unload the others.

        `CheckpointRefused` (deleted, never sent) or `VllmEngineError` (vLLM did not load it) on
        failure; either way the last good version serves on.
        """
        t0 = time.perf_counter()
        if validate_first:
            self.check(candidate)
        t_valid = time.perf_counter() - t0
        with self.upstream.lock:
            if not self._healthy():
                self.upstream.recover("found dead before an adapter sync")
            t_wait = time.perf_counter() - t0 - t_valid
            timings = self._switch(candidate, version)
        return {"vllm_validate_s": t_valid, "vllm_wait_s": t_wait, **timings}

    def _switch(self, path: Path, version: int, keep_dir: bool = False) -> dict[str, float]:
        """Load `path` as `version` beside the version serving, drain, serve it, unload the others (under
        the upstream's lock)."""
        name = self._name(version)
        t0 = time.perf_counter()
        try:
            self._load(name, path)
        except VllmEngineError as exc:
            self.counters["sync_failures"] += 1
            if not keep_dir:
                shutil.rmtree(path, ignore_errors=True)
            if not self._healthy():
                self.upstream.recover(f"vLLM went away loading an adapter ({exc})")  # on the last good one
            raise VllmEngineError(
                f"vLLM could not load the adapter of version {version}; version {self.served_version} serves on"
            ) from exc
        load_s = time.perf_counter() - t0
        self._aborted = False
        drain_s = self.gate.drain(self.drain_timeout_s, self._abort)
        old = self.good
        try:
            self.good, self.good_version = path, version
            self.served_model, self.served_version = name, version
            self.counters["syncs"] += 1
            if self._aborted:  # /pause?mode=abort ended the stragglers and left vLLM paused
                try:
                    self._post("/resume")
                except VllmEngineError as exc:  # a restart serves the new version (the last good) anyway
                    self.upstream.restart(f"vLLM did not resume after the aborts of an adapter sync ({exc})")
        finally:
            self.gate.reopen()
        t1 = time.perf_counter()
        self._unload_others()
        if old is not None and old != path:
            shutil.rmtree(old, ignore_errors=True)
        return {"vllm_reload_s": load_s, "vllm_drain_s": drain_s, "vllm_unload_s": time.perf_counter() - t1}

    def unload(self) -> None:
        """Unload every version of this publisher's from vLLM: nothing serves after (a policy removed from a
        vLLM it shares with others, swarm/engine/vllm/policies.py; under the upstream's lock)."""
        self.served_model = ""
        self._unload_others()

    def _load(self, name: str, path: Path) -> None:
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(path).resolve())})
        self.loaded.append(name)

    def _unload_others(self) -> None:
        """Unload every adapter vLLM holds but the one serving (no request can name them any more)."""
        for name in [n for n in self.loaded if n != self.served_model]:
            try:
                self._post("/v1/unload_lora_adapter", {"lora_name": name}, missing_ok=True)
            except VllmEngineError as exc:
                self.counters["unload_failures"] += 1
                log.warning("could not unload adapter %s (retried at the next sync): %s", name, exc)
                continue
            self.loaded.remove(name)
            self.counters["unloaded"] += 1

    def _abort(self, running: int) -> None:
        """The drain timed out: end the `running` requests (they finish with `finish_reason: abort`)."""
        log.warning(
            "%d requests still running after %.0fs: aborting them for the adapter sync", running, self.drain_timeout_s
        )
        self.counters["aborted_in_sync"] += running
        if self.abort_by_pause:
            self._aborted = True
            self._post("/pause", params={"mode": "abort"})

    def _healthy(self) -> bool:
        """`/health` answers 200 (the supervisor's check, on this publisher's client)."""
        try:
            return self._http.get(self.upstream.url + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def _post(
        self,
        route: str,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Any:
        """POST a route of vLLM; `VllmEngineError` unless it answers 200 (or 404 with `missing_ok`)."""
        return post_route(self._http.post, self.upstream.url, route, body, params, missing_ok)
