"""World size 2 (FSDP2 over gloo, two processes) trains exactly like world size 1.

Two ranks are started once for the module; each runs every scenario below on its half of the
same batches and rank 0 stores what it saw. The tests then compare with one rank in this
process: same gradient, loss, metrics and grad norm after an optimizer step, whatever the
micro-batch budget; uneven micro-batch counts (and an empty shard) do not deadlock; a
checkpoint saved on two ranks resumes identically on two ranks and on one.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FSDPModule

from grpoflow.config import ActorConfig, CriticConfig, LoRAConfig, ModelConfig
from grpoflow.data.batch import Batch
from grpoflow.training.engine import NonFiniteLossError
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.critic import CriticWorker
from grpoflow.training.forward import UpdateSchedule
from grpoflow.workers.frozen import FrozenWorker

WORLD = 2
TOL = dict(rtol=1e-5, atol=1e-5)
# AdamW's first update is lr * g / (|g| + eps): where |g| is within a few eps (1e-8) of zero, a 1e-8
# gradient difference moves the weight by a visible fraction of the step (lr 1e-2 / 3 in warm-up). So weights
# are compared to 1e-5 where |g| > 1e-6, and elsewhere only to a quarter of the step.
STEP = 1e-2 / 3


def make_batch(b: int, seed: int, *, p: int = 7, r: int = 6, long_first: bool = False) -> Batch:
    """Random prompts/responses with advantages and old/ref log-probs. `long_first`: the first half of the
    rows are full length and the second half one or two tokens, so rank 0's shard has long rows only."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, p + 1, (b,), generator=g)
    resp_lens = torch.randint(1, r + 1, (b,), generator=g)
    if long_first:
        prompt_lens[: b // 2], resp_lens[: b // 2] = p, r
        prompt_lens[b // 2:], resp_lens[b // 2:] = 2, 1
    prompt_mask = (torch.arange(p)[None, :] >= p - prompt_lens[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < resp_lens[:, None]).long()
    return Batch(prompt_ids=torch.randint(6, 100, (b, p), generator=g) * prompt_mask, prompt_mask=prompt_mask,
                 response_ids=torch.randint(6, 100, (b, r), generator=g) * response_mask,
                 response_mask=response_mask, group_ids=torch.arange(b) // 4,
                 old_log_probs=-torch.rand(b, r, generator=g) * 3 * response_mask,
                 ref_log_probs=-torch.rand(b, r, generator=g) * 3 * response_mask,
                 advantages=torch.randn(b, 1, generator=g).expand(b, r) * response_mask,
                 returns=torch.randn(b, r, generator=g) * response_mask)


def full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def actor(model_path: str, rank: int, world: int, budget: int = 10_000, lora: bool = False,
          checkpointing: bool = False, compute_dtype: str = "float32", **cfg) -> ActorWorker:
    cfg = ActorConfig(max_tokens_per_microbatch=budget, kl_coef=0.1, lr=1e-2, lr_warmup_steps=3,
                      lr_schedule="constant", **cfg)
    model_cfg = ModelConfig(lora=LoRAConfig(rank=4 if lora else 0, alpha=8.0), gradient_checkpointing=checkpointing,
                            compute_dtype=compute_dtype)
    return ActorWorker(rank, world, model_path=model_path, cfg=cfg, temperature=0.7, horizon=6, seed=0,
                       total_optimizer_steps=10, model_cfg=model_cfg)


def train_step(worker, batch: Batch) -> dict:
    """One accumulate + optimizer step: metrics, the full gradient, grad norm, and the weights after."""
    metrics = worker.accumulate_gradients(batch)
    grads = {n: full(p.grad).clone() for n, p in worker.engine.model.named_parameters() if p.grad is not None}
    norm = worker.engine.optimizer_step()
    return {"metrics": metrics, "grads": grads, "grad_norm": norm, "weights": dict(worker.named_weights())}


def shard(batch: Batch, rank: int, world: int) -> Batch:
    """What the controller sends rank `rank`: its contiguous part of the batch."""
    return batch.split(world)[rank]


def scenarios(model_path: str, rank: int, world: int, ckpt: Path) -> dict:
    """Everything the tests compare, computed on `world` ranks (this process is rank `rank`)."""
    out: dict = {}
    part = partial(shard, rank=rank, world=world)
    batch, uneven, second = make_batch(12, 0), make_batch(8, 1, long_first=True), make_batch(12, 2)

    # (a) one step on the same mini-batch; (b) the same with one or two rows per micro-batch
    worker = actor(model_path, rank, world)
    out["fsdp_groups"] = sum(isinstance(m, FSDPModule) for m in worker.engine.model.modules())
    out["received_weights"] = worker.engine.received_weights  # rank 1 built on meta, its shards sent by rank 0
    out["step"] = train_step(worker, part(batch))
    # bf16 compute: the layers run on bf16 parameters (FSDP's policy), gradients reduced into the fp32 shards
    worker, seen = actor(model_path, rank, world, compute_dtype="bfloat16"), set()
    layer = worker.engine.model.model.layers[0].self_attn.q_proj
    hook = layer.register_forward_pre_hook(lambda module, args: seen.add(module.weight.dtype))
    out["step_bf16"] = train_step(worker, part(batch))
    hook.remove()
    out["bf16_compute_weights"] = seen
    out["bf16_shard_dtypes"] = {p.dtype for p in worker.engine.model.parameters()}
    out["step_checkpointing"] = train_step(actor(model_path, rank, world, checkpointing=True), part(batch))
    out["step_small_budget"] = train_step(actor(model_path, rank, world, budget=13), part(batch))
    out["step_seq_mean"] = train_step(actor(model_path, rank, world, budget=13,
                                            loss_agg_mode="seq-mean-token-mean"), part(batch))
    # (c) rank 0 holds long rows (one per micro-batch), rank 1 short ones (all in one)
    worker = actor(model_path, rank, world, budget=13)
    out["uneven_log_probs"] = worker.compute_log_prob(part(uneven))
    out["uneven_step"] = train_step(worker, part(uneven))
    worker = actor(model_path, rank, world, budget=13)  # fresh: a second step would compare Adam-amplified noise
    out["one_row"] = worker.compute_log_prob(part(uneven.select([0])))  # rank 1: empty shard
    out["one_row_step"] = train_step(worker, part(uneven.select([0])))
    ref = FrozenWorker(rank, world, model_path=model_path, temperature=0.7, max_tokens=13, chunk_size=8)
    out["ref_log_probs"] = ref.log_probs(part(uneven))
    critic = CriticWorker(rank, world, model_path=model_path, cfg=CriticConfig(),
                          schedule=UpdateSchedule(max_tokens_per_microbatch=13), seed=0)
    with_values = part(uneven).replace(values=critic.compute_values(part(uneven)))
    out["values"] = with_values.values
    out["critic_metrics"] = critic.update_critic(with_values)
    lora = actor(model_path, rank, world, lora=True)
    out["lora_step"] = train_step(lora, part(batch))
    lora.save_checkpoint(str(ckpt.with_name("lora")))
    fresh = actor(model_path, rank, world, lora=True)
    out["lora_before_load"] = dict(fresh.named_weights())  # before any forward: FSDP not yet lazily set up
    fresh.load_checkpoint(str(ckpt.with_name("lora")))
    out["lora_loaded"] = dict(fresh.named_weights())

    # (d) step, save, step again; a fresh worker loads the checkpoint and takes the second step
    worker = actor(model_path, rank, world)
    train_step(worker, part(batch))
    worker.save_checkpoint(str(ckpt))
    out["continued"] = train_step(worker, part(second))
    resumed = actor(model_path, rank, world)
    resumed.load_checkpoint(str(ckpt))
    out["resumed"] = train_step(resumed, part(second))

    # a NaN on one rank only: every rank raises (none waits forever in the next collective)
    bad = part(batch)
    if rank == world - 1:
        bad = bad.replace(advantages=bad.advantages * float("nan"))
    try:
        actor(model_path, rank, world).accumulate_gradients(bad)
        out["nan_raised"] = False
    except NonFiniteLossError:
        out["nan_raised"] = True
    return out


def _rank_main(rank: int, world: int, port: int, model_path: str, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = scenarios(model_path, rank, world, Path(folder) / "ckpt")
        torch.save(out, Path(folder) / f"rank{rank}.pt")
    except BaseException:
        (Path(folder) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tiny_model_path, tmp_path_factory) -> dict:
    """Rank 0's results of `scenarios` on two gloo ranks (and rank 1's, under "rank1")."""
    folder = tmp_path_factory.mktemp("fsdp")
    # fork: the children reuse this process's imports (spawning would re-import torch + transformers)
    ctx = mp.start_processes(_rank_main, args=(WORLD, free_port(), tiny_model_path, str(folder)), nprocs=WORLD,
                             join=False, start_method="fork")
    deadline = time.monotonic() + 240
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "two-rank run did not finish in 240 s: a collective deadlocked"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    errors = sorted(folder.glob("*.err"))
    assert not errors, errors[0].read_text()
    results = torch.load(folder / "rank0.pt", weights_only=False)
    results["rank1"] = torch.load(folder / "rank1.pt", weights_only=False)
    results["ckpt"] = folder / "ckpt"
    return results


def one_rank(model_path: str, **kwargs) -> ActorWorker:
    return actor(model_path, 0, 1, **kwargs)


def assert_same_step(two: dict, one: dict) -> None:
    assert one["metrics"].keys() == two["metrics"].keys()
    for k in one["metrics"]:
        assert two["metrics"][k] == pytest.approx(one["metrics"][k], rel=1e-5, abs=1e-6), k
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert one["grads"].keys() == two["grads"].keys() and one["grads"]
    for n in one["grads"]:
        assert (two["grads"][n] - one["grads"][n]).abs().max() < 1e-5, n  # measured: <= 2e-7
    assert_same_weights(two["weights"], one["weights"], one["grads"])


def assert_same_weights(two: dict, one: dict, grads: dict) -> None:
    """Weights after the same optimizer step (see STEP); `grads` (by name) of the step that led there."""
    assert one.keys() == two.keys()
    for n, w in one.items():
        diff = (two[n] - w).abs()
        assert diff.max() < STEP / 4, (n, diff.max())
        if n in grads:
            assert diff[grads[n].abs() > 1e-6].max() < 1e-5, (n, diff[grads[n].abs() > 1e-6].max())
        else:  # LoRA: merged weights, no gradient of their own. An adapter entry whose gradient is near AdamW's eps
            # takes a step that the gradient's last bits set (one rank's fused head and two ranks' logits path round
            # differently: gradients equal to 1e-8, a merged weight 1.1e-5 apart), so a hundredth of a step
            assert diff.max() < STEP / 100, (n, diff.max())


def test_world_two_gives_world_one_gradient_metrics_and_step(two_ranks, tiny_model_path):
    one = train_step(one_rank(tiny_model_path), make_batch(12, 0))
    assert two_ranks["fsdp_groups"] == 2 + 1  # each of the tiny model's two decoder layers, then the root
    assert_same_step(two_ranks["step"], one)
    assert_same_step(two_ranks["step_checkpointing"], one)  # gradient checkpointing inside FSDP layers
    # every rank returns the global metrics (the controller reads rank 0's; they are all-reduced)
    assert two_ranks["rank1"]["step"]["metrics"] == two_ranks["step"]["metrics"]
    assert one["metrics"]["actor/pg_loss"] != 0 and one["grad_norm"] > 0


def test_only_rank_0_reads_the_weights_the_others_receive_their_shards(two_ranks):
    assert two_ranks["received_weights"] is False and two_ranks["rank1"]["received_weights"] is True
    # and rank 1 trained on exactly rank 0's weights: test_world_two_gives_world_one_gradient_metrics_and_step


def test_bf16_world_two_computes_in_bf16_and_gives_world_ones_gradient(two_ranks, tiny_model_path):
    """One rank computes on a bf16 copy whose gradients are added into the fp32 masters; two ranks on FSDP2's bf16
    parameters, their gradients reduce-scattered in fp32. The same arithmetic but for where each micro-batch's bf16
    gradient is rounded (one 12-row sum here, two 6-row sums there), so they agree to bf16's precision (2^-8, in
    norm), not to the fp32 runs' 1e-5 (which still holds: the tests above)."""
    assert two_ranks["bf16_compute_weights"] == {torch.bfloat16}     # FSDP's MixedPrecisionPolicy at work
    assert two_ranks["bf16_shard_dtypes"] == {torch.float32}         # the optimizer steps fp32 masters
    one = train_step(one_rank(tiny_model_path, compute_dtype="bfloat16"), make_batch(12, 0))
    two = two_ranks["step_bf16"]
    assert one["grads"].keys() == two["grads"].keys() and one["grads"]
    errors = {n: float((two["grads"][n] - g).norm() / g.norm()) for n, g in one["grads"].items()}
    total = float(torch.cat([(two["grads"][n] - g).flatten() for n, g in one["grads"].items()]).norm()
                  / torch.cat([g.flatten() for g in one["grads"].values()]).norm())
    assert total < 1e-2 and max(errors.values()) < 2e-2, (total, errors)  # measured: 5.6e-3, at most 8.7e-3
    for k in one["metrics"]:
        assert two["metrics"][k] == pytest.approx(one["metrics"][k], rel=1e-2, abs=1e-3), k
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-2)


@pytest.mark.parametrize("key, mode", [("step_small_budget", "token-mean"), ("step_seq_mean", "seq-mean-token-mean")])
def test_micro_batch_budget_does_not_change_world_two_step(two_ranks, tiny_model_path, key, mode):
    one = train_step(one_rank(tiny_model_path, loss_agg_mode=mode), make_batch(12, 0))
    assert_same_step(two_ranks[key], one)


def test_uneven_micro_batch_counts_and_an_empty_shard(two_ranks, tiny_model_path):
    from grpoflow.training.microbatch import plan_microbatches

    uneven = make_batch(8, 1, long_first=True)
    halves = uneven.split(WORLD)
    counts = [len(plan_microbatches(h.prompt_mask.sum(-1).tolist(), h.response_mask.sum(-1).tolist(), 13))
              for h in halves]
    assert counts[0] > counts[1], counts  # the ranks really plan different numbers of micro-batches
    worker = one_rank(tiny_model_path, budget=13)
    log_probs = two_ranks["uneven_log_probs"]  # rank 0's shard: the first half of the rows
    torch.testing.assert_close(log_probs, worker.compute_log_prob(halves[0]), **TOL)
    assert_same_step(two_ranks["uneven_step"], train_step(worker, uneven))
    # one row: rank 1 gets no rows at all and still joins every forward and backward
    worker = one_rank(tiny_model_path, budget=13)
    torch.testing.assert_close(two_ranks["one_row"], worker.compute_log_prob(uneven.select([0])),
                               **TOL)
    assert_same_step(two_ranks["one_row_step"], train_step(worker, uneven.select([0])))
    assert len(two_ranks["rank1"]["one_row"]) == 0


def test_sharded_reference_and_critic_match_one_rank(two_ranks, tiny_model_path):
    uneven = make_batch(8, 1, long_first=True)
    half = uneven.split(WORLD)[0]
    ref = FrozenWorker(0, 1, model_path=tiny_model_path, temperature=0.7, max_tokens=13, chunk_size=8)
    torch.testing.assert_close(two_ranks["ref_log_probs"], ref.log_probs(half), **TOL)
    critic = CriticWorker(0, 1, model_path=tiny_model_path, cfg=CriticConfig(),
                          schedule=UpdateSchedule(max_tokens_per_microbatch=13), seed=0)
    with_values = uneven.replace(values=critic.compute_values(uneven))
    torch.testing.assert_close(two_ranks["values"], with_values.values[: len(half)], **TOL)
    metrics = critic.update_critic(with_values)
    assert metrics.keys() == two_ranks["critic_metrics"].keys()
    for k in metrics:
        assert two_ranks["critic_metrics"][k] == pytest.approx(metrics[k], rel=1e-5, abs=1e-6), k


def test_lora_world_two_matches_world_one(two_ranks, tiny_model_path):
    one = train_step(one_rank(tiny_model_path, lora=True), make_batch(12, 0))
    assert_same_step(two_ranks["lora_step"], one)
    assert not any("lora_" in n for n in one["weights"])  # merged, under the base model's names
    # adapters saved on two ranks load on two ranks: the merged weights come back exactly
    assert (two_ranks["ckpt"].with_name("lora") / "adapter_model.safetensors").exists()
    before, loaded, trained = two_ranks["lora_before_load"], two_ranks["lora_loaded"], two_ranks["lora_step"]["weights"]
    assert loaded.keys() == trained.keys() == before.keys()
    assert all(torch.equal(loaded[n], trained[n]) for n in trained)
    assert not all(torch.equal(before[n], trained[n]) for n in trained)


def test_checkpoint_on_two_ranks_resumes_identically_on_two_and_on_one(two_ranks, tiny_model_path):
    from grpoflow.models.loading import load_causal_lm, load_tokenizer

    continued, resumed = two_ranks["continued"], two_ranks["resumed"]
    assert continued["grad_norm"] == resumed["grad_norm"] and continued["metrics"] == resumed["metrics"]
    for n, w in continued["weights"].items():
        assert torch.equal(resumed["weights"][n], w), n
    # the checkpoint is a plain HF folder holding the weights after the first step ...
    ckpt = two_ranks["ckpt"]
    first = train_step(one_rank(tiny_model_path), make_batch(12, 0))
    saved = {n: p.detach() for n, p in load_causal_lm(ckpt).named_parameters()}
    assert load_tokenizer(ckpt).pad_token is not None
    assert_same_weights(saved, first["weights"], first["grads"])
    # ... and one rank resumes from it (full optimizer state: the world size may change)
    worker = one_rank(tiny_model_path)
    worker.load_checkpoint(str(ckpt))
    assert_same_step(continued, train_step(worker, make_batch(12, 2)))


def test_nan_on_one_rank_raises_on_every_rank(two_ranks):
    assert two_ranks["nan_raised"] and two_ranks["rank1"]["nan_raised"]


def test_padding_micro_batch_adds_no_gradient_and_no_metric(tiny_model_path):
    from grpoflow.training.forward import Counts
    from grpoflow.training.microbatch import padding_row, split_by_tokens

    batch = make_batch(6, 3)
    grads, metrics = [], []
    for extra in ([], [padding_row(batch), padding_row(batch.select([]))]):
        worker = one_rank(tiny_model_path)
        micro, _ = split_by_tokens(batch, 10_000)
        counts = Counts(tokens=float(batch.response_mask.sum()), seqs=float(len(batch)))
        metrics.append(worker.engine.forward_backward(micro + extra, partial(worker._loss, counts=counts)))
        grads.append([p.grad.clone() for p in worker.engine.model.parameters()])
    assert metrics[0] == metrics[1]
    for a, b in zip(*grads):
        assert torch.equal(a, b)
