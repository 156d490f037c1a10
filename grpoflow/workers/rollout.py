"""The rollout role: a share of a step's prompts -> a `Batch` of their trajectories, played over the engine's
request batcher (trajectories/rollout.py: single-turn samples, environment or tool conversations, agent
episodes); receives weights (a stream when colocated with the actor, buckets through the controller when
split)."""

from __future__ import annotations

import copy
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

from grpoflow.config import Config, RolloutConfig, resolve_defaults
from grpoflow.data.batch import Batch, split_bounds
from grpoflow.trajectories.loop import RolloutItem
from grpoflow.trajectories.rollout import Kind, run_rollout
from grpoflow.engines.factory import build_engine
from grpoflow.engines.protocol import RolloutEngine, SamplingParams
from grpoflow.engines.pushed_weights import PushedWeights
from grpoflow.workers.rollout_kinds import build_rollout
from grpoflow.models.loading import load_tokenizer
from grpoflow.plan.checks import RunParts, check_config
from grpoflow.training.precision import role_precision


class RolloutWorker:
    def __init__(self, rank: int, world_size: int, *, model_path: str, cfg: Optional[Config] = None,
                 dtype: Optional[str] = None, seed: int = 0, lora: Optional[dict] = None, parts: RunParts | None = None,
                 tokenizer: Any = None) -> None:
        """`cfg` (default: `parts`' config, else Config(): a single-turn run on the hf engine): the run's config, whose
        `rollout` section holds the engine's options and says what kind of trajectories `rollout` plays (environment,
        tools, agent); `parts`: its resolved registry names (plan/checks.py: the engine's builder, the environment,
        tools, tool format, agent; None, a worker built on its own: `cfg` is checked here); `dtype` the engine's
        precision (None: float32); `lora` (rollout.lora_sync=adapter) the adapter layout; `tokenizer`:
        `model_path`'s, loaded already (the run's plan; None: loaded here)."""
        self.rank, self.world_size = rank, world_size
        self.run_config = run_config = cfg or (parts.cfg if parts is not None else Config())
        self.parts = parts if parts is not None else check_config(resolved(run_config))
        r: RolloutConfig = run_config.rollout
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_path)
        dtype = dtype or "float32"
        precision = role_precision("rollout", dtype=dtype, compute_dtype=dtype, cuda=torch.cuda.is_available())
        self.engine: RolloutEngine = build_engine(
            r.engine, model_path, self.tokenizer, builder=self.parts.engine_builder, dtype=dtype, seed=seed,
            gpu_memory_utilization=r.gpu_memory_utilization, tensor_parallel_size=r.tensor_parallel_size,
            enforce_eager=r.enforce_eager, free_cache_engine=r.free_cache_engine,
            sync_timeout_s=r.sync_timeout_s, kv_reuse_mb=r.kv_reuse_mb, lora=lora, lora_versions=r.lora_versions,
            kv_cache_mb=r.kv_cache_mb, longest_request=run_config.data.max_prompt_length + r.max_new_tokens,
            grouped_attention=precision.grouped_attention, exact=r.exact)
        self.sync_timeout_s = r.sync_timeout_s
        self.deterministic = r.deterministic
        self._pushed: PushedWeights | None = None  # an update fed bucket by bucket (split placement)
        self._kind: Kind | None = None  # built at the first rollout (tool processes, the agent endpoint)

    def rollout(self, items: list[RolloutItem], params: SamplingParams, seed: int | None = None,
                complete: int | None = None) -> Batch:
        """`params.n` trajectories of each item over this worker's engine, as samples whose group ids are the
        items' positions (prompt-major; an agent episode may give several samples). With `seed`, turn t of
        sample j of an item draws from its own stream (trajectories/turns.py), so the samples do not depend on
        batching, placement or the other trajectories.

        rollout.partial: items carry their samples so far (`RolloutItem.carried`: paused trajectories, with the seed
        they started with), which go on from there; with `complete`, every sample still running pauses once this
        worker's share of `complete` groups (the step's data.prompts_per_step, split over the workers as their items
        are) have finished. Every sample played comes back as the row the controller trains on, a paused one with
        its trajectory so far (`carried[i].trajectory`, `.paused`, `.finished_at`; trajectories/loop.py); one that
        finished in an earlier rollout does not come back."""
        if seed is not None:
            torch.manual_seed(seed)
        quota = None
        if complete is not None:
            bounds = split_bounds(complete, self.world_size)
            quota = bounds[self.rank + 1] - bounds[self.rank]
        return run_rollout(self.kind(), self.engine, items, params, seed, quota=quota,
                           deterministic=self.deterministic, pad_token_id=self.tokenizer.pad_token_id,
                           decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False))

    def kind(self) -> Kind:
        """The run's kind of rollout, built at the first rollout (tool processes, the agent endpoint)."""
        if self._kind is None:
            self._kind = build_rollout(self.run_config, self.tokenizer, self.parts)
        return self._kind

    def close(self) -> None:
        """Stop what the rollouts started (tool processes, the agent endpoint)."""
        if self._kind is not None:
            self._kind.close()
            self._kind = None

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Load a stream of (name, tensor) (colocated: straight from the actor in this process)."""
        self.engine.update_weights(named_tensors, version)

    def begin_weight_update(self, version: int) -> None:
        """Start an update to `version` whose tensors arrive in buckets (`push_weights`), then `end_weight_update`."""
        if self._pushed is not None:
            raise RuntimeError("begin_weight_update while another update is open.")
        self._pushed = PushedWeights(self.engine, version, timeout_s=self.sync_timeout_s)

    def push_weights(self, bucket: list[tuple[str, Tensor]]) -> None:
        if self._pushed is None:
            raise RuntimeError("push_weights before begin_weight_update.")
        try:
            self._pushed.push(bucket)
        except BaseException:
            self._pushed = None  # the update failed and is over: its error, not "another update is open", is reported
            raise

    def end_weight_update(self) -> None:
        """Wait until the engine has loaded every bucket (raises what it raised, or on the deadline)."""
        pushed, self._pushed = self._pushed, None
        if pushed is None:
            raise RuntimeError("end_weight_update before begin_weight_update.")
        pushed.finish()

    def can_sleep(self) -> bool:
        """Whether `sleep` frees the engine's memory (the engine declares it; the controller calls sleep only then)."""
        return self.engine.abilities.sleeping

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()


def resolved(cfg: Config) -> Config:
    """A copy of `cfg` with the defaults that depend on other keys resolved (config.resolve_defaults), as loading
    resolves them: what the start-up check takes."""
    out = copy.deepcopy(cfg)
    resolve_defaults(out)
    return out
