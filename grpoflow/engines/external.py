"""What the engines that wrap an inference library (vLLM, SGLang) share.

- `pack_samples`: per-sample token lists and log-probs, as such libraries return them, become the
  padded `Generation` tensors with exactly the HF engine's conventions.
- `weight_buckets`: the actor's `(name, tensor)` stream, grouped into buckets of about
  `bucket_bytes`, under a deadline. The stream is read by a helper thread, so a sender that
  blocks (a dead actor rank, a hung collective) makes the sync raise `WeightSyncTimeout`, naming
  the engine, instead of hanging the run.
"""

from __future__ import annotations

import importlib
import queue
import threading
import time
from typing import Iterable, Iterator

import torch
from torch import Tensor

from grpoflow.errors import MissingExtraError
from grpoflow.engines.protocol import Generation, left_pad


def import_engine(module: str, install_hint: str):
    """The inference library `module`, imported only when its engine is chosen, or an ImportError
    that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{install_hint} ({type(e).__name__}: {e})") from e


class WeightSyncTimeout(TimeoutError):
    """A weight sync did not complete within `rollout.sync_timeout_s`."""


def pack_samples(prompts: list[list[int]], n: int, responses: list[list[int]], log_probs: list[list[float]], *,
                 pad_token_id: int, eos_token_id: int | list[int], floors: list[list[float]] | None = None
                 ) -> Generation:
    """Pad `n` samples per prompt into a `Generation`.

    Args:
        prompts: B prompts as token ids.
        n: samples per prompt; `responses[i * n + j]` is sample j of prompt i.
        responses: B*n lists of sampled token ids, each ending at (and including) its first EOS, or
            cut by the length limit. Tokens after a first EOS are dropped.
        log_probs: B*n lists, the log-prob of each sampled token under the sampling distribution.
        pad_token_id, eos_token_id: the tokenizer's ids (several EOS ids are allowed).
        floors: B*n lists, each token's top-p nucleus floor (models/nucleus.py), from engines that record them.

    Returns:
        prompt ids/mask [B*n, P] left-padded; response ids [B*n, R] right-padded with pad, R the
        longest response; response_mask 1 up to and including the first EOS; log_probs float32,
        0 on padding; truncated: no EOS in the sample (it was cut by the length limit); floors [B*n, R] float32
        (-inf on padding) when given.
    """
    if len(responses) != len(prompts) * n or len(log_probs) != len(responses):
        raise ValueError(f"pack_samples: {len(prompts)} prompts x n={n} need {len(prompts) * n} responses and "
                         f"log-prob rows, got {len(responses)} and {len(log_probs)}.")
    eos = set(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    rows, row_lps, truncated = [], [], []
    for ids, lps in zip(responses, log_probs):
        if len(ids) != len(lps):
            raise ValueError(f"pack_samples: a response has {len(ids)} tokens but {len(lps)} log-probs.")
        end = next((t + 1 for t, tok in enumerate(ids) if tok in eos), None)
        truncated.append(end is None)
        rows.append(list(ids[:end]))
        row_lps.append(list(lps[:end]))
    width = max((len(r) for r in rows), default=0)
    response_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(rows), width), dtype=torch.long)
    lp = torch.zeros((len(rows), width), dtype=torch.float32)
    fl = torch.full((len(rows), width), float("-inf"), dtype=torch.float32) if floors is not None else None
    for i, (ids, lps) in enumerate(zip(rows, row_lps)):
        response_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[i, :len(ids)] = 1
        lp[i, :len(lps)] = torch.tensor(lps, dtype=torch.float32)
        if fl is not None and floors is not None and floors[i]:
            fl[i, :len(ids)] = torch.tensor(floors[i][:len(ids)], dtype=torch.float32)
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    return Generation(prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0), response_ids,
                      response_mask, lp, torch.tensor(truncated, dtype=torch.bool), fl)


_DONE = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def weight_buckets(named_tensors: Iterable[tuple[str, Tensor]], *, engine: str, timeout_s: float, version: int,
                   bucket_bytes: int = 256 << 20) -> Iterator[list[tuple[str, Tensor]]]:
    """Yield the stream as lists of `(name, tensor)` of about `bucket_bytes` each (a tensor larger than
    that is a bucket of its own), raising `WeightSyncTimeout` once `timeout_s` has passed since the first
    call. The deadline covers the whole sync: time the caller spends loading a bucket counts too."""
    deadline = time.monotonic() + timeout_s
    items: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def produce() -> None:
        if device is not None:  # a new thread starts on cuda:0; keep the caller's device
            torch.cuda.set_device(device)
        try:
            for item in named_tensors:
                if not _put(items, item, stop):
                    return
            _put(items, _DONE, stop)
        except BaseException as e:  # handed to the consumer, which raises it
            _put(items, _Failed(e), stop)

    threading.Thread(target=produce, name=f"{engine}-weight-sync", daemon=True).start()
    bucket: list[tuple[str, Tensor]] = []
    size = received = 0
    try:
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise queue.Empty
                item = items.get(timeout=remaining)
            except queue.Empty:
                raise WeightSyncTimeout(
                    f"rollout engine {engine!r}: the weight sync to version {version} did not complete within "
                    f"rollout.sync_timeout_s={timeout_s:g} s ({received} tensors received). The engine holds a "
                    "partial update and cannot be used; check the actor ranks that send weights, or raise "
                    "rollout.sync_timeout_s for a larger model.") from None
            if item is _DONE:
                break
            if isinstance(item, _Failed):
                raise item.error
            name, tensor = item
            received += 1
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
        if bucket:
            yield bucket
    finally:
        stop.set()


def _put(items: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put `item`, giving up once `stop` is set (the consumer has gone); True if it was put."""
    while not stop.is_set():
        try:
            items.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
