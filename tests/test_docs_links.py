"""Every document the repository cites is in the repository, and so is every section it cites.

A docstring or comment that says "see FOO.md" is only useful if a reader of this
checkout can open FOO.md. The scan covers the project's source, scripts, config and
docs (`.py .md .sh .txt .toml .yaml .yml .cfg .ini`); a citation is a `*.md` path
under `docs/`, one that climbs out with `../`, or an upper-case name (README.md,
DESIGN.md); lower-case bare names (`report.md`) are files the code writes, not
citations. A cited path resolves from the repository root or from the citing file's
folder, and must stay inside the repository. A citation followed by quoted section
names (`docs/verl.md, "Records"`) must name headings of that document.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".yaml", ".yml", ".cfg", ".ini"}
SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "mlruns"}
KEEP_HIDDEN = {".ci", ".github"}  # hidden folders that hold project scripts

MD_REF = re.compile(r"(?<![\w/.-])((?:\.\./|[\w.-]+/)*[\w.-]*\w\.md)\b")
# what follows a citation: optional `)`, `,` or `:`, then one or more quoted section names
SECTIONS = re.compile(r'\)?[,:]?\s*\(?((?:"[A-Z`][^"\n]{0,79}"(?:,\s*|\s+and\s+)?)+)')
# the folder beside the checkout that held notes which were never part of it
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b|\bshared/[A-Z][A-Z_]*\.md")


def _files() -> list[Path]:
    out = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and (not d.startswith(".") or d in KEEP_HIDDEN)
        )
        out.extend(Path(folder) / n for n in sorted(names) if Path(n).suffix in SUFFIXES)
    return out


FILES = _files()
THIS = Path(__file__).resolve()


def _is_citation(ref: str) -> bool:
    name = ref.rsplit("/", 1)[-1][: -len(".md")]
    return ref.startswith(("docs/", "../")) or "/docs/" in ref or name.replace("-", "_").isupper()


def _resolve(ref: str, citing: Path) -> Path | None:
    for base in (ROOT, citing.parent):
        target = (base / ref).resolve()
        if target.is_file() and target.is_relative_to(ROOT):
            return target
    return None


def _headings(doc: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")}


def _citations(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, cited path, cited section names) of each citation in `path`."""
    text = path.read_text(errors="replace")
    found = []
    for m in MD_REF.finditer(text):
        ref = m.group(1)
        if not _is_citation(ref):
            continue
        after = SECTIONS.match(text, m.end())
        sections = re.findall(r'"([^"\n]+)"', after.group(1)) if after else []
        found.append((text.count("\n", 0, m.start()) + 1, ref, sections))
    return found


def test_the_scan_sees_the_project() -> None:
    rel = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "docs/design.md", "docs/verl.md", "swarm/protocol.py", ".ci/vllm.sh"} <= rel


def test_every_cited_document_is_in_the_repository() -> None:
    missing = []
    for path in FILES:
        if path == THIS:
            continue
        for line, ref, _ in _citations(path):
            if _resolve(ref, path) is None:
                missing.append(f"{path.relative_to(ROOT)}:{line}: {ref}")
    assert missing == []


def test_every_cited_section_is_a_heading_of_its_document() -> None:
    missing = []
    for path in FILES:
        if path == THIS:
            continue
        for line, ref, sections in _citations(path):
            doc = _resolve(ref, path)
            if doc is None or not sections:
                continue
            for name in set(sections) - _headings(doc):
                missing.append(f"{path.relative_to(ROOT)}:{line}: {ref} has no heading {name!r}")
    assert missing == []


def test_nothing_points_outside_the_repository() -> None:
    bad = [
        f"{p.relative_to(ROOT)}:{p.read_text(errors='replace').count(chr(10), 0, m.start()) + 1}"
        for p in FILES
        if p != THIS
        for m in OUTSIDE.finditer(p.read_text(errors="replace"))
    ]
    assert bad == []


@pytest.mark.parametrize(
    "text, refs",
    [
        (
            'see DESIGN.md §3 and docs/verl.md, "Records" and "Padded layout".',
            [(1, "DESIGN.md", []), (1, "docs/verl.md", ["Records", "Padded layout"])],
        ),
        ("writes OUT/report/report.md and report.md; ../shared/VERL.md", [(1, "../shared/VERL.md", [])]),
        ('compile(code, "README.md", "exec")', [(1, "README.md", [])]),
    ],
    ids=["bare-name-and-sections", "outputs-and-outside", "string-literal"],
)
def test_the_scanner_finds_citations(tmp_path: Path, text: str, refs: list) -> None:
    f = tmp_path / "x.py"
    f.write_text(text)
    assert _citations(f) == refs
    assert _resolve("DESIGN.md", f) is None and _resolve("README.md", f) == ROOT / "README.md"
