"""The protobuf messages the Tinker SDK sends and reads, without the protobuf library.

The SDK (tinker 0.38) posts `forward_backward` as `application/x-protobuf` and asks for
`ForwardBackwardOutput` and `SampleResponse` results in protobuf too. The server must not need the
SDK (nor `protobuf`) to speak it, and these few messages are small, so the wire format is written
out here: varints, length-delimited fields, packed little-endian arrays, with the field numbers of
the SDK's `tinker_public.proto` (read from its descriptor; each message below names them).

    req = decode_forward_backward(body)     # -> FwdBwdWire (model_id, seq_id, loss_fn, config, datums)
    body = encode_forward_backward_output(per_datum, metrics)
    body = encode_sample_response(sequences, prompt_logprobs, topk_prompt)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32 = 1, 2, 3
_NUMPY = {DTYPE_FLOAT32: np.float32, DTYPE_INT64: np.int64, DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A body that is not the protobuf message it claims to be (the server answers 400)."""


# -- the wire format -------------------------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 70:
            raise WireError("varint too long")


def fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message, in order."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _varint(buf, i)
            yield num, wt, val
        elif wt == 1:
            if i + 8 > len(buf):
                raise WireError("truncated fixed64")
            yield num, wt, buf[i : i + 8]
            i += 8
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise WireError("truncated length-delimited field")
            yield num, wt, buf[i : i + n]
            i += n
        elif wt == 5:
            if i + 4 > len(buf):
                raise WireError("truncated fixed32")
            yield num, wt, buf[i : i + 4]
            i += 4
        else:
            raise WireError(f"unsupported wire type {wt}")


def _enc_varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num: int, wt: int) -> bytes:
    return _enc_varint(num << 3 | wt)


def _bytes_field(num: int, data: bytes) -> bytes:
    return _key(num, 2) + _enc_varint(len(data)) + data


def _int_field(num: int, value: int) -> bytes:
    return _key(num, 0) + _enc_varint(value) if value else b""


def _double_field(num: int, value: float) -> bytes:
    return _key(num, 1) + struct.pack("<d", value)


def _packed_ints(num: int, values: Sequence[int]) -> bytes:
    return _bytes_field(num, b"".join(_enc_varint(v) for v in values)) if values else b""


# -- requests --------------------------------------------------------------------


@dataclass
class WireDatum:
    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    non_text_chunks: int = 0  # images or audio: refused by the caller


@dataclass
class FwdBwdWire:
    model_id: str = ""
    seq_id: int = 0
    loss_fn: str = ""
    forward_only: bool = False
    config: dict[str, float | str] = field(default_factory=dict)
    data: list[WireDatum] = field(default_factory=list)


def _tensor(buf: bytes) -> np.ndarray:
    """Tensor {1 dense bytes | 2 sparse_csr; 3 dtype; 4 shape (packed int64)} -> a numpy array."""
    dense: bytes | None = None
    dtype, shape = 0, []
    for num, wt, val in fields(buf):
        if num == 1 and wt == 2:
            dense = bytes(val)  # type: ignore[arg-type]
        elif num == 2:
            raise WireError("sparse tensors are not supported by this server")
        elif num == 3 and wt == 0:
            dtype = int(val)  # type: ignore[arg-type]
        elif num == 4:
            if wt == 2:
                j, raw = 0, bytes(val)  # type: ignore[arg-type]
                while j < len(raw):
                    v, j = _varint(raw, j)
                    shape.append(v)
            else:
                shape.append(int(val))  # type: ignore[arg-type]
    if dtype not in _NUMPY:
        raise WireError(f"unsupported tensor dtype {dtype}")
    arr = np.frombuffer(dense or b"", dtype=_NUMPY[dtype])
    if shape and int(np.prod(shape)) == arr.size:
        arr = arr.reshape(shape)
    return arr


