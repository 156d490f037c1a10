"""The GPU check: what grpoflow does on the one GPU machine the project can use, in one command (bench/gpu_check.sh).

That machine (docs/performance-log.md, "bf16 and accuracy; the default"): one H200, python3 3.12 with torch 2.11,
transformers 5.17, peft, accelerate, triton and pytest; no vLLM, Ray or SGLang, no package registry, no network; at
most 64 MiB carried (the repository), outputs only small files. So this check installs nothing (the repository runs
from PYTHONPATH), builds its models on the device with random weights, writes only a table, a JSON summary and log
tails to --out, and keeps to one deadline (--deadline-s): every stage gets its own timeout, cut to what is left, and
a stage that fails or runs out of time is reported and the next one runs.

Stages (each in a child forked from this process, which imported torch and transformers once, so a stage that
crashes or hangs takes nothing else with it and its device memory is freed when it ends):

    preflight     versions, device, imports, the compute-dtype rule on this device (training/bf16_units.py)
    model         a model of Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads, head_dim 128, MLP 3072, tied
                  151,936-token vocabulary) with random weights, built on the device; saved to the work folder
    decode        the HF engine's decode step (engines/continuous.py) at 256 and 1,024 rows, with sdpa and with
                  models/attention.py's grouped kernel: ms per step against the device's busy time in it (the rest
                  is the GPU waiting on the host), kernel launches and host waits per step, KV peak against budget
    trainer       the actor's update (ActorWorker.update_policy) in bf16 at 2k, 4k, 8k and 16k tokens per sequence
                  (32k tokens per step): tokens/s, MFU and peak memory per length, the attention kernel that ran;
                  comparable with prime-rl's 1xH100 Qwen3-0.6B trainer (11.9k tokens/s, MFU 11 % at 16k)
    grpo_bf16     4 GRPO steps (`grpoflow train`, colocated HF engine) with the default compute dtype: generation
                  tokens/s, update and sync seconds, peak memory, engine/trainer log-prob mismatch
    grpo_fp32     the same in float32: the mismatch is numerics only (~1e-6 on CPU)
    fsdp          FSDP2 (`training.engine.shard_model`) over NCCL at world size 1, fp32 and bf16 policy: its
                  gradient against the unsharded model's
    gpu_tests     pytest -m gpu tests/gpu
    integration   a few integration test files, on CUDA when there is one
    vllm          whether vllm imports (not on that image: the table says so)

Beside every stage (bench/gpu_probes.py): the memory as the allocator and the driver see it when the stage ends
(`mem_get_info` free and total, allocated against reserved, now and at the peak; a CPU: peak RSS), and nvidia-smi's
utilisation and memory sampled every 500 ms in the background, summarised over the stage's own time window (skipped,
and the title says so, where nvidia-smi is absent).

--small runs the same stages with tiny shapes and steps on a CPU in about a minute
(tests/integration/test_gpu_check.py), so a Python or version error costs no GPU minutes.

MFU counts 6 x (matmul parameters, the head included) + 6 x layers x seq x (heads x head_dim) FLOPs per token (the
causal attention's fwd+bwd), against 989 TFLOP/s (H100/H200 bf16 dense); none on a CPU. For Qwen3-0.6B at 16k that
is 9.21 GFLOP per token, and prime-rl's 11.9k tokens/s at MFU 11 % imply 9.14: the same count.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpu_probes import UtilSampler, decode_figures, memory_truth

ROOT = Path(__file__).resolve().parents[1]
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}  # dense bf16 FLOP/s by device name
PRIME_RL = "prime-rl 1xH100 Qwen3-0.6B: 11.9k tok/s, MFU 11% at 16k"
MAX_TABLE_LINES = 60
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int = 151_936


QWEN3_06B = Shape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072)
TINY = Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512)


@dataclass(frozen=True)
class Sizes:
    """What each stage runs in a mode."""
    shape: Shape
    seqs: tuple[int, ...]    # trainer: tokens per sequence, one run each
    tokens: int              # trainer: tokens per optimizer step (tokens // seq sequences)
    steps: int               # trainer: optimizer steps per length (the first is warm-up)
    decode_rows: tuple[int, ...]  # decode: rows per decode step, one run each
    decode_prompt: int       # decode: prompt tokens per row
    decode_steps: int        # decode: timed steps per run (and a few more profiled)
    prompts: int             # grpo: prompts per step
    n: int                   # grpo: samples per prompt
    new_tokens: int          # grpo: new tokens per sample (random weights rarely sample EOS: all run to the end)
    fp32_prompts: int
    fp32_new_tokens: int
    integration: tuple[str, ...] = field(default=())
    integration_k: str = ""


# integration: test files whose models go on CUDA when there is one (the workers and engines place themselves;
# test_rollout_engine.py places its own), so a failure there is a GPU finding
FULL = Sizes(QWEN3_06B, seqs=(2048, 4096, 8192, 16_384), tokens=32_768, steps=2, decode_rows=(256, 1024),
             decode_prompt=64, decode_steps=10, prompts=32, n=8, new_tokens=256, fp32_prompts=8, fp32_new_tokens=64,
             integration=("tests/integration/test_rollout_engine.py", "tests/integration/test_weight_sync.py",
                          "tests/integration/test_lora_adapter_sync.py",
                          "tests/integration/test_gradient_invariance.py"))
SMALL = Sizes(TINY, seqs=(64, 128), tokens=256, steps=2, decode_rows=(4, 8), decode_prompt=8, decode_steps=3,
              prompts=2, n=2, new_tokens=8, fp32_prompts=2, fp32_new_tokens=8,
              integration=("tests/integration/test_rollout_engine.py",), integration_k="left_pad")

# (name, timeout in seconds on the GPU): in the order they run, most telling first; the timeouts add up to more than
# the deadline, which cuts the last stages short if the first ones use all of theirs
STAGES = [("preflight", 30), ("model", 45), ("decode", 75), ("trainer", 100), ("grpo_bf16", 100), ("grpo_fp32", 50),
          ("fsdp", 35), ("gpu_tests", 75), ("integration", 60), ("vllm", 10)]
RESERVE_S = 5  # kept for every stage still to come, so one slow stage cannot starve the rest


@dataclass
class Result:
    stage: str
    status: str = "ok"       # ok | FAIL | TIMEOUT | skip
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""


# ---------------------------------------------------------------- helpers the stages share

def device():
    import torch
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def peak_memory_gib() -> float:
    """The device's peak allocated memory (GPU) or this process's peak RSS (CPU), GiB."""
    import torch
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def model_dir(work: Path) -> Path:
    return work / "model"


def build_model(shape: Shape, dev) -> Any:
    """A Qwen3 causal LM of `shape` with random weights, built on `dev`, ids of grpoflow's character tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from grpoflow.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = Qwen3Config(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                         intermediate_size=shape.intermediate, vocab_size=shape.vocab, tie_word_embeddings=True,
                         max_position_embeddings=40_960, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    with dev:
        model = Qwen3ForCausalLM(config)
    return model, tok


