"""The swarm client SDK: claim episodes, run agent code against their OpenAI endpoint, report rewards.

    from swarm.client import SwarmClient, run_fleet
    client = SwarmClient("http://127.0.0.1:8000", token)
    with client.episode(task_id="t-1") as ep:
        ep.openai.chat.completions.create(model=ep.model, messages=[...])
        ep.finish(reward=1.0)
    run_fleet(client, workflow, dataset, n=8, concurrency=8)

Never imports torch or transformers: a client machine needs neither.
"""

from swarm.client._async import AsyncEpisode, AsyncSwarmClient
from swarm.client._client import Episode, SwarmClient
from swarm.client._fleet import FleetStats, run_fleet
from swarm.client._retry import InvalidReward, ServerStopping, SwarmAPIError, SwarmError, SwarmUnavailable
from swarm.client._team import TeamClient, TeamEpisode, TeamError, TeamLost

__all__ = [
    "AsyncEpisode",
    "AsyncSwarmClient",
    "Episode",
    "FleetStats",
    "InvalidReward",
    "ServerStopping",
    "SwarmAPIError",
    "SwarmClient",
    "SwarmError",
    "SwarmUnavailable",
    "TeamClient",
    "TeamEpisode",
    "TeamError",
    "TeamLost",
    "run_fleet",
]
