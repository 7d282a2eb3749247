"""Which build of the embedded model a directory holds, readable without torch.

The CLI asks this before every `swarm train` on the default model: an install upgraded to a
new recipe (a longer context, a new warm start) must not keep training the old build for ever.
Importing `swarm.model.build` would cost the seconds torch and transformers take to import.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Bump when the recipe changes (tokenizer corpus, architecture, warm start):
#: an existing model with another version is rebuilt by `init_model`.
#: 6: a 4,096-token context (was 1,024), so agent frameworks with 2-3k-token system prompts
#: (smolagents, DSPy ReAct) fit; the weights and warm start are those of build 5.
#: 7: built on pinned CPU numerics (swarm/model/numerics.py): build 6 gave other weights on an
#: AVX-512 machine than on AVX2 (calc sampled 0.51 against 0.33), so a rebuild must come out the same.
BUILD_VERSION = 7
MARKER = "roost_model.json"


def read_marker(model_dir: Path) -> dict | None:
    """The marker of a finished build in `model_dir`; None when there is none (or it is unreadable)."""
    try:
        marker = json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def built_version(model_dir: Path) -> int | None:
    """The recipe version of a finished build in `model_dir`; None when there is none (or it is unreadable)."""
    version = (read_marker(model_dir) or {}).get("version")
    return version if isinstance(version, int) else None
