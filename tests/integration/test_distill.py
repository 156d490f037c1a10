"""On-policy distillation through the real controller: the teacher's signal reaches the update, every option
runs end to end on tiny models, and a teacher with another tokenizer is refused (docs/algorithms/opd.md)."""

import pytest
import torch

from grpoflow.config import ConfigError, load_config
from plans import plan_of
from grpoflow.controller.distill import TeacherError, resolve_teacher, teacher_prompts
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from grpoflow.controller.trainer import Controller
from grpoflow.data.dataset import prepare_prompts
from grpoflow.models.loading import load_tokenizer
from grpoflow.models.spec import ModelSpecError
from grpoflow.models.tiny import save_tiny_model
from grpoflow.tasks.addition import addition_splits

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=30", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=2", "trainer.val_every=0", "trainer.log_every=1"]
STEP = ["data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=5", "actor.lr=1e-2",
        "trainer.val_every=0", "trainer.save_every=0"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A student and two different teachers, all tiny Llamas with the character tokenizer."""
    root = tmp_path_factory.mktemp("opd")
    return {name: save_tiny_model(root / name, size="0.5m", seed=seed)
            for name, seed in (("student", 0), ("teacher_a", 1), ("teacher_b", 2))}


def weights_after_one_step(run_dir, student: str, overrides: list[str]) -> tuple[dict, dict]:
    """The student's parameters after one RL step of the real controller, and that step's metrics."""
    cfg = load_config(None, [f"trainer.output_dir={run_dir}", *STEP, *overrides])
    items, _ = prepare_prompts(addition_splits()[0][:16], load_tokenizer(student))
    controller = Controller(plan_of(cfg, model_path=student, train_items=items, run_dir=run_dir))
    try:
        metrics = controller.step(1)
        model = controller.actor.pool.hosts[0].roles["actor"].engine.model
        return {n: p.detach().clone() for n, p in model.named_parameters()}, metrics
    finally:
        controller.close()


def differs(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[n], b[n]) for n in a)


def test_the_teacher_signal_reaches_the_update(tmp_path, models):
    # Same seed, prompts and samples: with kl_coef > 0 another teacher must give other weights (atropos #456 was a
    # teacher signal that never reached the loss); with kl_coef = 0 the teacher must not matter (the control).
    runs = {}
    for teacher in ("teacher_a", "teacher_b"):
        for coef in (0.0, 1.0):
            runs[teacher, coef] = weights_after_one_step(
                tmp_path / f"{teacher}_{coef}", models["student"],
                [f"distill.teacher.path={models[teacher]}", f"distill.kl_coef={coef}"])
    assert not differs(runs["teacher_a", 0.0][0], runs["teacher_b", 0.0][0])
    assert differs(runs["teacher_a", 1.0][0], runs["teacher_b", 1.0][0])
    metrics_a, metrics_b = runs["teacher_a", 1.0][1], runs["teacher_b", 1.0][1]
    assert metrics_a["distill/teacher_kl"] != metrics_b["distill/teacher_kl"]
    assert metrics_a["actor/grad_norm"] != metrics_b["actor/grad_norm"]
    assert 0 < metrics_a["distill/teacher_share"] <= 1 and runs["teacher_a", 0.0][1]["distill/teacher_share"] == 0
    assert "timing_s/teacher" in metrics_a


def test_the_topk_term_alone_reaches_the_update(tmp_path, models):
    # no reward and no reverse-KL advantage: only the top-k forward-KL loss term moves the weights
    pure_topk = ["distill.kl_coef=0", "distill.task_weight=0", "distill.topk=4"]
    a, ma = weights_after_one_step(tmp_path / "a", models["student"], [f"distill.teacher.path={models['teacher_a']}",
                                                                       *pure_topk])
    b, mb = weights_after_one_step(tmp_path / "b", models["student"], [f"distill.teacher.path={models['teacher_b']}",
                                                                       *pure_topk])
    assert differs(a, b) and ma["actor/distill_topk_kl"] > 0 and ma["actor/grad_norm"] > 0


def test_the_student_as_its_own_teacher_gives_zero_kl(tmp_path, models):
    # teacher = the student's own weights and prompt: log pS = log pT up to float rounding, so the signal is ~0
    _, metrics = weights_after_one_step(tmp_path, models["student"], [f"distill.teacher.path={models['student']}"])
    assert abs(metrics["distill/teacher_kl"]) < 1e-4


def test_a_teacher_equal_to_the_student_starts_at_zero_kl_in_bf16(tmp_path, models):
    # bf16 compute: the actor trains on a bf16 copy of its float32 masters, and the teacher (the frozen role,
    # training/precision.py) is cast to bf16 the same way, so at step 1 the student's old log-probs (minibatches=2
    # computes them) and the teacher's are the same numbers: the KL is exactly 0, not bf16 rounding apart.
    _, metrics = weights_after_one_step(tmp_path, models["student"], [
        f"distill.teacher.path={models['student']}", "model.compute_dtype=bfloat16", "actor.minibatches=2"])
    assert metrics["distill/teacher_kl"] == 0.0


@pytest.mark.parametrize("overrides, expect", [
    (["distill.teacher.path=builtin:tiny-0.5m", "distill.topk=4", "distill.task_weight=0"], "actor/distill_topk_kl"),
    (["distill.teacher.path=self", "distill.teacher.prompt_template='{answer}|{prompt}'"], "distill/teacher_kl"),
])
def test_distillation_runs_end_to_end(tmp_path, overrides, expect):
    train(load_config(None, [f"trainer.output_dir={tmp_path}", *TINY, *overrides]))
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and expect in rows[-1] and "distill/teacher_share" in rows[-1]
    assert all(v is not None for r in rows for v in r.values())
    if "distill.topk=4" in overrides:
        assert rows[-1]["actor/distill_topk_kl"] > 0 and rows[-1]["distill/teacher_share"] == 1.0


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path, models):
    other = tmp_path / "other"
    save_tiny_model(other, size="0.5m", seed=1)
    tokenizer = load_tokenizer(other)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(TeacherError, match="another tokenizer than the student.*1 differ"):
        resolve_teacher(str(other), tmp_path, load_tokenizer(models["student"]))
    with pytest.raises(ModelSpecError, match="distill.teacher.path=.*is not a folder.*or self"):
        resolve_teacher(str(tmp_path / "missing"), tmp_path, load_tokenizer(models["student"]))
    with pytest.raises(ConfigError, match="distill.teacher.path=.*does not exist"):  # at start, before the warm start
        train(load_config(None, [f"trainer.output_dir={tmp_path / 'run'}", *TINY,
                                 f"distill.teacher.path={tmp_path / 'missing'}"]))
    assert not (tmp_path / "run" / "sft_model").exists()


def test_privileged_prompts_and_a_template_naming_a_missing_column(models):
    tokenizer = load_tokenizer(models["student"])
    ids, mask = teacher_prompts(["1+2=", "10+20="], [{"answer": "3"}, {"answer": "30"}], "{answer}|{prompt}",
                                tokenizer)
    assert tokenizer.decode(ids[0][mask[0].bool()]) == "3|1+2=" and tokenizer.decode(ids[1]) == "30|10+20="
    with pytest.raises(TeacherError, match="names 'solution'.*columns: \\['answer'\\]"):
        teacher_prompts(["1+2="], [{"answer": "3"}], "{solution}{prompt}", tokenizer)
