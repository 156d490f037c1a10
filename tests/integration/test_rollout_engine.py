"""The HF rollout engine: padding, EOS masks, sampling log-probs that match the trainer, weight sync.

Every model here is placed on CUDA when there is one (`DEVICE`), so the GPU check's integration stage
(bench/gpu_check.sh) runs the engine on the GPU; the attention kernel expected is training/precision.py's for the
device that runs."""

import pytest
import torch

from grpoflow.data.batch import Batch
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.protocol import SamplingParams, eos_response_mask, left_pad
from grpoflow.models.attention import GROUPED_ATTENTION
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.training.forward import batch_log_probs
from grpoflow.training.precision import role_precision
from grpoflow.engines.whole_batch import generate_batch
from grpoflow.workers.rollout import RolloutWorker


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load(path, dtype=torch.float32):
    """The saved model on `DEVICE`."""
    return load_causal_lm(path, dtype=dtype).to(DEVICE)


def test_left_pad_and_eos_mask():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    # EOS (2) is kept in the mask, everything after it is not; a row with no EOS is all ones
    resp = torch.tensor([[9, 2, 9, 2], [9, 9, 9, 9], [2, 0, 0, 0]])
    assert eos_response_mask(resp, 2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    return HFRolloutEngine(load(tiny_model_path), pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id), tok


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_log_probs_match_the_trainer(engine, tiny_model_path, temperature):
    eng, tok = engine
    prompts = [tok.encode(p, add_special_tokens=False) for p in ["1+2=", "10+20=", "7+55="]]
    torch.manual_seed(0)
    gen = generate_batch(eng, prompts, SamplingParams(n=4, max_new_tokens=6, temperature=temperature))
    assert gen.response_ids.shape[0] == 12 and gen.prompt_ids.shape == (12, 6)
    assert (gen.prompt_ids[0] == gen.prompt_ids[3]).all() and not (gen.prompt_ids[0] == gen.prompt_ids[4]).all()
    batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                  response_mask=gen.response_mask, group_ids=torch.arange(12) // 4)
    trainer_lp, _ = batch_log_probs(load(tiny_model_path), batch, temperature=temperature,
                                    max_tokens=4096, chunk_size=7)
    m = gen.response_mask.bool()
    torch.testing.assert_close(trainer_lp[m], gen.log_probs[m], atol=1e-4, rtol=1e-4)
    assert (gen.log_probs[~m] == 0).all() and (gen.response_ids[~m] == tok.pad_token_id).all()


def expected_kernel(dtype: str) -> str:
    """The attention kernel training/precision.py's rollout row gives an engine of `dtype` on this machine."""
    grouped = role_precision("rollout", dtype=dtype, compute_dtype=dtype, cuda=DEVICE.type == "cuda").grouped_attention
    return GROUPED_ATTENTION if grouped else "sdpa"


def test_a_built_float32_engine_decodes_with_its_rows_kernel_and_matches_the_trainer(tiny_model_path):
    # training/precision.py's rollout row, passed by the rollout worker to engines/factory.py: on a CPU in float32 the
    # engine decodes with models/attention.py's kernel (faster than sdpa there), in bf16 and on a GPU with sdpa; the
    # log-probs it samples with are still the trainer's
    tok = load_tokenizer(tiny_model_path)
    fp32 = RolloutWorker(0, 1, model_path=tiny_model_path, dtype="float32").engine
    assert next(fp32.model.parameters()).device.type == DEVICE.type
    assert fp32.model.config._attn_implementation == expected_kernel("float32")  # type: ignore[attr-defined]
    assert expected_kernel("float32") == (GROUPED_ATTENTION if DEVICE.type == "cpu" else "sdpa")
    bf16 = RolloutWorker(0, 1, model_path=tiny_model_path, dtype="bfloat16").engine
    assert bf16.model.config._attn_implementation == expected_kernel("bfloat16") == "sdpa"  # type: ignore[attr-defined]
    prompts = [tok.encode(p, add_special_tokens=False) for p in ["1+2=", "10+20=", "7+55=", "99+1="]]
    gen = generate_batch(fp32, prompts, SamplingParams(n=4, max_new_tokens=8), seeds=[0, 1, 2, 3])
    batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                  response_mask=gen.response_mask, group_ids=torch.arange(16) // 4)
    trainer_lp, _ = batch_log_probs(load(tiny_model_path), batch, temperature=1.0, max_tokens=4096,
                                    chunk_size=7)
    m = gen.response_mask.bool()
    assert m.sum() > 40
    torch.testing.assert_close(trainer_lp[m], gen.log_probs[m], atol=1e-5, rtol=1e-5)


def test_greedy_is_deterministic_and_weight_sync_changes_it(engine, tiny_model_path):
    eng, tok = engine
    prompts = [tok.encode("3+4=", add_special_tokens=False)]
    greedy = SamplingParams(n=2, max_new_tokens=5, temperature=0.0)
    a, b = generate_batch(eng, prompts, greedy), generate_batch(eng, prompts, greedy)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_ids[0], a.response_ids[1])
    other = load(tiny_model_path)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.0)
    eng.update_weights(other.named_parameters(), version=7)
    assert eng.version == 7
    assert not torch.equal(generate_batch(eng, prompts, greedy).log_probs, a.log_probs)
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        eng.update_weights([("nope", torch.zeros(1))], version=8)


