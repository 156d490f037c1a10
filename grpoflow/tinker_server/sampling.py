"""Sampling sessions: which weights a sampling client samples from, and `asample` on grpoflow's HF engine.

Weights for the sampler are a snapshot of a training model's (LoRA merged) weights, taken when
`save_weights_for_sampler` runs: named ones are written to `<root>/sampler_weights/...` (safetensors), the
unnamed ones of `save_weights_and_get_sampling_client` stay in memory (the newest `tinker.sampler_snapshots` of
each training model). A LoRA model's, named or not, are its adapters only (`AdapterSnapshot`; on disk
`adapters.safetensors`, which refers to the base model by the `base_model` of its tinker_model.json), merged into
the shared base weights when the engine loads them, bit for bit what the full merged snapshot would hold; a full
model's are all its weights (`model.safetensors`).
One rollout engine per base model holds one set of weights at a time and is handed a session's snapshot
(`update_weights`, an exact copy) before it samples for it, so a sample uses the saved weights bit for bit; the
base model's own weights are the training models' shared copy (models.BaseModels.shared), not another one.
A sample ends at every id grpoflow's rollouts end at (`engines.factory.end_ids`: the tokenizer's EOS and each
`eos_token_id` of the model's generation_config.json). Sampling is whole-batch generation over the
engine (`engines.whole_batch.generate_batch`, the one path its rollouts and the judge take too); queued requests
with the same weights and parameters run as one batch (futures.Runner).
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Union

import numpy as np
import torch
from tinker import types

from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.models.log_softmax import accurate_log_softmax
from grpoflow.engines.factory import end_ids
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.protocol import SamplingParams
from grpoflow.errors import UserError
from grpoflow.tinker_server.models import BaseModel
from grpoflow.tinker_server.wire import EMPTY_LOGPROB, PromptScores, Sequence

WEIGHTS_FILE = "model.safetensors"          # named sampler weights of a full fine-tuning model
ADAPTERS_FILE = "adapters.safetensors"      # of a LoRA model: lora_A, lora_B per adapted weight, scalings in metadata


@dataclass(frozen=True)
class Session:
    """A sampling session: its weights (`snapshot` key) and where they come from."""
    session_id: str
    base: BaseModel
    snapshot: str            # "base:<folder>", "mem:<id>" or the sampler_weights folder
    model_path: str | None   # the tinker:// path, when there is one


@dataclass(frozen=True)
class AdapterSnapshot:
    """A LoRA model's unnamed sampler weights: per adapted base weight (its base-model name) the adapter's
    lora_A, lora_B and scaling. Loaded as W + (B @ A) * scaling, peft's own delta for a Linear layer, added as
    lora.merged_named_weights adds it: the same merged weights, a rank-r fraction of their memory."""
    deltas: dict[str, tuple[torch.Tensor, torch.Tensor, float]]


Snapshot = Union[dict[str, torch.Tensor], AdapterSnapshot]


def adapter_snapshot(model: torch.nn.Module) -> AdapterSnapshot | None:
    """The adapters of a peft LoRA model as an AdapterSnapshot; None where the merge would not be peft's simple
    Linear delta (other layer kinds, fan_in_fan_out, several adapters, merged layers, 16-bit adapters on a CPU)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in model.get_base_model().named_modules():  # type: ignore[operator]  # a PeftModel method
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, LoraLinear) or module.merged or module.fan_in_fan_out \
                or list(module.active_adapters) != ["default"]:
            return None
        a: torch.Tensor = module.lora_A["default"].weight  # type: ignore[assignment]  # a Linear's weight
        b: torch.Tensor = module.lora_B["default"].weight  # type: ignore[assignment]
        if a.dtype != torch.float32 and a.device.type == "cpu":
            return None
        scaling = float(module.scaling["default"])  # type: ignore[index]  # peft keeps a dict of floats
        deltas[f"{name}.weight"] = (a.detach().clone(), b.detach().clone(), scaling)
    return AdapterSnapshot(deltas)


