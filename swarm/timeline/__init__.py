"""Timeline: recorded calls (token ids) in, merged training samples out. Pure; no I/O."""

from swarm.timeline.continuity import ContinuedPrompt, PriorCall, continue_prompt
from swarm.timeline.merge import Call, MergeStats, Segment, merge, merge_stats
from swarm.timeline.samples import episode_samples

__all__ = ["Call", "ContinuedPrompt", "PriorCall", "continue_prompt", "MergeStats", "Segment", "episode_samples", "merge", "merge_stats"]