# Ids 0..59 all end a response: rows of the random tiny model then stop at different steps, which
# exercises early stopping and rows leaving the decode batch.
MANY_EOS = list(range(60))


def _prompts(tok):
    return [tok.encode(p, add_special_tokens=False) for p in ["1+2=", "10+20=", "7+55=", "99+1="]]


def test_greedy_equals_hf_generate(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    model = load(tiny_model_path)
    prompts = _prompts(tok)
    for eos in (tok.eos_token_id, MANY_EOS):
        eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_id=eos)
        gen = generate_batch(eng, prompts, SamplingParams(n=1, max_new_tokens=8, temperature=0.0))
        ids, mask = left_pad(prompts, tok.pad_token_id)
        ref = model.generate(input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE), do_sample=False,
                             max_new_tokens=8, pad_token_id=tok.pad_token_id, eos_token_id=eos)[:, ids.shape[1]:].cpu()
        ref = ref.masked_fill(eos_response_mask(ref, eos) == 0, tok.pad_token_id)
        assert torch.equal(gen.response_ids, ref)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_early_stop_and_finished_rows_keep_log_probs_exact(tiny_model_path, top_p):
    tok = load_tokenizer(tiny_model_path)
    eng = HFRolloutEngine(load(tiny_model_path), pad_token_id=tok.pad_token_id, eos_token_id=MANY_EOS)
    torch.manual_seed(1)
    gen = generate_batch(eng, _prompts(tok), SamplingParams(n=5, max_new_tokens=12, temperature=0.9, top_p=top_p))
    lengths = gen.response_mask.sum(-1)
    assert lengths.min() < lengths.max(), "rows should finish at different steps"
    assert gen.response_ids.shape[1] == lengths.max() <= 12  # stopped once every row ended (or at the budget)
    ends_with_eos = torch.isin(gen.response_ids.gather(1, (lengths - 1)[:, None]).squeeze(1), torch.tensor(MANY_EOS))
    assert torch.equal(gen.truncated, ~ends_with_eos)
    # top_p 0.8: the engine's log-probs are under each token's nucleus, renormalised; the trainer takes them
    # under the same nucleus from the floors the engine recorded
    batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                  response_mask=gen.response_mask, group_ids=torch.arange(20) // 5, sampling_floors=gen.floors)
    trainer_lp, _ = batch_log_probs(load(tiny_model_path), batch, temperature=0.9, max_tokens=4096,
                                    chunk_size=64, nucleus=True)
    m = gen.response_mask.bool()
    torch.testing.assert_close(trainer_lp[m], gen.log_probs[m], atol=1e-4, rtol=1e-4)
    assert (gen.log_probs[~m] == 0).all() and (gen.response_ids[~m] == tok.pad_token_id).all()


def test_samples_follow_the_global_seed(engine):
    eng, tok = engine
    params = SamplingParams(n=3, max_new_tokens=6, temperature=1.0)
    torch.manual_seed(5)
    a = generate_batch(eng, _prompts(tok), params)
    torch.manual_seed(5)
    b = generate_batch(eng, _prompts(tok), params)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.response_ids, generate_batch(eng, _prompts(tok), params).response_ids)