def save_adapters(snapshot: AdapterSnapshot, path: Path) -> None:
    """`snapshot` as one safetensors file: `<weight>.lora_A` and `.lora_B` tensors, the scalings as metadata."""
    from safetensors.torch import save_file

    tensors = {f"{name}.lora_{x}": t.detach().cpu().contiguous() for name, (a, b, _) in snapshot.deltas.items()
               for x, t in (("A", a), ("B", b))}
    scalings = {name: scaling for name, (_, _, scaling) in snapshot.deltas.items()}
    save_file(tensors, str(path), metadata={"scalings": json.dumps(scalings)})


def load_adapters(path: Path) -> AdapterSnapshot:
    """The AdapterSnapshot `save_adapters` wrote to `path`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        scalings = json.loads(f.metadata()["scalings"])
        return AdapterSnapshot({name: (f.get_tensor(f"{name}.lora_A"), f.get_tensor(f"{name}.lora_B"), float(s))
                                for name, s in scalings.items()})


def merged(base: dict[str, torch.Tensor], snapshot: AdapterSnapshot) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, weight) of the base weights with the snapshot's adapters merged in (on the weight's device), one at a
    time."""
    for name, weight in base.items():
        if name in snapshot.deltas:
            a, b, scaling = snapshot.deltas[name]
            yield name, weight + (b.to(weight.device) @ a.to(weight.device)) * scaling
        else:
            yield name, weight


def owner_of(some_id: str) -> str:
    """The session a model, sampling session or snapshot id belongs to: its first `:` field."""
    return some_id.removeprefix("mem:").split(":", 1)[0]


class Samplers:
    """Rollout engines (one per base model), weight snapshots and sampling sessions. `base_weights(base)` gives
    a base model's weights by name (the shared copy); None: the engine's own, cloned when it is built."""

    def __init__(self, keep_in_memory: int, seed: int = 0,
                 base_weights: Callable[[BaseModel], dict[str, torch.Tensor]] | None = None) -> None:
        self.keep_in_memory = keep_in_memory
        self._base_weights_of = base_weights
        self._engines: dict[str, tuple[HFRolloutEngine, object, str]] = {}  # folder -> engine, tokenizer, loaded key
        self._base_weights: dict[str, dict[str, torch.Tensor]] = {}
        self._memory: OrderedDict[str, Snapshot] = OrderedDict()
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._version = 0

    def add_session(self, session: Session) -> None:
        with self._lock:
            self.sessions[session.session_id] = session

    def session(self, session_id: str) -> Session:
        with self._lock:
            if session_id not in self.sessions:
                raise UserError(f"unknown sampling session {session_id!r} (a restarted server forgets unnamed "
                                "sampler weights; create the sampling client again from a saved model_path).")
            return self.sessions[session_id]

    def remember(self, key: str, snapshot: Snapshot) -> None:
        """Keep an unnamed snapshot (key `mem:<model_id>:sampler:<n>`) in memory, dropping that model's oldest
        beyond `keep_in_memory`: one client's snapshots never push out another's."""
        model = key.rsplit(":sampler:", 1)[0]
        with self._lock:
            self._memory[key] = snapshot
            same = [k for k in self._memory if k.rsplit(":sampler:", 1)[0] == model]
            for old in same[:max(0, len(same) - self.keep_in_memory)]:
                del self._memory[old]

    def engine_for(self, session: Session) -> tuple[HFRolloutEngine, object]:
        """The base model's engine holding the session's weights (loaded into it if it held others)."""
        folder = session.base.folder
        if folder not in self._engines:
            model = load_causal_lm(folder)
            tokenizer = load_tokenizer(folder)
            # every id a sample ends at, as grpoflow's own rollouts (the tokenizer's EOS and generation_config's)
            engine = HFRolloutEngine(model, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=end_ids(folder, tokenizer))
            self._base_weights[folder] = ({n: p.detach().clone() for n, p in model.named_parameters()}
                                          if self._base_weights_of is None else self._base_weights_of(session.base))
            self._engines[folder] = (engine, tokenizer, f"base:{folder}")
        engine, tokenizer, loaded = self._engines[folder]
        if loaded != session.snapshot:
            self._version += 1
            engine.update_weights(self._weights(session), version=self._version)
            self._engines[folder] = (engine, tokenizer, session.snapshot)
        return engine, tokenizer

    def _weights(self, session: Session) -> Iterator[tuple[str, torch.Tensor]]:
        """The session's weights by name, one at a time (adapter snapshots merged as they go)."""
        key = session.snapshot
        base = self._base_weights[session.base.folder]
        if key.startswith("base:"):
            return iter(base.items())
        if key.startswith("mem:"):
            with self._lock:
                if key not in self._memory:
                    raise UserError(f"the weights of sampling session {session.session_id} are no longer kept (only "
                                    "the newest tinker.sampler_snapshots unnamed snapshots of each training model "
                                    "are); save with save_weights_for_sampler(name) to keep them.")
                snapshot = self._memory[key]
            return merged(base, snapshot) if isinstance(snapshot, AdapterSnapshot) else iter(snapshot.items())
        from safetensors.torch import load_file

        if (Path(key) / ADAPTERS_FILE).is_file():  # a LoRA model's named weights: its adapters on the shared base
            return merged(base, load_adapters(Path(key) / ADAPTERS_FILE))
        return iter(load_file(str(Path(key) / WEIGHTS_FILE)).items())

    def drop_owner(self, owner: str) -> None:
        """Forget the sampling sessions and in-memory snapshots of session `owner` (it ended)."""
        with self._lock:
            for session_id in [s for s in self.sessions if owner_of(s) == owner]:
                del self.sessions[session_id]
            for key in [k for k in self._memory if owner_of(k) == owner]:
                del self._memory[key]

    def next_seed(self) -> int:
        with self._lock:
            return self._rng.randrange(2**31)


