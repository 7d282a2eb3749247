"""The slot dataset: what verl's trainer draws its "prompts" from when the swarm server makes the rollouts.

verl's V1 trainer pulls `data.train_batch_size` prompts per step from a dataloader and
gives each a fresh uid (`trainer_base._fetch_one_gen_batch`). With the swarm server
as the rollout source there are no prompts to draw: each item is an empty slot that
the adapter fills with one completed Roost group (docs/verl.md, "Slots"; `data.custom_cls`).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

# verl's dataloader drops the last incomplete batch and restarts at StopIteration; a
# long, cheap range keeps it from ever restarting mid-run.
SLOTS = 1 << 30


class SlotDataset(Dataset):
    """`data.custom_cls`: constructed by verl's `create_rl_dataset` with its usual arguments."""

    def __init__(
        self,
        data_files: Any = None,
        tokenizer: Any = None,
        processor: Any = None,
        config: Any = None,
        max_samples: int = -1,
        **_: Any,
    ) -> None:
        self.size = SLOTS if max_samples is None or max_samples < 0 else int(max_samples)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        # raw_prompt is what verl's batch code counts rows by; an empty chat: nothing to render
        return {"raw_prompt": [], "slot": int(index)}


__all__ = ["SlotDataset"]
