"""The safetensors format written straight from the tensors' memory, and its header read alone.

`safetensors.torch.save_file` first turns every tensor into a Python `bytes` (a full copy of the
model in memory: 1.9 GB for the 0.5B in fp32), then writes them; on this CPU that copy was half of
a full weight sync's trainer side (docs/scale.md). The format is simple enough to write without it
(https://github.com/huggingface/safetensors, "Format"):

* 8 bytes: N, the header's length, little-endian unsigned;
* N bytes: a JSON object `{name: {"dtype", "shape", "data_offsets": [begin, end]}}` plus
  `"__metadata__"` (string to string), padded with spaces to a multiple of 8;
* the tensors' bytes, back to back, each `[begin, end)` relative to the end of the header.

`write` lays the tensors out as the library does (by dtype, widest first, then by name: every
tensor naturally aligned, and the same bytes as `save_file` for the same tensors) and writes each
one's bytes from its own storage (`memoryview` of a `uint8` view: no copy for a contiguous CPU
tensor). Unlike `save_file` it does not refuse tensors that share storage (each is written whole)
nor non-contiguous ones (copied contiguous first).

`read_header` reads and checks the header without the tensors: it is how a file this process wrote
from tensors it checked in memory is validated after the write (swarm/engine/vllm/weights.py).
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

#: safetensors dtype codes, in the library's `Dtype` order (its layout sorts by it, widest last)
_ORDER = (
    ("BOOL", torch.bool),
    ("U8", torch.uint8),
    ("I8", torch.int8),
    ("F8_E5M2", torch.float8_e5m2),
    ("F8_E4M3", torch.float8_e4m3fn),
    ("I16", torch.int16),
    ("U16", torch.uint16),
    ("F16", torch.float16),
    ("BF16", torch.bfloat16),
    ("I32", torch.int32),
    ("U32", torch.uint32),
    ("F32", torch.float32),
    ("C64", torch.complex64),
    ("F64", torch.float64),
    ("I64", torch.int64),
    ("U64", torch.uint64),
)
#: torch dtype -> safetensors code, and back
CODES: dict[torch.dtype, str] = {dt: code for code, dt in _ORDER}
DTYPES: dict[str, torch.dtype] = {code: dt for code, dt in _ORDER}
_RANK = {code: i for i, (code, _dt) in enumerate(_ORDER)}
#: the library refuses larger headers (a guard against reading garbage as a length)
MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors header: its dtype code, shape and byte range after the header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _order(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The names in the library's layout order: widest dtype first, then by name (UTF-8 byte order)."""
    return sorted(tensors, key=lambda k: (-_RANK[_code(k, tensors[k])], k))


def _code(name: str, t: torch.Tensor) -> str:
    try:
        return CODES[t.dtype]
    except KeyError:
        raise ValueError(f"{name}: safetensors has no dtype for {t.dtype}") from None


def header_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length and the padded JSON header for `tensors` laid out as `write` lays them out."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name in _order(tensors):
        t = tensors[name]
        n = _nbytes(t)
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write(tensors: dict[str, torch.Tensor], f: BinaryIO, metadata: dict[str, str] | None = None) -> int:
    """Write `tensors` as a safetensors file to the open binary file `f`; the number of bytes written.

    Each tensor's bytes go from its storage to `f` (a GPU tensor is copied to the CPU first, a
    non-contiguous one made contiguous), so the only extra memory is one tensor's at worst.
    """
    if sys.byteorder != "little":  # safetensors is little-endian; torch's memory is native
        raise RuntimeError("writing safetensors from memory needs a little-endian machine")
    head = header_bytes(tensors, metadata)
    f.write(head)
    total = len(head)
    for name in _order(tensors):
        t = tensors[name].detach()
        if t.numel() == 0:
            continue
        t = t.to("cpu").contiguous().reshape(-1).view(torch.uint8)
        f.write(memoryview(t.numpy()))
        total += t.numel()
    return total


def save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> int:
    """`write` to a new file at `path` (no fsync, no rename: the caller decides: weights.write_atomic)."""
    with open(path, "wb") as f:
        return write(tensors, f, metadata)


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """The tensors' entries and the metadata of safetensors file `path`, reading only its header.

    `ValueError` unless the header is well-formed and accounts for the file exactly: the tensors'
    byte ranges are back to back from 0, each as long as its dtype and shape say, and the file ends
    where the last one does (a truncated or extended file is refused without reading the tensors).
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{size} bytes, shorter than the header's length")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(f"a header of {n} bytes in a file of {size}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    entries: dict[str, Entry] = {}
    for name, spec in header.items():
        try:
            dtype, shape, (begin, end) = spec["dtype"], tuple(spec["shape"]), spec["data_offsets"]
            itemsize = DTYPES[dtype].itemsize
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{name}: a malformed entry {spec!r}") from None
        if not all(isinstance(d, int) and d >= 0 for d in (*shape, begin, end)):
            raise ValueError(f"{name}: a malformed entry {spec!r}")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * itemsize:
            raise ValueError(f"{name}: {end - begin} bytes for {shape} {dtype}")
        entries[name] = Entry(dtype, shape, begin, end)
    at = 0
    for name, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin != at:
            raise ValueError(f"{name} starts at byte {e.begin}, not {at}: a gap or an overlap")
        at = e.end
    if 8 + n + at != size:
        raise ValueError(f"the header accounts for {8 + n + at} bytes, the file has {size} (truncated?)")
    return entries, metadata
