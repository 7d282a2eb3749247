"""The config vocabulary: every settings model of Roost, below every package that uses it.

One pydantic model per thing configured, each field with its type, default,
bounds and help written once (docs/architecture.md, "One config model per thing
configured"); `options` derives command-line flags, config files and the
researcher's knobs from them. Pure pydantic plus typer/yaml: a client install
(no torch) imports it, and nothing here imports the server, engines or model.
"""

from swarm.config.fleet import FleetConfig
from swarm.config.lora import LoraSettings
from swarm.config.quotas import QuotaPhase
from swarm.config.run import RunConfig
from swarm.config.server import ServerConfig
from swarm.config.train import TrainConfig
from swarm.config.verl import VerlSettings
from swarm.config.vllm import VllmSettings

__all__ = [
    "FleetConfig",
    "LoraSettings",
    "QuotaPhase",
    "RunConfig",
    "ServerConfig",
    "TrainConfig",
    "VerlSettings",
    "VllmSettings",
]