def test_bf16_engine_samples_and_receives_fp32_weights(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    eng = HFRolloutEngine(load(tiny_model_path, dtype=torch.bfloat16), pad_token_id=tok.pad_token_id,
                          eos_token_id=tok.eos_token_id)
    fp32 = load(tiny_model_path)
    eng.update_weights(fp32.named_parameters(), version=1)
    torch.manual_seed(0)
    gen = generate_batch(eng, _prompts(tok), SamplingParams(n=2, max_new_tokens=6))
    assert gen.log_probs.dtype == torch.float32 and next(eng.model.parameters()).dtype == torch.bfloat16
    batch = Batch(prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
                  response_mask=gen.response_mask, group_ids=torch.arange(8) // 2)
    trainer_lp, _ = batch_log_probs(fp32, batch, temperature=1.0, max_tokens=4096, chunk_size=64)
    m = gen.response_mask.bool()
    # bf16 keeps 8 mantissa bits: the sampler's log-probs differ from the fp32 trainer's, by little
    assert (trainer_lp[m] - gen.log_probs[m]).abs().mean() < 0.05


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compacting_finished_rows_does_not_change_the_samples(tiny_model_path, temperature):
    tok = load_tokenizer(tiny_model_path)
    out = []
    for fraction in (1, 10**6):  # compact at every finish, never
        eng = HFRolloutEngine(load(tiny_model_path), pad_token_id=tok.pad_token_id, eos_token_id=MANY_EOS)
        eng.sampler.compact_fraction = fraction
        out.append(generate_batch(eng, _prompts(tok), SamplingParams(n=2, max_new_tokens=10, temperature=temperature),
                                  seeds=[1, 2, 3, 4]))
    assert torch.equal(out[0].response_ids, out[1].response_ids)
    torch.testing.assert_close(out[0].log_probs, out[1].log_probs, atol=1e-5, rtol=1e-5)
    assert len({int(m.sum()) for m in out[0].response_mask}) > 1  # rows did finish at different steps


def test_per_prompt_seeds_make_samples_independent_of_the_batch(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    eng = HFRolloutEngine(load(tiny_model_path), pad_token_id=tok.pad_token_id, eos_token_id=MANY_EOS)
    prompts, seeds = _prompts(tok), [101, 202, 303, 404]
    params = SamplingParams(n=3, max_new_tokens=8, temperature=1.0, top_p=0.9)
    together = generate_batch(eng, prompts, params, seeds=seeds)
    # each prompt alone (other padding, other decode batch, other rows finishing) gives the same samples
    for i in range(4):
        alone = generate_batch(eng, [prompts[i]], params, seeds=[seeds[i]])
        rows = slice(3 * i, 3 * i + 3)
        width = alone.response_ids.shape[1]
        assert torch.equal(together.response_ids[rows, :width], alone.response_ids)
        assert (together.response_ids[rows, width:] == tok.pad_token_id).all()
        torch.testing.assert_close(together.log_probs[rows, :width], alone.log_probs, atol=1e-5, rtol=1e-5)
    assert not torch.equal(generate_batch(eng, prompts, params, seeds=[s + 1 for s in seeds]).response_ids,
                           together.response_ids)
    batch = Batch(prompt_ids=together.prompt_ids, prompt_mask=together.prompt_mask,
                  response_ids=together.response_ids, response_mask=together.response_mask,
                  group_ids=torch.arange(12) // 3, sampling_floors=together.floors)  # top_p 0.9: the nuclei
    trainer_lp, _ = batch_log_probs(load(tiny_model_path), batch, temperature=1.0, max_tokens=4096,
                                    chunk_size=64, nucleus=True)
    m = together.response_mask.bool()
    torch.testing.assert_close(trainer_lp[m], together.log_probs[m], atol=1e-4, rtol=1e-4)


def test_a_sample_ends_at_every_eos_id_of_the_models_generation_config(tmp_path, tiny_model_path):
    import json
    import shutil

    from grpoflow.engines.factory import build_engine, end_ids

    tok = load_tokenizer(tiny_model_path)
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path, folder)
    assert end_ids(str(folder), tok) == tok.eos_token_id  # the saved generation config names the tokenizer's EOS
    extra = MANY_EOS[-1]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_token_id, extra]}))
    assert end_ids(str(folder), tok) == [tok.eos_token_id, extra]
    engine = build_engine("hf", str(folder), tok)
    gen = generate_batch(engine, _prompts(tok), SamplingParams(n=4, max_new_tokens=12, temperature=1.0),
                         seeds=[1, 2, 3, 4])
    for ids, mask, cut in zip(gen.response_ids, gen.response_mask, gen.truncated):
        kept = ids[:int(mask.sum())].tolist()
        assert extra not in kept[:-1] and tok.eos_token_id not in kept[:-1]  # nothing is sampled past an end id
        assert bool(cut) == (kept[-1] not in (extra, tok.eos_token_id))
    assert any(ids[int(m.sum()) - 1] == extra for ids, m in zip(gen.response_ids, gen.response_mask))


def test_a_colocated_run_frees_the_hf_engines_kv_cache_while_the_actor_trains(tmp_path, tiny_model_path):
    from grpoflow.config import load_config
    from grpoflow.controller.trainer import Controller
    from grpoflow.data.dataset import PromptItem

    cfg = load_config(None, [f"model.path={tiny_model_path}", f"trainer.output_dir={tmp_path}", "rollout.n=2",
                             "data.prompts_per_step=2", "rollout.max_new_tokens=4", "reward.function=exact_match",
                             "trainer.val_every=0"])
    items = [PromptItem(list(load_tokenizer(tiny_model_path).encode(p, add_special_tokens=False)), p, {"answer": a},
                        "addition", index=i) for i, (p, a) in enumerate([("1+2=", "3"), ("3+4=", "7")])]
    from plans import plan_of

    controller = Controller(plan_of(cfg, model_path=tiny_model_path, train_items=items, run_dir=tmp_path))
    try:
        engine = controller.rollout.pool.hosts[0].roles["rollout"].engine
        actor, held = controller.actor.pool.hosts[0].roles["actor"], []
        update = actor.update_policy

        def update_policy(batch):  # what the engine holds when the actor starts its update
            held.append(engine.kv_cache_bytes())
            return update(batch)
        actor.update_policy = update_policy
        controller.step(1)
        assert controller.sleep_engines and engine.sampler.peak_columns > 0  # it held a cache while generating
        assert held == [0] and engine.kv_cache_bytes() == 0                  # and none while the actor trained
    finally:
        controller.close()