def engine_params(request: types.SampleRequest, default_max_tokens: int) -> tuple[SamplingParams, list[str]]:
    """grpoflow sampling parameters for a request, and its stop strings (matched on the decoded text);
    UserError for values out of range and for what the HF engine cannot do."""
    p = request.sampling_params
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        raise UserError(f"temperature={p.temperature}: give a finite temperature >= 0 (0: greedy).")
    if not (0 < p.top_p <= 1):
        raise UserError(f"top_p={p.top_p}: give a value in (0, 1] (1: off).")
    unsupported = [name for name, on in (("top_k", p.top_k not in (-1, 0)),
                                         ("topk_sample_logprobs", request.topk_sample_logprobs > 0),
                                         ("target_prompt_logprobs", request.target_prompt_logprobs is not None),
                                         ("prompt_alt_tokens_k", request.prompt_alt_tokens_k > 0)) if on]
    if unsupported:
        raise UserError(f"sampling with {unsupported} is not supported by grpoflow serve tinker (its sampler has "
                        "temperature, top_p, stop sequences, seeds, prompt log-probs and top-k prompt log-probs).")
    if not 0 <= request.topk_prompt_logprobs <= MAX_TOPK:
        raise UserError(f"topk_prompt_logprobs={request.topk_prompt_logprobs}: ask for 0 to {MAX_TOPK} tokens.")
    if request.num_samples < 1:
        raise UserError(f"num_samples={request.num_samples}: ask for at least one sample.")
    stops = [] if p.stop is None else [p.stop] if isinstance(p.stop, str) else list(p.stop)
    stop_ids = tuple(int(s) for s in stops if isinstance(s, int))
    if any(s < 0 for s in stop_ids):
        raise UserError(f"stop={stops}: stop token ids must be >= 0 (token ids of the model's vocabulary); "
                        f"{min(stop_ids)} is not one.")
    stop_strings = [s for s in stops if isinstance(s, str)]
    max_tokens = default_max_tokens if p.max_tokens is None else p.max_tokens
    if max_tokens < 1:
        raise UserError(f"max_tokens={p.max_tokens}: ask for at least one token.")
    if p.seed is not None and not 0 <= p.seed < 2**63:
        raise UserError(f"seed={p.seed}: give a seed in [0, 2**63).")
    return SamplingParams(n=request.num_samples, max_new_tokens=max_tokens, temperature=p.temperature,
                          top_p=p.top_p, stop_token_ids=stop_ids), stop_strings


