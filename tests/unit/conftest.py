"""Makes `torch_helpers` importable by the engine tests (--import-mode=importlib)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
