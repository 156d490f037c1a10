"""Every role's precision from one decision (training/precision.py), against a table written out by hand, and the
frozen role computing exactly as the policy: a teacher equal to the student gives the student's log-probs."""

import pytest
import torch

from grpoflow.training.precision import ROLES, Precision, role_precision

F32, BF16 = torch.float32, torch.bfloat16

# (role, model.dtype, model.compute_dtype, sharded, lora, cuda) -> (weights, compute, how, grouped attention)
TABLE = [
    # the policy: float32 everywhere is native; bf16 compute over float32 weights is a copy on one rank, FSDP's
    # policy when sharded (before LoRA: the sharded path casts the gathered layers), autocast with LoRA
    (("policy", "float32", None, False, False, False), (F32, F32, "native", True)),   # CPU: packs in float32 too
    (("policy", "float32", "float32", True, True, True), (F32, F32, "native", False)),
    (("policy", "float32", "bfloat16", False, False, False), (F32, BF16, "copy", True)),
    (("policy", "float32", "bfloat16", False, False, True), (F32, BF16, "copy", False)),   # CUDA: sdpa
    (("policy", "float32", "bfloat16", True, False, True), (F32, BF16, "sharded", False)),
    (("policy", "float32", "bfloat16", True, True, False), (F32, BF16, "sharded", True)),
    (("policy", "float32", "bfloat16", False, True, False), (F32, BF16, "autocast", True)),
    # bf16 weights: nothing narrower to compute in, whatever compute_dtype says
    (("policy", "bfloat16", "float32", False, False, False), (BF16, F32, "native", True)),
    (("policy", "bfloat16", "bfloat16", False, False, False), (BF16, BF16, "native", True)),
    # the frozen role (reference, teacher) is the policy's row, always
    (("frozen", "float32", None, False, False, False), (F32, F32, "native", True)),
    (("frozen", "float32", "bfloat16", False, False, False), (F32, BF16, "copy", True)),
    (("frozen", "float32", "bfloat16", True, False, False), (F32, BF16, "sharded", True)),
    (("frozen", "float32", "bfloat16", False, True, False), (F32, BF16, "autocast", True)),
    (("frozen", "bfloat16", "float32", False, False, False), (BF16, F32, "native", True)),
    # critic and warm start: float32 weights (model.dtype is the policy's), autocast to the compute dtype
    (("critic", "bfloat16", "bfloat16", False, False, False), (F32, BF16, "autocast", False)),
    (("critic", "float32", "float32", False, False, False), (F32, F32, "native", False)),
    (("sft", "float32", "bfloat16", True, True, False), (F32, BF16, "autocast", False)),
    # the engines: bf16 when either setting is, weights and compute alike, no master; they decode with grouped
    # attention in float32 on a CPU only
    (("rollout", "float32", None, False, False, False), (F32, F32, "native", True)),
    (("rollout", "float32", "float32", False, False, True), (F32, F32, "native", False)),
    (("rollout", "float32", "bfloat16", False, False, False), (BF16, BF16, "native", False)),
    (("rollout", "bfloat16", "float32", False, False, True), (BF16, BF16, "native", False)),
    # the reward model and the local judge: float32, whatever the run computes in; the judge's engine decodes with
    # grouped attention on a CPU, as the rollout's in float32
    (("reward_model", "bfloat16", "bfloat16", False, False, False), (F32, F32, "native", False)),
    (("judge", "bfloat16", "bfloat16", True, True, True), (F32, F32, "native", False)),
    (("judge", "bfloat16", "bfloat16", False, False, False), (F32, F32, "native", True)),
]


@pytest.mark.parametrize("inputs, expected", TABLE, ids=[str(i[0]) for i in TABLE])
def test_the_table(inputs, expected):
    role, dtype, compute, sharded, lora, cuda = inputs
    assert role_precision(role, dtype=dtype, compute_dtype=compute, sharded=sharded, lora=lora,
                          cuda=cuda) == Precision(*expected)


def test_every_role_is_in_the_table_and_the_frozen_row_is_the_policy_row():
    assert {inputs[0] for inputs, _ in TABLE} == set(ROLES)
    for dtype in ("float32", "bfloat16"):
        for compute in (None, "float32", "bfloat16"):
            for flags in [(s, lo, c) for s in (False, True) for lo in (False, True) for c in (False, True)]:
                kw = dict(dtype=dtype, compute_dtype=compute, sharded=flags[0], lora=flags[1], cuda=flags[2])
                assert role_precision("frozen", **kw) == role_precision("policy", **kw)


def test_names_and_unresolved_settings():
    p = role_precision("policy", compute_dtype="bfloat16")
    assert (p.compute_dtype, p.weights_dtype) == ("bfloat16", "float32")
    with pytest.raises(ValueError, match="model.compute_dtype='auto'.*with_compute_dtype"):
        role_precision("policy", compute_dtype="auto")
    with pytest.raises(ValueError, match="unknown role"):
        role_precision("actor")  # type: ignore[arg-type]


@pytest.mark.parametrize("compute_dtype, lora", [("bfloat16", False), ("bfloat16", True), ("float32", False)])
def test_a_teacher_equal_to_the_student_gives_the_students_log_probs(tiny_model_path, compute_dtype, lora):
    """The teacher used to compute under autocast while the actor trained on a bf16 copy, so a teacher equal to the
    student started at a non-zero KL; both are the frozen/policy row now, so every log-prob is equal, bit for bit."""
    from grpoflow.config import ActorConfig, LoRAConfig, ModelConfig
    from grpoflow.data.batch import Batch
    from grpoflow.workers.actor import ActorWorker
    from grpoflow.workers.frozen import FrozenWorker

    g = torch.Generator().manual_seed(0)
    prompts, responses = torch.randint(6, 60, (6, 5), generator=g), torch.randint(6, 60, (6, 4), generator=g)
    mask = (torch.arange(4)[None] < torch.tensor([4, 2, 3, 1, 4, 4])[:, None]).long()
    batch = Batch(prompt_ids=prompts, prompt_mask=torch.ones_like(prompts), response_ids=responses * mask,
                  response_mask=mask, group_ids=torch.arange(6) // 3)
    model_cfg = ModelConfig(compute_dtype=compute_dtype, lora=LoRAConfig(rank=4 if lora else 0))
    actor = ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=0.7, horizon=4, seed=0,
                        model_cfg=model_cfg)
    teacher = FrozenWorker(0, 1, model_path=tiny_model_path, temperature=0.7, max_tokens=4096, chunk_size=128,
                           compute_dtype=compute_dtype, lora=lora)
    student = actor.compute_log_prob(batch)
    scored = teacher.score(batch).teacher_log_probs
    assert scored is not None and torch.equal(student, scored)
    assert torch.equal(student, teacher.log_probs(batch))   # the reference, the same frozen role