def _datum(buf: bytes) -> WireDatum:
    """Datum {1 model_input: repeated Chunk; 2 loss_fn_inputs: map<string, Tensor>}."""
    d = WireDatum(tokens=[])
    for num, wt, val in fields(buf):
        if num == 1 and wt == 2:
            for cnum, cwt, cval in fields(val):  # type: ignore[arg-type]
                if cnum == 1 and cwt == 2:  # EncodedTextChunk {1 tokens: int32 bytes}
                    for tnum, _, tval in fields(cval):  # type: ignore[arg-type]
                        if tnum == 1:
                            d.tokens.extend(np.frombuffer(tval, dtype=np.int32).tolist())  # type: ignore[arg-type]
                else:
                    d.non_text_chunks += 1
        elif num == 2 and wt == 2:
            key, tensor = "", b""
            for enum_, _, evalue in fields(val):  # type: ignore[arg-type]
                if enum_ == 1:
                    key = bytes(evalue).decode()  # type: ignore[arg-type]
                elif enum_ == 2:
                    tensor = bytes(evalue)  # type: ignore[arg-type]
            d.inputs[key] = _tensor(tensor)
    return d


def decode_forward_backward(buf: bytes) -> FwdBwdWire:
    """ForwardBackwardRequest {1 model_id, 2 seq_id, 3 data, 4 loss_fn, 5 loss_fn_config (map<string,
    double>), 6 forward_only, 7 loss_fn_config_v2 (map<string, {1 number | 2 text}>)}."""
    out = FwdBwdWire()
    v2: dict[str, float | str] = {}
    for num, wt, val in fields(buf):
        if num == 1 and wt == 2:
            out.model_id = bytes(val).decode()  # type: ignore[arg-type]
        elif num == 2 and wt == 0:
            out.seq_id = int(val)  # type: ignore[arg-type]
        elif num == 3 and wt == 2:
            out.data.append(_datum(val))  # type: ignore[arg-type]
        elif num == 4 and wt == 2:
            out.loss_fn = bytes(val).decode()  # type: ignore[arg-type]
        elif num == 5 and wt == 2:
            key, number = "", 0.0
            for enum_, ewt, evalue in fields(val):  # type: ignore[arg-type]
                if enum_ == 1:
                    key = bytes(evalue).decode()  # type: ignore[arg-type]
                elif enum_ == 2 and ewt == 1:
                    number = struct.unpack("<d", evalue)[0]  # type: ignore[arg-type]
            out.config[key] = number
        elif num == 6 and wt == 0:
            out.forward_only = bool(val)
        elif num == 7 and wt == 2:
            key, value = "", 0.0
            for enum_, _, evalue in fields(val):  # type: ignore[arg-type]
                if enum_ == 1:
                    key = bytes(evalue).decode()  # type: ignore[arg-type]
                elif enum_ == 2:
                    for vnum, vwt, vval in fields(evalue):  # type: ignore[arg-type]
                        if vnum == 1 and vwt == 1:
                            value = struct.unpack("<d", vval)[0]  # type: ignore[arg-type]
                        elif vnum == 2:
                            value = bytes(vval).decode()  # type: ignore[arg-type]
            v2[key] = value
    out.config.update(v2)  # the SDK writes both; v2 wins (it carries strings too)
    return out


def encode_forward_backward(
    model_id: str, seq_id: int, loss_fn: str, data: Sequence[WireDatum], forward_only: bool = False
) -> bytes:
    """The request as the SDK sends it (for clients of this server that are not the SDK: benchmarks)."""
    out = _bytes_field(1, model_id.encode()) + _int_field(2, seq_id)
    for d in data:
        chunk = _bytes_field(1, _bytes_field(1, np.asarray(d.tokens, dtype=np.int32).tobytes()))
        msg = _bytes_field(1, chunk)
        for key, arr in d.inputs.items():
            dtype = DTYPE_INT64 if key == "target_tokens" else DTYPE_FLOAT32
            a = np.ascontiguousarray(arr, dtype=_NUMPY[dtype]).reshape(-1)
            tensor = _bytes_field(1, a.tobytes()) + _int_field(3, dtype) + _packed_ints(4, [a.size])
            msg += _bytes_field(2, _bytes_field(1, key.encode()) + _bytes_field(2, tensor))
        out += _bytes_field(3, msg)
    out += _bytes_field(4, loss_fn.encode())
    if forward_only:
        out += _int_field(6, 1)
    return out


# -- results ---------------------------------------------------------------------


