"""The Tinker SDK's protobuf wire format, read and written with the SDK's own schema (`tinker.proto`).

The SDK sends `forward_backward` / `forward` requests as a protobuf `ForwardBackwardRequest` (optionally
zstd-compressed) and asks for `ForwardBackwardOutput` and `SampleResponse` results as protobuf
(`Accept: application/x-protobuf`); everything else is JSON of the SDK's pydantic types. Requests are turned
into the SDK's own `types.Datum` / `types.TensorData`, results are built from the SDK's result dataclasses, so
the server and the client agree on one definition of every field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

import numpy as np
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

PROTOBUF = "application/x-protobuf"

_DTYPES: dict[int, tuple[Literal["float32", "int64"], type]] = {
    pb.DTYPE_FLOAT32: ("float32", np.float32), pb.DTYPE_INT64: ("int64", np.int64), pb.DTYPE_INT32: ("int64", np.int32)}


@dataclass
class ForwardBackwardCall:
    """One `/api/v1/forward_backward` request: a chunk of a training client's batch."""
    model_id: str
    seq_id: int | None
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[types.Datum]
    error: str | None = None  # a datum the server cannot take; reported through the future, in seq_id order


def decode_tensor(msg: pb.Tensor) -> types.TensorData:
    """A proto `Tensor` (dense bytes or sparse CSR) as the SDK's TensorData."""
    if msg.dtype not in _DTYPES:
        raise ValueError(f"tensor dtype {msg.dtype} is not float32 or int64.")
    name, np_dtype = _DTYPES[msg.dtype]
    shape = list(msg.shape) or None
    if msg.HasField("sparse_csr"):
        csr = msg.sparse_csr
        return types.TensorData(data=np.frombuffer(csr.values, dtype=np_dtype).copy(), dtype=name, shape=shape,
                                sparse_crow_indices=np.frombuffer(csr.crow_indices, dtype=np.int64).tolist(),
                                sparse_col_indices=np.frombuffer(csr.col_indices, dtype=np.int64).tolist())
    return types.TensorData(data=np.frombuffer(msg.dense, dtype=np_dtype).copy(), dtype=name, shape=shape)


def _decode_chunk(chunk: pb.Chunk) -> types.EncodedTextChunk:
    kind = chunk.WhichOneof("chunk")
    if kind == "encoded_text":
        return types.EncodedTextChunk(tokens=np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    raise ValueError(f"model_input chunks of kind {kind!r} are not supported: grpoflow serve tinker trains text "
                     "models; send token chunks (types.ModelInput.from_ints).")


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Parse a (decompressed) protobuf ForwardBackwardRequest."""
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins where both are set (the SDK writes both)
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data, error = [], None
    try:
        for datum in msg.data:
            chunks: list[types.ModelInputChunk] = [_decode_chunk(c) for c in datum.model_input]
            inputs = {name: decode_tensor(t) for name, t in datum.loss_fn_inputs.items()}
            data.append(types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs))
    except ValueError as e:
        error = str(e)
    return ForwardBackwardCall(model_id=msg.model_id, seq_id=msg.seq_id or None, loss_fn=msg.loss_fn,
                               loss_fn_config=config, forward_only=msg.forward_only, data=data, error=error)


def _batched(arrays: list[np.ndarray]) -> pb.BatchedTensor:
    """Per-datum arrays (one dtype, same trailing shape) as one BatchedTensor with byte offsets."""
    np_dtype = arrays[0].dtype
    proto_dtype = pb.DTYPE_INT64 if np.issubdtype(np_dtype, np.integer) else pb.DTYPE_FLOAT32
    cast = [a.astype(np.int64 if proto_dtype == pb.DTYPE_INT64 else np.float32) for a in arrays]
    offsets = np.cumsum([0] + [a.nbytes for a in cast]).astype(np.int64)
    return pb.BatchedTensor(data=b"".join(a.tobytes() for a in cast), offsets=offsets.tobytes(), dtype=proto_dtype,
                            trailing_shape=list(cast[0].shape[1:]))


def encode_forward_backward(outputs: list[Mapping[str, np.ndarray]], metrics: Mapping[str, float]) -> bytes:
    """ForwardBackwardOutput as protobuf: one ArrayRecord holding every datum's output fields."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=dict(metrics))
    if outputs:
        fields = {name: _batched([out[name] for out in outputs]) for name in outputs[0]}
        msg.loss_fn_outputs.append(pb.ArrayRecord(type_tag="ArrayRecord", fields=fields, num_datums=len(outputs)))
    return msg.SerializeToString()


@dataclass
class Sequence:
    """One sampled continuation, as the server computed it."""
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # ended by EOS or a stop sequence (else: max_tokens)


EMPTY_LOGPROB = -99999.0  # the SDK's marker of an empty top-k cell (types.topk_logprobs.MASK_LOGPROB)


@dataclass
class PromptScores:
    """What a request asked to know about its prompt: log p(prompt[i] | prompt[:i]) per position (NaN at 0 and
    before the last `last_n`), and the top-k tokens with their log-probs per position ([T, k]; position 0 and
    those before the last `last_n` hold the SDK's empty cell: token 0, log-prob EMPTY_LOGPROB)."""
    logprobs: list[float] | None
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None


def encode_sample(sequences: list[Sequence], scores: PromptScores | None) -> bytes:
    """SampleResponse as protobuf; prompt log-probs are NaN where there is none (the first token); top-k prompt
    log-probs as the SDK's dense [T, k] TopkLogprobs."""
    msg = pb.SampleResponse()
    for seq in sequences:
        msg.sequences.append(pb.SampledSequence(
            stop_reason=pb.STOP_REASON_STOP if seq.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes()))
    if scores is not None and scores.logprobs is not None:
        msg.prompt_logprobs = np.asarray(scores.logprobs, dtype=np.float32).tobytes()
    if scores is not None and scores.topk_ids is not None and scores.topk_logprobs is not None:
        length, k = scores.topk_ids.shape
        msg.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(
            token_ids=scores.topk_ids.astype(np.int32).tobytes(),
            logprobs=scores.topk_logprobs.astype(np.float32).tobytes(), k=k, length=length))
    return msg.SerializeToString()
