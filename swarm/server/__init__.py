"""The swarm server: OpenAI-compatible gateway, episode registry, batcher, trainer, checkpoints.

    from swarm.server import ServerConfig, create_app, serve
    serve(ServerConfig(model_dir=path, port=0))      # what `swarm serve` runs

Modules, one concept each: `config` (ServerConfig), `episodes` (registry, signed
keys), `batcher` (groups, on-policy admission), `trainer` (gate, steps, metrics),
`checkpoint`, `render` (chat rendering, token continuity, detokenizing),
`openai_routes`, `swarm_routes`, `state` (the wiring), `app`, `cli`; `control` (live config,
pause), `quotas` (per-family slots), `admin_routes`, `bootstrap` (config file, persisted secrets).
"""

from swarm.server.app import create_app, make_engine, serve
from swarm.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app", "make_engine", "serve"]