def flops_per_token(shape: Shape, seq: int) -> float:
    """prime-rl's count (module docstring): 6 x matmul parameters (head included) + 6 x L x seq x heads x head_dim."""
    attn = shape.hidden * shape.head_dim * (2 * shape.heads + 2 * shape.kv_heads)
    mlp = 3 * shape.hidden * shape.intermediate
    matmul = shape.layers * (attn + mlp) + shape.vocab * shape.hidden
    return 6 * matmul + 6 * shape.layers * seq * shape.heads * shape.head_dim


def peak_flops(name: str) -> float | None:
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def grpo_overrides(work: Path, name: str, sizes: Sizes, prompts: int, new_tokens: int) -> list[str]:
    return [f"model.path={model_dir(work)}", f"trainer.output_dir={work / name}", "trainer.total_steps=4",
            "trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1", "reward.function=length",
            f"data.prompts_per_step={prompts}", f"rollout.n={sizes.n}", f"rollout.max_new_tokens={new_tokens}",
            "actor.rollout_is=token", "actor.lr=1e-6", "placement=colocated", "backend=local"]


def run_grpo(work: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """`grpoflow train` in this process; the medians of steps 2-4 from its metrics.jsonl."""
    import statistics

    import yaml

    from grpoflow.commands.run import train
    from grpoflow.config import load_config

    started = time.perf_counter()
    train(load_config(None, overrides))
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    steady = rows[1:] or rows

    def med(key: str) -> float:
        values = [r[key] for r in steady if key in r]
        return statistics.median(values) if values else float("nan")

    def find(suffix: str) -> float:
        key = next((k for k in rows[-1] if k.endswith(suffix)), None) if rows else None
        return med(key) if key else float("nan")

    config = yaml.safe_load((work / name / "config.yaml").read_text())
    samples = config["data"]["prompts_per_step"] * config["rollout"]["n"]
    return {"dtype": config["model"]["compute_dtype"], "steps": len(rows), "wall_s": round(wall, 1),
            "step_s": med("timing_s/step"), "gen_s": med("timing_s/gen"),
            "gen_tok_s": samples * med("response_length/mean") / med("timing_s/gen"),
            "update_s": med("timing_s/update_actor"), "sync_s": med("timing_s/sync"),
            "mismatch_k3": find("mismatch/k3_kl"), "abs_log_ratio": find("mismatch/abs_log_ratio_mean"),
            "peak_gib": peak_memory_gib()}


# ---------------------------------------------------------------- the stages (each runs in a forked child)

def stage_preflight(work: Path, sizes: Sizes) -> dict[str, Any]:
    import importlib

    import torch
    import transformers

    from grpoflow.training.bf16_units import (auto_compute_dtype, cpu_has_bf16_units, default_compute_dtype,
                                              this_machines_cuda_capability)

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__}
    for name in ("peft", "accelerate", "triton", "pytest"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as e:  # noqa: BLE001  (reported, not raised: a missing extra is a finding)
            out[name] = f"missing ({type(e).__name__})"
    for module in ("grpoflow.commands.run", "grpoflow.engines.hf", "grpoflow.workers.actor",
                   "grpoflow.training.engine"):
        importlib.import_module(module)
    capability = this_machines_cuda_capability()
    if capability is not None:
        props = torch.cuda.get_device_properties(0)
        out["device"] = f"{props.name}, cc {capability[0]}.{capability[1]}, {props.total_memory / 2**30:.0f} GiB"
    else:
        out["device"] = f"cpu ({os.cpu_count()} cores)"
    out["default_dtype"] = default_compute_dtype(capability)
    out["auto_dtype"] = auto_compute_dtype(capability, cpu_has_bf16_units())
    return out


def stage_model(work: Path, sizes: Sizes) -> dict[str, Any]:
    import torch

    dev = device()
    started = time.perf_counter()
    model, tok = build_model(sizes.shape, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    built = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        logits = model(input_ids=torch.randint(0, 100, (1, 32), device=dev)).logits
    assert logits.shape[-1] == sizes.shape.vocab and torch.isfinite(logits).all()
    model.save_pretrained(model_dir(work))
    tok.save_pretrained(model_dir(work))
    return {"params_M": round(params / 1e6, 1), "vocab": sizes.shape.vocab, "build_s": round(built, 2),
            "saved_s": round(time.perf_counter() - started - built, 1), "peak_gib": peak_memory_gib()}


def stage_trainer(work: Path, sizes: Sizes) -> dict[str, Any]:
    """The actor's update at each length of `sizes.seqs`, `sizes.tokens` tokens per step (one worker: the micro-batch
    budget is the longest length, so every length runs the same tokens per micro-batch)."""
    import torch

    from grpoflow.config import ActorConfig, ModelConfig
    from grpoflow.models.attention import attends_packed
    from grpoflow.workers.actor import ActorWorker

    longest = max(sizes.seqs)
    cfg = ActorConfig(max_tokens_per_microbatch=longest, lr=1e-6, logprob_chunk_size=min(1024, longest))
    worker = ActorWorker(0, 1, model_path=str(model_dir(work)), cfg=cfg, temperature=1.0,
                         horizon=longest - longest // 16, seed=0, model_cfg=ModelConfig(compute_dtype="bfloat16"))
    model = worker.engine.model
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = peak_flops(name)
    out: dict[str, Any] = {"attn": model.config._attn_implementation, "packed": attends_packed(model),
                           "tokens_per_step": sizes.tokens}
    for seq in sizes.seqs:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        label = f"{seq // 1024}k" if seq >= 1024 else str(seq)
        try:
            step_s, finite = trainer_steps(worker, seq, sizes.tokens // seq, sizes.steps)
        except torch.cuda.OutOfMemoryError:  # a finding: recorded, and the other lengths still run
            out[f"tok_s@{label}"] = "OOM"
            out[f"peak_gib@{label}"] = round(peak_memory_gib(), 1)
            continue
        tok_s = sizes.tokens / step_s
        out[f"tok_s@{label}"] = round(tok_s)
        out[f"mfu@{label}"] = round(tok_s * flops_per_token(sizes.shape, seq) / peak, 3) if peak else None
        out[f"peak_gib@{label}"] = round(peak_memory_gib(), 1)
        out["loss_finite"] = out.get("loss_finite", True) and finite
    out["baseline"] = PRIME_RL
    return out


def trainer_steps(worker: Any, seq: int, rows: int, steps: int) -> tuple[float, bool]:
    """(the fastest timed step's seconds, whether every metric was finite): `steps` updates on `rows` random
    sequences of `seq` tokens (a 1/16 prompt), the first a warm-up."""
    import torch

    from grpoflow.data.batch import Batch

    prompt = seq // 16
    response = seq - prompt
    g = torch.Generator().manual_seed(0)
    ones = torch.ones(rows, response, dtype=torch.long)
    batch = Batch(prompt_ids=torch.randint(3, 100, (rows, prompt), generator=g),
                  prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
                  response_ids=torch.randint(3, 100, (rows, response), generator=g), response_mask=ones,
                  group_ids=torch.arange(rows) // 2, old_log_probs=-torch.rand(rows, response, generator=g),
                  advantages=torch.randn(rows, 1, generator=g).expand(rows, response).contiguous())
    times, finite = [], True
    for _ in range(steps):
        if device().type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        metrics = worker.update_policy(batch)
        if device().type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        finite = finite and all(v == v for v in metrics.values())
    return min(times[1:] or times), finite


def stage_decode(work: Path, sizes: Sizes) -> dict[str, Any]:
    """The HF engine's decode step with each attention kernel at each row count of `sizes.decode_rows`, built as the
    rollout worker builds it (engines/factory.py: on the GPU, bf16 there, KV budget from its memory)."""
    import torch

    from grpoflow.engines.factory import build_engine
    from grpoflow.models.loading import load_tokenizer

    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    tok = load_tokenizer(str(model_dir(work)))
    out: dict[str, Any] = {"dtype": dtype}
    kv_peak, kv_budget = 0, None
    for attention in ("sdpa", "grouped"):
        engine = build_engine("hf", str(model_dir(work)), tok, dtype=dtype, grouped_attention=attention == "grouped")
        for rows in sizes.decode_rows:  # ms per step and the device's busy ms in it, per row count
            got = decode_figures(engine, rows, prompt=sizes.decode_prompt, steps=sizes.decode_steps, profiled=3)
            out[f"{attention}{rows}_ms"], out[f"{attention}{rows}_gpu_ms"] = got["ms"], got["gpu_ms"]
            kv_peak, kv_budget = max(kv_peak, got["kv_peak"]), got["kv_budget"]
        # launches and host waits per step do not depend on the rows: the largest run's
        out[f"{attention}_launches"], out[f"{attention}_waits"] = got["launches"], got["waits"]
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out["kv_peak"], out["kv_budget"] = kv_peak, kv_budget  # token columns (slots x capacity)
    return out


def stage_grpo_bf16(work: Path, sizes: Sizes) -> dict[str, Any]:
    import torch

    # On a GPU the default compute dtype is what is checked (bf16 where the device has native bf16); a CPU's
    # default is float32, so the small mode asks for bf16.
    extra = [] if torch.cuda.is_available() else ["model.compute_dtype=bfloat16"]
    return run_grpo(work, "grpo_bf16", grpo_overrides(work, "grpo_bf16", sizes, sizes.prompts, sizes.new_tokens)
                    + extra)


def stage_grpo_fp32(work: Path, sizes: Sizes) -> dict[str, Any]:
    return run_grpo(work, "grpo_fp32", grpo_overrides(work, "grpo_fp32", sizes, sizes.fp32_prompts,
                                                      sizes.fp32_new_tokens) + ["model.compute_dtype=float32"])


def stage_fsdp(work: Path, sizes: Sizes) -> dict[str, Any]:
    import copy
    import socket

    import torch
    import torch.distributed as dist

    from grpoflow.training.engine import shard_model
    from grpoflow.training.precision import role_precision

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dev = device()
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        shape = Shape(sizes.shape.hidden, min(sizes.shape.layers, 4), sizes.shape.heads, sizes.shape.kv_heads,
                      sizes.shape.head_dim, sizes.shape.intermediate, sizes.shape.vocab)
        base, _ = build_model(shape, dev)
        ids = torch.randint(3, 100, (2, 256 if dev.type == "cuda" else 32), device=dev)
        out: dict[str, Any] = {"backend": backend, "world": dist.get_world_size()}
        for dtype in ("float32", "bfloat16"):
            precision = role_precision("policy", compute_dtype=dtype, sharded=True)  # bf16: FSDP's policy
            plain, sharded = copy.deepcopy(base), shard_model(copy.deepcopy(base), precision=precision)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                plain(input_ids=ids, labels=ids).loss.backward()
            sharded(input_ids=ids, labels=ids).loss.backward()
            worst = 0.0
            for p, q in zip(plain.parameters(), sharded.parameters()):
                g, h = p.grad, q.grad.full_tensor()
                worst = max(worst, float((g - h).norm() / g.norm().clamp(min=1e-12)))
            out[f"{dtype}_grad_rel_err"] = worst
        # fp32: the same arithmetic (one rank), so equal to rounding; bf16: FSDP's bf16 parameters against autocast
        # (norms and residuals in fp32 there), so equal to bf16's precision only
        if out["float32_grad_rel_err"] > 1e-4 or out["bfloat16_grad_rel_err"] > 0.1:
            raise AssertionError(f"FSDP2 gradients differ from the unsharded model's: {out}")
        return out
    finally:
        dist.destroy_process_group()


def stage_vllm(work: Path, sizes: Sizes) -> dict[str, Any]:
    try:
        import vllm  # noqa: F401  (only whether it imports)
    except Exception as e:  # noqa: BLE001
        return {"importable": False, "why": f"{type(e).__name__}: {str(e)[:80]}"}
    return {"importable": True, "version": vllm.__version__, "note": "not run here: tests/vllm_engine needs it"}


def pytest_stage(args: list[str], log: Path, timeout: float) -> tuple[str, dict[str, Any]]:
    """pytest as a subprocess (its own interpreter), under `timeout`; (status, counts from its summary line)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]  # -q: the repository's addopts
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return "TIMEOUT", {}
    counts: dict[str, Any] = {}
    for line in reversed(log.read_text(errors="replace").splitlines()):
        words = line.strip("= ").replace(",", "").split()
        if any(w in ("passed", "failed", "skipped", "error", "errors", "deselected") for w in words):
            counts = {w: int(n) for n, w in zip(words, words[1:]) if n.isdigit()}
            break
    ok = rc == 0 or (rc == 5 and not counts.get("failed"))  # 5: nothing collected or all deselected
    return ("ok" if ok else "FAIL"), counts


STAGE_FUNCTIONS: dict[str, Callable[[Path, Sizes], dict[str, Any]]] = {
    "preflight": stage_preflight, "model": stage_model, "decode": stage_decode, "trainer": stage_trainer,
    "grpo_bf16": stage_grpo_bf16, "grpo_fp32": stage_grpo_fp32, "fsdp": stage_fsdp, "vllm": stage_vllm}
NEEDS_MODEL = {"decode", "trainer", "grpo_bf16", "grpo_fp32"}


# ---------------------------------------------------------------- running the stages

def _child(fn: Callable, work: Path, sizes: Sizes, log: Path, conn: Any) -> None:
    """A forked stage: its output into its log; its figures (or its error) back through `conn`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = sys.stdout
    try:
        conn.send(("ok", {**fn(work, sizes), **memory_truth()}))
    except BaseException as e:  # noqa: BLE001  (everything is reported; the driver goes on)
        traceback.print_exc()
        conn.send(("FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"))
    finally:
        sys.stdout.flush()
        os._exit(0)


def run_stage(name: str, work: Path, sizes: Sizes, timeout: float) -> Result:
    log = work / f"{name}.log"
    started = time.perf_counter()
    result = Result(name)
    if name in ("gpu_tests", "integration"):
        args = ["-m", "gpu", "tests/gpu"] if name == "gpu_tests" else \
            [*sizes.integration, "-m", "not slow", *(["-k", sizes.integration_k] if sizes.integration_k else [])]
        result.status, result.figures = pytest_stage(args, log, timeout)
    else:
        # fork: the child reuses this process's imports; spawn only if they initialised CUDA, which a forked
        # child could not use (the parent checks CUDA through NVML, which initialises nothing: main())
        import torch
        ctx = mp.get_context("spawn" if torch.cuda.is_initialized() else "fork")
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(STAGE_FUNCTIONS[name], work, sizes, log, send))
        child.start()
        send.close()
        got = receive.poll(timeout)
        if got:
            try:
                status, payload = receive.recv()
            except EOFError:  # the child died before it could answer (a crash in native code)
                status, payload = "FAIL", "the stage's process died without a result"
        else:
            status, payload = "TIMEOUT", f"no result within {timeout:.0f} s"
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
        if status == "ok":
            result.figures = payload
        else:
            result.status, result.error = status, payload
    result.seconds = time.perf_counter() - started
    return result


def run_all(work: Path, sizes: Sizes, deadline_s: float, only: list[str] | None,
            report: Callable[[list[Result]], None], sampler: UtilSampler) -> list[Result]:
    """The stages in order under one deadline; `report(results so far)` after each (so that a run killed from
    outside still leaves the table of what finished); each stage's figures gain `sampler`'s over its window."""
    start = time.perf_counter()
    names = [n for n, _ in STAGES if not only or n in only]
    results: list[Result] = []
    for i, name in enumerate(names):
        own = dict(STAGES)[name]
        left = deadline_s - (time.perf_counter() - start) - RESERVE_S * (len(names) - i - 1)
        timeout = min(own, left)
        if name in NEEDS_MODEL and not (model_dir(work) / "config.json").exists():
            results.append(Result(name, "skip", error="no model (the model stage failed)"))
        elif timeout < RESERVE_S:
            results.append(Result(name, "skip", error="no time left under the deadline"))
        else:
            began = time.time()
            results.append(run_stage(name, work, sizes, timeout))
            results[-1].figures.update(sampler.window(began, time.time()))
        print(f"gpu_check: {name}: {results[-1].status} in {results[-1].seconds:.1f} s", file=sys.stderr, flush=True)
        report(results)
    return results


# ---------------------------------------------------------------- the table

def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value == 0 or 1e-3 <= abs(value) < 1e5:
            return f"{value:.3g}"
        return f"{value:.2e}"
    return str(value)


def table(results: list[Result], mode: str, total_s: float, note: str = "") -> str:
    lines = [f"grpoflow gpu check ({mode} mode), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{total_s:.0f} s{'; ' + note if note else ''}",
             f"{'stage':<12} {'status':<8} {'s':>6}  figures"]
    for r in results:
        items = [f"{k}={fmt(v)}" for k, v in r.figures.items() if v is not None]
        if r.error:
            items.insert(0, r.error)
        chunks, line = [], ""
        for item in items:
            if line and len(line) + len(item) > 86:
                chunks.append(line)
                line = ""
            line = f"{line} {item}".strip()
        chunks.append(line)
        lines.append(f"{r.stage:<12} {r.status:<8} {r.seconds:6.1f}  {chunks[0]}")
        lines += [f"{'':<29}{c}" for c in chunks[1:5]]
    return "\n".join(lines[:MAX_TABLE_LINES])


def write_out(out: Path, work: Path, results: list[Result], text: str) -> None:
    """table.txt, summary.json and logs.txt (the last lines of every stage's log): three small files."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    tails = []
    for r in results:
        log = work / f"{r.stage}.log"
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if log.exists() else []
        tails.append(f"==== {r.stage} ({r.status})\n" + "\n".join(line[:300] for line in lines))
    (out / "logs.txt").write_text("\n".join(tails)[-4_000_000:] + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/grpoflow-gpu-check"))
    parser.add_argument("--small", action="store_true", help="tiny shapes and steps (a CPU run in well under a minute)")
    parser.add_argument("--deadline-s", type=float, default=525.0, help="every stage ends within this")
    parser.add_argument("--stages", default="", help="comma-separated subset of the stages")
    parser.add_argument("--work", default=None, help="scratch folder for models and run folders (default: a temp one)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() in an import: no CUDA context here
    started = time.perf_counter()
    # Imported once here, before any stage forks (no CUDA call in this process: a forked child initialises it).
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import grpoflow.commands.run  # noqa: F401
    import grpoflow.workers.actor  # noqa: F401

    sizes, mode = (SMALL, "small") if args.small else (FULL, "full")
    with tempfile.TemporaryDirectory(prefix="grpoflow-gpu-check-", dir=args.work) as work:
        sampler = UtilSampler(Path(work) / "nvidia-smi.csv")

        def report(results: list[Result]) -> None:
            write_out(Path(args.out), Path(work), results,
                      table(results, mode, time.perf_counter() - started, sampler.note))

        try:
            results = run_all(Path(work), sizes, args.deadline_s, [s for s in args.stages.split(",") if s] or None,
                              report, sampler)
        finally:
            sampler.stop()
    text = table(results, mode, time.perf_counter() - started, sampler.note)
    print(text)
    return 0 if all(r.status in ("ok", "skip") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
