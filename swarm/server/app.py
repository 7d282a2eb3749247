"""Build the FastAPI app and run it under uvicorn.

    from swarm.server.app import ServerConfig, create_app, serve
    app = create_app(ServerConfig(engine="fake", model_dir=d), FakeEngine(d))   # tests, embedding
    serve(ServerConfig(model_dir=d, port=0))                                    # blocks; `swarm serve`

`create_app` resumes from the latest checkpoint in `out_dir` (if any) before it
returns, so a restarted server answers its first request with the same policy
version. `serve` owns the engine it builds: it closes it when uvicorn exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

from fastapi import FastAPI

from swarm.config.server import ServerConfig
from swarm.engine.base import Engine, EngineError
from swarm.engine.fake import FakeEngine, FakePolicyHost
from swarm.folder_lock import describe
from swarm.model.teacher import TeacherError, check_teacher_of
from swarm.run_layout import SECRETS_FILE, SERVER_FILE
from swarm.server.access import ServerErrorCounter
from swarm.server.access_log import ACCESS_LOG_FILE, AccessLogMiddleware
from swarm.server.admin_routes import router as admin_router
from swarm.server.anthropic_routes import router as anthropic_router
from swarm.server.bootstrap import clear_text_note, ensure_secrets, hold_out_dir
from swarm.server.errors import BodyLimitMiddleware, install_error_handlers
from swarm.server.openai_routes import router as openai_router
from swarm.server.policies import PolicyRouter
from swarm.server.policy_routes import router as policy_router
from swarm.server.policy_routes import start_policy, stop_policy, wire_stop
from swarm.server.responses_routes import router as responses_router
from swarm.server.state import Swarm
from swarm.server.swarm_routes import router as swarm_router
from swarm.server.tinker_hooks import tinker_service
from swarm.tinker.routes import install as install_tinker

log = logging.getLogger("swarm.server")


def _with_vllm(start: Callable[[], Any]) -> Any:
    """`start()` an engine or host that runs vLLM; without a usable vLLM, exit with the one line that
    names what to install (`swarm serve` prints it, no traceback)."""
    from swarm.engine.vllm.server import VllmUnavailable  # lazy: only a vllm engine needs it

    try:
        return start()
    except VllmUnavailable as exc:
        raise SystemExit(str(exc)) from None


def make_host(config: ServerConfig) -> Any:
    """A server of several policies: the shared base with one adapter per `config.policies` entry (with
    `--engine vllm`, trained in process and served as adapters of one vLLM: swarm/engine/vllm/policies.py)."""
    assert config.policies
    if config.engine == "fake":
        host: Any = FakePolicyHost(config.model_dir, seed=config.seed)
    elif config.engine == "vllm":
        from swarm.engine.vllm.policies import VllmPolicyHost  # lazy: the trainer side imports torch

        ranks = [config.for_policy(spec).lora.rank for spec in config.policies]
        host = _with_vllm(
            lambda: VllmPolicyHost(
                config.model_dir,
                config.out_dir / "vllm",
                max_rank=max(ranks),
                max_loras=len(ranks) + 1,  # each policy's version serving, and one being switched in
                seed=config.seed,
                device=config.device,
                settings=config.vllm,
                served_name=config.served_model_name,
            )
        )
    else:
        from swarm.engine.policies import PolicyHost  # lazy: importing torch takes seconds

        host = PolicyHost(config.model_dir, seed=config.seed, device=config.device)
    from swarm.engine.lora import LoraError  # lazy: beside the engines' imports

    for spec in config.policies:
        try:
            host.add(spec.name, config.for_policy(spec).lora)
        except LoraError as exc:
            raise SystemExit(f"swarm serve: policy {spec.name}: {exc}") from None
    return host


def make_engine(config: ServerConfig) -> Engine:
    """The engine named by `config.engine` (a `PolicyHost` when `config.policies` names several)."""
    if config.policies:
        return make_host(config)
    if config.engine == "fake":
        return FakeEngine(config.model_dir, seed=config.seed, history=8)  # a served fake keeps no growing log
    if config.engine == "torch":
        from swarm.engine.lora import LoraError  # lazy: beside the torch engine's import
        from swarm.engine.torch_engine import TorchEngine  # lazy: importing torch takes seconds

        try:
            return TorchEngine(config.model_dir, seed=config.seed, device=config.device, lora=config.lora)
        except LoraError as exc:  # --lora-rank too large, --lora-targets matching nothing: one line saying why
            raise SystemExit(f"swarm serve: {exc}") from None
    if config.engine == "vllm":
        from swarm.engine.vllm.engine import VllmEngine  # lazy: the trainer side imports torch

        return _with_vllm(
            lambda: VllmEngine(
                config.model_dir,
                config.out_dir / "vllm",
                seed=config.seed,
                device=config.device,
                settings=config.vllm,
                served_name=config.served_model_name,
                lora=config.lora,
            )
        )
    if config.engine == "verl":
        try:
            from swarm.engine.verl.engine import VerlEngine  # lazy: verl, Ray and torch are an optional extra
        except ImportError as exc:
            raise SystemExit(f"--engine verl needs verl: pip install 'roost[verl]' (missing: {exc.name})") from None
        return VerlEngine(config)
    raise ValueError(f"unknown engine {config.engine!r}; known: torch, vllm, verl, fake")


def create_app(config: ServerConfig, engine: Any) -> FastAPI:
    """The app of one model (`engine` an `Engine`), or of several policies (`config.policies`, `engine`
    the host holding their adapters: one `Swarm` per policy, routed by `model`)."""
    if config.policies:
        if not (config.token and config.admin_token and config.secret):
            config = config.with_secrets()  # one set for every policy: one key verifies anywhere
        swarms = {p.name: Swarm(config.for_policy(p), engine.policy(p.name)) for p in config.policies}
        host = engine
        unserved = sorted(
            d.name for d in (Path(config.out_dir) / "policies").glob("*") if d.is_dir() and d.name not in swarms
        )
        if unserved:  # added live (`swarm ctl policy add`, the Tinker API) before a restart, or left out
            log.warning(
                "%d polic%s under %s/policies not in this start's list, not served: %s%s (a policy added live "
                "does not come back with a restart; `swarm ctl policy add NAME` serves one again from its checkpoint)",
                len(unserved),
                "y" if len(unserved) == 1 else "ies",
                config.out_dir,
                ", ".join(unserved[:5]),
                f" and {len(unserved) - 5} more" if len(unserved) > 5 else "",
            )
    else:
        swarms = {"": Swarm(config, engine)}
        host = None
    router = PolicyRouter(swarms)
    swarm = router.default

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for one in router:
            start_policy(one)  # lease sweepers; complete groups replayed from the durable buffer train at once
        yield
        for one in router:  # (a removed policy was stopped when it was removed)
            await stop_policy(one)  # never exit halfway through a step; Ctrl-C keeps the last steps

    app = FastAPI(title="Roost swarm server", version="1", lifespan=lifespan)
    app.state.swarm = swarm
    app.state.policies = router
    app.state.host = host
    app.state.config = config
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=swarm.config.max_body_bytes)
    app.add_middleware(ServerErrorCounter, counters=swarm.counters)  # http_5xx in status, and logged
    app.add_middleware(AccessLogMiddleware, path=config.out_dir / ACCESS_LOG_FILE)  # outermost: OUT/access.jsonl
    app.include_router(swarm_router)
    app.include_router(admin_router)
    app.include_router(policy_router)
    app.include_router(openai_router)
    app.include_router(anthropic_router)  # POST /v1/messages
    app.include_router(responses_router)  # POST /v1/responses
    install_tinker(app, tinker_service(config, host, router))  # /api/v1/*: the Tinker API (docs/tinker.md)

    @app.get("/health", tags=["swarm"])
    async def health() -> dict[str, Any]:
        return {"ok": True, "policy_version": swarm.engine.policy_version, "stopping": swarm.stopping}

    return app


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _print(line: str) -> None:
    print(line, flush=True)


def serve(
    config: ServerConfig,
    engine: Engine | None = None,
    announce: Callable[[str], None] = _print,
    held: IO[str] | None = None,
) -> int:
    """Run a server until stopped (Ctrl-C, admin stop, or `max_steps`); returns an exit code.

    Binds the socket itself so `port=0` works: the chosen URL is announced and
    written to `out_dir/server.json` (URL and pid, never the tokens). Holds `out_dir/server.lock`
    while it runs: one server per folder (swarm/folder_lock.py).
    """
    import uvicorn  # lazy: only a serving process needs the ASGI server

    from swarm.server.hangup import HangupServer  # lazy: uvicorn's server, SIGHUP a graceful stop too
    from swarm.server.http_protocol import json_error_protocol  # lazy: subclasses uvicorn's protocols

    # before anything reads or writes the folder (`held`: the CLI took it before writing config.yaml)
    held = held or hold_out_dir(config.out_dir)
    config, source = ensure_secrets(config)  # env, out_dir/secrets.json, or generated (and saved)
    if config.teacher:  # a teacher that cannot score the student's ids: refused before anything starts
        try:
            check_teacher_of(config.teacher, config.model_dir)
        except TeacherError as exc:
            raise SystemExit(f"swarm serve: {exc}") from None
    sock = _bind(config.host, config.port)
    port = sock.getsockname()[1]
    scheme = "https" if config.tls else "http"
    url = f"{scheme}://{config.host if ':' not in config.host else f'[{config.host}]'}:{port}"
    describe(held, url=url)  # what a second server on this folder is told
    own_engine = engine is None
    engine = engine if engine is not None else make_engine(config)
    try:
        app = create_app(config, engine)
    except EngineError as exc:  # a checkpoint it resumes does not fit the settings given: one line, no trace
        if own_engine:
            asyncio.run(engine.close())
        raise SystemExit(f"swarm serve: {exc}") from None
    swarm: Swarm = app.state.swarm
    server = HangupServer(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=10,
            http=json_error_protocol(),  # unparsable request: a JSON 400 too
            ssl_certfile=config.ssl_certfile,
            ssl_keyfile=config.ssl_keyfile,
        )
    )

    def stop() -> None:
        server.should_exit = True

    router: PolicyRouter = app.state.policies
    wire_stop(list(router), lambda: list(router), stop)
    app.state.stop_server = stop
    config.out_dir.mkdir(parents=True, exist_ok=True)
    (config.out_dir / SERVER_FILE).write_text(
        json.dumps(
            {"url": url, "pid": os.getpid(), "model": swarm.model_name, "policies": [n for n in router.names() if n]},
            indent=2,
        )
    )
    if config.policies:
        announce(f"Roost swarm server on {url} (policies {', '.join(router.names())} on {config.model_dir})")
    else:
        announce(
            f"Roost swarm server on {url} (model {swarm.model_name}, policy version "
            f"{engine.policy_version}, step {swarm.trainer.step})"
        )
    shown = {"config": "(as given)", "env": "(from the environment)"}
    announce(f"  worker token: {shown.get(source['token'], config.token)}")
    announce(f"  admin token:  {shown.get(source['admin_token'], config.admin_token)}")
    if "generated" in source.values():
        announce(f"  generated secrets saved to {config.out_dir / SECRETS_FILE} (mode 0600; reused on restart)")
    announce(f"  out dir:      {config.out_dir}")
    if note := clear_text_note(config):
        announce(f"  note: {note}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if own_engine:
            asyncio.run(engine.close())
        held.close()  # the folder is free for the next server (the process's end would free it too)
    return 0
