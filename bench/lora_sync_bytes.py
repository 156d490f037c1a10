"""Bytes moved per weight sync with LoRA: merged full weights (rollout.lora_sync=merged) vs the adapters only
(rollout.lora_sync=adapter), counted on the actor's real sync streams (docs/rollout-engines.md).

    python bench/lora_sync_bytes.py [--model builtin:tiny-4m | /path/to/hf_folder] [--rank 16]
"""

from __future__ import annotations

import argparse
import tempfile

from grpoflow.config import ActorConfig, LoRAConfig, ModelConfig
from grpoflow.models.tiny import save_tiny_model
from grpoflow.workers.actor import ActorWorker


def stream_bytes(actor: ActorWorker) -> tuple[int, int]:
    """(tensors, bytes) of one sync stream."""
    count = size = 0
    for _, t in actor.named_weights():
        count, size = count + 1, size + t.numel() * t.element_size()
    return count, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny-4m")
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    path = args.model
    if path.startswith("builtin:tiny-"):
        path = save_tiny_model(tempfile.mkdtemp(), size=path.removeprefix("builtin:tiny-"))
    model_cfg = ModelConfig(lora=LoRAConfig(rank=args.rank, alpha=2.0 * args.rank))
    rows = []
    for mode in ("merged", "adapter"):
        actor = ActorWorker(0, 1, model_path=path, cfg=ActorConfig(), temperature=1.0, horizon=8, seed=0,
                            model_cfg=model_cfg, lora_sync=mode)
        rows.append((mode, *stream_bytes(actor)))
        del actor
    print(f"model {args.model}, LoRA rank {args.rank} on all 7 linear projections, float32")
    print("| rollout.lora_sync | tensors per sync | bytes per sync |")
    print("|---|---|---|")
    for mode, count, size in rows:
        print(f"| {mode} | {count} | {size:,} ({size / 2**20:.1f} MiB) |")
    print(f"adapter / merged = {rows[1][2] / rows[0][2]:.4f} ({rows[0][2] / rows[1][2]:.0f}x fewer bytes)")


if __name__ == "__main__":
    main()
