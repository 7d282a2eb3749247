"""The README's client snippet runs as written against a real server on loopback."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet(title: str) -> str:
    section = README.read_text().split(f"## {title}", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_writing_a_client_snippet_runs(server) -> None:
    code = _snippet("Writing a client")
    assert 'SwarmClient("http://127.0.0.1:8000", token="...")' in code  # what a reader copies
    code = code.replace('"http://127.0.0.1:8000"', repr(server.url)).replace('token="..."', f"token={server.token!r}")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the project's own README
    assert server.swarm.status().counters.get("finished") == 1
