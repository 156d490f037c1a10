"""Memory of grpoflow serve tinker per LoRA training client, on a model of SmolLM2-135M's shape.

Builds a randomly initialised Llama with SmolLM2-135M's config (576 hidden, 30 layers, 9/3 heads, 1536 MLP,
49,152 vocabulary, tied embeddings; 135M parameters, 540 MB in float32; no download), then runs the server's
service in this process and reads its resident memory (VmRSS) after each LoRA client (rank 32, attention + MLP,
one forward_backward + optim_step each, so the optimizer state exists), after the clients' session ends, and
for one client built the old way (its own copy of the base model).

    OMP_NUM_THREADS=1 python bench/tinker_lora_memory.py [--clients 4] [--rank 32]

Prints one JSON line of figures (MB).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from pathlib import Path

import torch
from tinker import types
from transformers import LlamaConfig, LlamaForCausalLM

from grpoflow.config import TinkerConfig
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.tinker_server import training
from grpoflow.tinker_server.models import ModelSpec, TrainingModel
from grpoflow.tinker_server.service import TinkerService

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=1536, max_position_embeddings=8192,
                    tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def save_model(folder: Path) -> str:
    tokenizer = build_char_tokenizer()  # the server loads a tokenizer from the folder; its vocabulary is not used
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    del model
    gc.collect()
    return str(folder)


def step(tm: TrainingModel) -> None:
    data = [types.Datum(model_input=types.ModelInput.from_ints(list(range(1, 65))),
                        loss_fn_inputs={"target_tokens": list(range(2, 66))})]
    training.forward_backward(tm, data, "cross_entropy", {}, forward_only=False, microbatch_tokens=4096)
    training.optim_step(tm, types.AdamParams(learning_rate=1e-4))


async def measure(path: str, root: str, clients: int, rank: int) -> dict:
    svc = TinkerService(TinkerConfig(root=root), path, 0, asyncio.get_running_loop())
    figures = {"start": rss_mb()}
    for i in range(clients):
        request = types.CreateModelRequest(session_id="bench", model_seq_id=i, base_model=path,
                                           lora_config=types.LoraConfig(rank=rank))
        future = svc.create_model(request)
        outcome = await svc.futures.wait(future.request_id, 300)
        assert outcome is not None and outcome.error is None, outcome
        step(svc.models[f"bench:train:{i}"])
        gc.collect()
        figures[f"clients_{i + 1}"] = rss_mb()
    svc.end_session("bench", "finished")
    gc.collect()
    figures["after_session_end"] = rss_mb()
    base = svc.bases.resolve(path)
    spec = ModelSpec(base_model=path, lora_rank=rank)
    own = TrainingModel("own:train:0", base, spec, svc._gate("own:train:0"), shared=None)  # the old way
    step(own)
    gc.collect()
    figures["one_client_with_its_own_base"] = rss_mb()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = save_model(Path(tmp) / "smollm2-shape")
        gc.collect()
        figures = asyncio.run(measure(path, str(Path(tmp) / "root"), args.clients, args.rank))
    per_extra = (figures[f"clients_{args.clients}"] - figures["clients_1"]) / max(1, args.clients - 1)
    own_copy = figures["one_client_with_its_own_base"] - figures["after_session_end"]
    print(json.dumps({"model": "SmolLM2-135M shape (random, float32)", "lora_rank": args.rank,
                      "rss_mb": {k: round(v) for k, v in figures.items()},
                      "mb_per_extra_lora_client": round(per_extra, 1),
                      "own_copy_extra_mb": round(own_copy),
                      "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
    main()