def check_size(prompt_tokens: int, params: SamplingParams, context: int | None, max_sample_tokens: int) -> int:
    """The tokens a sample request needs, n x (prompt + max_tokens); UserError for one longer than the model's
    context or larger than the server takes."""
    if context is not None and prompt_tokens + params.max_new_tokens > context:
        raise UserError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({params.max_new_tokens}) exceeds the "
                        f"model's context of {context} tokens; shorten the prompt or ask for fewer tokens.")
    total = params.n * (prompt_tokens + params.max_new_tokens)
    if total > max_sample_tokens:
        raise UserError(f"num_samples x (prompt + max_tokens) = {params.n} x {prompt_tokens + params.max_new_tokens}"
                        f" = {total} tokens exceeds this server's {max_sample_tokens} per request "
                        "(tinker.max_sample_tokens); send several smaller requests.")
    return total


def cut_at_stop(tokens: list[int], stop_strings: list[str], decode) -> int | None:
    """The length of the shortest prefix of `tokens` whose text contains a stop string, or None."""
    if not stop_strings or not any(s in decode(tokens) for s in stop_strings):
        return None  # the common case: one decode
    for k in range(1, len(tokens) + 1):
        text = decode(tokens[:k])
        if any(s in text for s in stop_strings):
            return k
    return None


def sequences(generation, rows: range, stop_strings: list[str], decode) -> list[Sequence]:
    """The samples of one prompt (rows of a Generation), cut after their first stop string."""
    out = []
    for row in rows:
        keep = generation.response_mask[row].bool()
        tokens = generation.response_ids[row][keep].tolist()
        logprobs = generation.log_probs[row][keep].tolist()
        stopped = not bool(generation.truncated[row])
        cut = cut_at_stop(tokens, stop_strings, decode)
        if cut is not None:
            tokens, logprobs, stopped = tokens[:cut], logprobs[:cut], True
        out.append(Sequence(tokens=tokens, logprobs=logprobs, stopped=stopped))
    return out


MAX_TOPK = 256  # the widest topk_prompt_logprobs a request may ask for


@torch.no_grad()
def prompt_scores(model: torch.nn.Module, prompt: list[int], last_n: int | None, want_logprobs: bool,
                  topk: int) -> PromptScores:
    """One forward over the prompt (temperature 1), read as log-probs and/or top-k (see PromptScores)."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([prompt], device=device)).logits[0].float()
    log_probs = accurate_log_softmax(logits[:-1])           # row i predicts prompt[i + 1]
    skipped = 1 if last_n is None else max(1, len(prompt) - last_n)  # positions left unscored
    values = None
    if want_logprobs:
        picked = log_probs.gather(-1, torch.tensor(prompt[1:], device=device)[:, None])[:, 0]
        values = [float("nan")] + picked.cpu().tolist()
        values[:skipped] = [float("nan")] * skipped
    if topk <= 0:
        return PromptScores(values)
    k = min(topk, log_probs.shape[-1])
    top = log_probs.topk(k, dim=-1)
    ids = np.zeros((len(prompt), topk), dtype=np.int32)
    lps = np.full((len(prompt), topk), EMPTY_LOGPROB, dtype=np.float32)
    ids[1:, :k] = top.indices.cpu().numpy()
    lps[1:, :k] = top.values.cpu().numpy()
    ids[:skipped], lps[:skipped] = 0, EMPTY_LOGPROB
    return PromptScores(values, ids, lps)