def _batched(per_datum: Sequence[np.ndarray], dtype: int) -> bytes:
    """BatchedTensor {1 data, 2 offsets (int64 byte offsets), 3 dtype, 4 trailing_shape}."""
    arrays = [np.ascontiguousarray(a, dtype=_NUMPY[dtype]).reshape(-1) for a in per_datum]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([a.nbytes for a in arrays])
    data = b"".join(a.tobytes() for a in arrays)
    return _bytes_field(1, data) + _bytes_field(2, offsets.tobytes()) + _int_field(3, dtype)


def encode_forward_backward_output(per_datum: Sequence[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """ForwardBackwardOutput {1 loss_fn_output_type, 2 loss_fn_outputs: ArrayRecord {1 type_tag,
    2 fields: map<string, BatchedTensor>, 3 num_datums}, 3 metrics: map<string, double>}."""
    record = _bytes_field(1, b"ArrayRecord")
    names = list(per_datum[0]) if per_datum else []
    for name in names:
        entry = _bytes_field(1, name.encode()) + _bytes_field(2, _batched([d[name] for d in per_datum], DTYPE_FLOAT32))
        record += _bytes_field(2, entry)
    record += _int_field(3, len(per_datum))
    out = _bytes_field(1, b"ArrayRecord") + _bytes_field(2, record)
    for key, value in metrics.items():
        out += _bytes_field(3, _bytes_field(1, key.encode()) + _double_field(2, float(value)))
    return out


@dataclass
class WireSequence:
    tokens: list[int]
    logprobs: list[float]
    stop: bool  # True: a stop condition ended it; False: max_tokens
    topk: tuple[np.ndarray, np.ndarray] | None = None  # [n, k] token ids, logprobs of each sampled position


MASK_LOGPROB = -99999.0  # Tinker's sentinel of an empty top-k cell (token id 0 beside it)


def topk_arrays(per_token: Sequence[Sequence[tuple[int, float]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, k] token ids and logprobs of the engine's per-token top-k lists (short rows padded)."""
    ids = np.zeros((len(per_token), k), dtype=np.int32)
    lps = np.full((len(per_token), k), MASK_LOGPROB, dtype=np.float32)
    for i, row in enumerate(per_token):
        for j, (tok, lp) in enumerate(list(row)[:k]):
            ids[i, j], lps[i, j] = tok, lp
    return ids, lps


def _topk(ids: np.ndarray, logprobs: np.ndarray) -> bytes:
    """TopkLogprobs {1 token_ids int32 [n, k], 2 logprobs float32 [n, k], 3 k, 4 length}."""
    n, k = ids.shape
    return (
        _bytes_field(1, np.ascontiguousarray(ids, dtype=np.int32).tobytes())
        + _bytes_field(2, np.ascontiguousarray(logprobs, dtype=np.float32).tobytes())
        + _int_field(3, k)
        + _int_field(4, n)
    )


def encode_sample_response(
    sequences: Sequence[WireSequence],
    prompt_logprobs: Sequence[float] | None = None,
    topk_prompt: tuple[np.ndarray, np.ndarray] | None = None,
) -> bytes:
    """SampleResponse {1 sequences: SampledSequence {1 stop_reason (0 stop, 1 length), 2 tokens int32,
    3 logprobs float32, 4 topk_sampled_logprobs}, 2 prompt_logprobs float32 (NaN: none), 3 topk_prompt_logprobs}."""
    out = b""
    for s in sequences:
        seq = (
            _int_field(1, 0 if s.stop else 1)
            + _bytes_field(2, np.asarray(s.tokens, dtype=np.int32).tobytes())
            + _bytes_field(3, np.asarray(s.logprobs, dtype=np.float32).tobytes())
        )
        if s.topk is not None:
            seq += _bytes_field(4, _topk(*s.topk))
        out += _bytes_field(1, seq)
    if prompt_logprobs is not None:
        out += _bytes_field(2, np.asarray(prompt_logprobs, dtype=np.float32).tobytes())
    if topk_prompt is not None:
        out += _bytes_field(3, _topk(*topk_prompt))
    return out


__all__ = [
    "FwdBwdWire",
    "WireDatum",
    "WireError",
    "WireSequence",
    "decode_forward_backward",
    "encode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
    "fields",
    "topk_arrays",
]
