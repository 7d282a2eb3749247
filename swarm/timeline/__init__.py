"""Timeline: recorded calls (token ids) in, merged training samples out. Pure; no I/O.

`Call` and `TrainSample` live in `swarm.samples` (the ground floor); they are
re-exported here because they are what this package takes and returns.
"""

from swarm.samples import Call, TrainSample
from swarm.timeline.continuity import ContinuedPrompt, continue_prompt
from swarm.timeline.merge import MergeStats, Segment, merge, merge_stats
from swarm.timeline.samples import episode_samples

__all__ = [
    "Call",
    "ContinuedPrompt",
    "MergeStats",
    "Segment",
    "TrainSample",
    "continue_prompt",
    "episode_samples",
    "merge",
    "merge_stats",
]
