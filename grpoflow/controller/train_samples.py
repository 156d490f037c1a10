"""Training rollouts to read: a few whole groups of the step's scored batch in `<run_dir>/train_samples.jsonl`.

Every `trainer.log_train_every` steps the first `trainer.log_train_groups` groups of the batch (in batch order,
so no randomness is drawn and a resumed run writes the same lines) are copied and handed to a writer thread
through a bounded queue: the step pays for one `Batch.select`, the thread for decoding and JSON. One line per
group:

    {"step", "group", "data_source", "prompt", "row": {short scalar columns}, "samples": [
        {"completion", "score", "reward_parts": {...}, "advantage", "length", "trained_tokens",
         "policy_version", "truncated", "ended" (why it ended: trajectories/trajectory.py EndState),
         "conversation": [chat messages]          (multi-turn / agent samples only)
         "segments": [{"text", "tokens", "source": "model" | "env", "trained"}]}
                                                  (when some response tokens were not trained)
    ]}

`advantage` is the sample's mean advantage over the model's tokens (outcome estimators give every token the same
value; a sample the loss mask leaves out shows the value it would have had). `segments` split the response into runs
by who wrote the tokens (the model, or the environment: replies, tool results, turn separators) and whether the update
trains them (not: environment tokens, and every token of a truncated sample under actor.mask_truncated), each decoded
with the run's tokenizer.

The file follows the run's checkpoints as metrics.jsonl does: `start(step)` keeps the lines of steps <= step
(a fresh run starts an empty file), `flush()` (at every checkpoint) waits for the queue to drain, `close()`
at exit. A full queue (the disk far behind) drops the group and counts it, never blocking a step.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from grpoflow.data.batch import Batch

FILE = "train_samples.jsonl"
ROW_VALUE_CHARS = 200  # dataset-row values longer than this are cut (rows may hold whole documents)

log = logging.getLogger("grpoflow.train_samples")


class TrainSamples:
    """Writes `trainer.log_train_groups` groups every `trainer.log_train_every` steps (see the module docstring).

    `decode(ids) -> str` turns token ids into text for the segments; `load_decode()` builds it on first use,
    in the writer thread (loading a tokenizer costs nothing on the step then)."""

    def __init__(self, run_dir: str | Path, *, every: int, groups: int,
                 load_decode: Callable[[], Callable[[list[int]], str]], queue_size: int = 16) -> None:
        self.path = Path(run_dir) / FILE
        self.every, self.groups = every, groups
        self._load_decode = load_decode
        self._decode: Callable[[list[int]], str] | None = None
        self._queue: queue.Queue[tuple[int, Batch, Tensor, Tensor] | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self.error: BaseException | None = None

    @property
    def enabled(self) -> bool:
        return self.every > 0 and self.groups > 0

    def start(self, resume_step: int) -> None:
        """Keep the lines of steps <= resume_step (none for a fresh run): those after it are trained again."""
        self.flush()
        kept = []
        if resume_step > 0 and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
        if not kept and not self.path.exists() and not self.enabled:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)

    def record(self, step: int, scored: Batch, trained: Batch) -> None:
        """Queue the first groups of the step's batch (a no-op on steps off the grid): `scored` as generated and
        scored, `trained` the same rows with advantages and the loss mask the update uses."""
        if not self.enabled or step % self.every:
            return
        assert trained.advantages is not None, "record() takes the batch after the advantage stage"
        chosen = first_groups(scored.group_ids.tolist(), self.groups)
        idx = torch.as_tensor(chosen, dtype=torch.long)
        snapshot = (scored.select(chosen), trained.advantages.index_select(0, idx),
                    trained.response_mask.index_select(0, idx))
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="train-samples", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((step, *snapshot))
        except queue.Full:
            self.dropped += 1

    def flush(self) -> None:
        """Wait until every queued group is on disk."""
        if self._thread is not None:
            self._queue.join()
        if self.error is not None:
            error, self.error = self.error, None
            log.warning("could not write %s: %s: %s (training goes on)", self.path, type(error).__name__, error)

    def close(self) -> None:
        """Flush, stop the writer thread and say how many groups a full queue dropped."""
        self.flush()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self.dropped:
            log.warning("%d training groups were not written to %s: the writer fell behind", self.dropped, self.path)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._decode is None:
                    self._decode = self._load_decode()
                lines = [json.dumps(g) for g in group_records(*item, decode=self._decode)]
                with self.path.open("a") as f:
                    f.write("".join(line + "\n" for line in lines))
            except Exception as e:  # noqa: BLE001 - reported by flush(); reading aids never stop training
                self.error = e
            finally:
                self._queue.task_done()


def first_groups(group_ids: list[int], count: int) -> list[int]:
    """Row indices of the first `count` distinct groups, in batch order (a group's rows need not be adjacent)."""
    wanted: list[int] = []
    for g in group_ids:
        if g not in wanted:
            if len(wanted) == count:
                break
            wanted.append(g)
    chosen = set(wanted)
    return [i for i, g in enumerate(group_ids) if g in chosen]


def group_records(step: int, batch: Batch, advantages: Tensor, loss_mask: Tensor, *,
                  decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """One record per group of `batch` (scored), in order of first appearance; `advantages` [B, R] and
    `loss_mask` [B, R] (1 on the tokens the update trains) come from the step's advantage stage."""
    ids = batch.group_ids.tolist()
    records = []
    for g in dict.fromkeys(ids):
        rows = [i for i, x in enumerate(ids) if x == g]
        row = batch.rows[rows[0]] if batch.rows else {}
        records.append({"step": step, "group": g, "data_source": str(row.get("data_source", "default")),
                        "prompt": batch.prompts[rows[0]] if batch.prompts else "", "row": short_row(row),
                        "samples": [sample_record(batch, i, advantages[i], loss_mask[i].bool(), decode)
                                    for i in rows]})
    return records


def sample_record(batch: Batch, i: int, advantages: Tensor, trained: Tensor,
                  decode: Callable[[list[int]], str]) -> dict[str, Any]:
    """What a person reads about sample `i`: text, score and its parts, advantage, length, version, cut.
    `advantages` [R] and `trained` [R] bool are the sample's rows of the advantage stage's output."""
    assert batch.scores is not None
    model = batch.response_mask[i].bool()
    attended = batch.response_attention_mask[i].bool()
    n_trained = int(trained.sum())
    adv = advantages[model]  # what the estimator gave the sample's tokens (trained or, when masked, not)
    out: dict[str, Any] = {
        "completion": batch.completions[i] if batch.completions else "",
        "score": float(batch.scores[i]),
        "reward_parts": dict(batch.reward_parts[i]) if batch.reward_parts else {},
        "advantage": float(adv.mean()) if len(adv) else 0.0,
        "length": int(model.sum()),
        "trained_tokens": n_trained,
        "policy_version": int(batch.policy_version[i]) if batch.policy_version is not None else None,
        "truncated": bool(batch.truncated[i]) if batch.truncated is not None else False}
    if batch.infos and batch.infos[i].end.value:
        out["ended"] = batch.infos[i].end.value
    if batch.conversations:
        out["conversation"] = batch.conversations[i]
    if bool((attended & ~trained).any()):
        out["segments"] = segments(batch.response_ids[i][attended].tolist(), model[attended].tolist(),
                                   trained[attended].tolist(), decode)
    return out


def segments(ids: list[int], model: list[bool], trained: list[bool],
             decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """Runs of consecutive tokens alike in who wrote them (`model`: the policy, else the environment) and
    whether the update trains them, each decoded: [{"text", "tokens", "source": "model" | "env", "trained"}]."""
    out: list[dict[str, Any]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or (model[end], trained[end]) != (model[start], trained[start]):
            out.append({"text": decode(ids[start:end]), "tokens": end - start,
                        "source": "model" if model[start] else "env", "trained": bool(trained[start])})
            start = end
    return out


def short_row(row: dict, prefix: str = "") -> dict[str, Any]:
    """The row's scalar columns other than the prompt (the answer to check against), long values cut; nested
    columns (verl's reward_model.ground_truth, extra_info.*) under dotted names."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict) and not prefix:  # one level, as verl's rows nest
            out.update(short_row(v, f"{k}."))
        if (k == "prompt" and not prefix) or not isinstance(v, (str, int, float, bool)) or v is None:
            continue
        out[prefix + k] = v[:ROW_VALUE_CHARS] + "…" if isinstance(v, str) and len(v) > ROW_VALUE_CHARS else v
    return out
