"""The swarm server: OpenAI-compatible gateway, episode registry, batcher, trainer, checkpoints.

    from swarm.server.app import create_app, serve
    serve(ServerConfig(model_dir=path, port=0))      # what `swarm serve` runs

Only `ServerConfig` is re-exported here: `swarm train`, the researcher and the
client's tooling read it and never serve, so importing this package must not
pull in FastAPI or an engine.

Modules, one concept each, bottom up:

    exceptions     the domain's errors (plain exceptions, no HTTP)
    events         typed topics: a component publishes, `Swarm` subscribes listeners once
    config         ServerConfig (every knob, with help text)
    episodes       registry of episodes, signed keys
    batcher        groups, windows, on-policy admission
    quotas         per-family slots of a batch
    buffer         the durable SQLite buffer of finished episodes
    recovery       Durability: persist before the ack, mark trained rows, replay after a restart
    leases         LeaseKeeper: lease renewal, expiry, hand-over, stalled groups
    trainer        Trainer: gate, steps, metrics rows; publishes step events
    control        LiveControl: the settings in force, live changes, pause, quota admission
    checkpoint     checkpoints and the `latest` pointer
    render         chat rendering, token continuity, detokenizing
    tracking       MLflow view of the metrics
    state          Swarm: the wiring, and the operations routes call
    errors         domain errors to HTTP status and JSON, body-size limit
    access         5xx counting middleware
    auth           who may call what (the routes' dependencies)
    openai_routes, openai_schema, swarm_routes, admin_routes, admin_schema   the HTTP surface
    app            FastAPI app, uvicorn; `bootstrap` (secrets), `cli` (`swarm serve`)
"""

from swarm.config.server import ServerConfig

__all__ = ["ServerConfig"]
