"""Export -> reload -> the trained policy's log-probs; LoRA trains adapters only, with the reference for free."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpoflow.cli import main
from grpoflow.config import ActorConfig, ModelConfig, load_config
from grpoflow.commands.export import export, find_checkpoint
from plans import plan_of
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import train
from grpoflow.controller.trainer import Controller
from grpoflow.data.batch import Batch
from grpoflow.workers.actor import ActorWorker
from grpoflow.training.forward import batch_log_probs

ARGS = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=5", "trainer.total_steps=2", "trainer.save_every=2", "trainer.val_every=0",
        "actor.lr=1e-2", "reward.function=length"]


def fixed_batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    return Batch(prompt_ids=torch.randint(6, 100, (3, 4), generator=g), prompt_mask=torch.ones(3, 4, dtype=torch.long),
                 response_ids=torch.randint(6, 100, (3, 5), generator=g),
                 response_mask=torch.ones(3, 5, dtype=torch.long), group_ids=torch.arange(3))


def log_probs(model) -> torch.Tensor:
    return batch_log_probs(model, fixed_batch(), temperature=1.0, max_tokens=4096, chunk_size=64)[0]


def restored_policy(run_dir, model_cfg: ModelConfig):
    """The trained policy, rebuilt the way a resumed run rebuilds it."""
    worker = ActorWorker(0, 1, model_path=str(run_dir / "sft_model"), cfg=ActorConfig(), temperature=1.0, horizon=5,
                         seed=0, model_cfg=model_cfg)
    worker.load_checkpoint(str(find_checkpoint(run_dir) / "actor"))
    return worker


def test_export_reload_gives_the_trained_policys_log_probs(tmp_path):
    cfg = load_config(None, [f"trainer.output_dir={tmp_path / 'run'}", *ARGS])
    train(cfg)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    trained = restored_policy(tmp_path / "run", cfg.model)
    torch.testing.assert_close(log_probs(exported), log_probs(trained.engine.model))
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "sft_model")
    assert not torch.allclose(log_probs(base), log_probs(exported))          # training changed something
    assert not (tmp_path / "hf" / "optimizer.pt").exists() and (tmp_path / "hf" / "tokenizer.json").exists()


def test_lora_trains_adapters_only_reference_is_the_same_model_and_export_merges(tmp_path):
    cfg = load_config(None, [f"trainer.output_dir={tmp_path / 'run'}", *ARGS, "model.lora.rank=4",
                             "model.lora.alpha=8", "actor.kl_coef=0.1"])
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert rows[-1]["actor/kl_loss"] > 0          # the reference (adapters off) differs from the policy
    trained = restored_policy(tmp_path / "run", cfg.model)
    model = trained.engine.model
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    export(tmp_path / "run", tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(log_probs(exported), log_probs(model), rtol=1e-5, atol=1e-5)
    merged = dict(trained.named_weights())            # what the rollout engine receives
    for name, tensor in exported.state_dict().items():
        torch.testing.assert_close(merged[name], tensor, rtol=1e-5, atol=1e-6)


def test_lora_reference_is_not_a_second_model(tmp_path):
    from grpoflow.commands.run import sft_stage
    from grpoflow.data.dataset import prepare_prompts
    from grpoflow.models.loading import load_tokenizer
    from grpoflow.rewards import RewardScorer, exact_match

    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", *ARGS, "model.lora.rank=4", "actor.kl_coef=0.1"])
    path = sft_stage(cfg)
    items, _ = prepare_prompts([{"prompt": "1+1=", "answer": "2"}], load_tokenizer(path))
    controller = Controller(plan_of(cfg, model_path=path, train_items=items, run_dir=tmp_path,
                                    scorer=RewardScorer(exact_match)))
    try:
        # no reference group: the actor, adapters off, gives the reference log-probs
        assert controller.needs_ref and controller.ref is None
        assert [g.role for g in controller.groups()] == ["actor", "rollout"]
    finally:
        controller.close()


def test_export_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        export(tmp_path, tmp_path / "out")
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
