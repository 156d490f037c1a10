"""The Tinker server's sampler holds exactly the weights saved for it (bit for bit), whichever session asks."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("tinker")

from grpoflow.tinker_server.futures import SeqGate  # noqa: E402
from grpoflow.tinker_server.models import BaseModel, ModelSpec, TrainingModel  # noqa: E402
from grpoflow.tinker_server.sampling import WEIGHTS_FILE, Samplers, Session  # noqa: E402
from grpoflow.tinker_server.service import save_sampler_folder  # noqa: E402
from grpoflow.engines.whole_batch import generate_batch  # noqa: E402


def trained_lora(tiny_model_path: str, seed: int) -> TrainingModel:
    spec = ModelSpec(base_model=tiny_model_path, lora_rank=2, seed=seed)
    tm = TrainingModel("s:train:0", BaseModel(tiny_model_path, tiny_model_path), spec, SeqGate(lambda job: None))
    with torch.no_grad():  # as if trained: adapters that change every merged weight
        for name, p in tm.engine.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed))
    return tm


def engine_weights(samplers: Samplers, session: Session) -> dict[str, torch.Tensor]:
    engine, _ = samplers.engine_for(session)
    return dict(engine.model.named_parameters())


def test_saved_and_in_memory_snapshots_reach_the_engine_bit_for_bit(tiny_model_path, tmp_path):
    from safetensors.torch import load_file

    base = BaseModel(tiny_model_path, tiny_model_path)
    first, second = trained_lora(tiny_model_path, 1), trained_lora(tiny_model_path, 2)
    saved = {n: t.clone() for n, t in first.engine.named_weights()}
    save_sampler_folder(tmp_path / "w1", saved, first.spec)
    samplers = Samplers(keep_in_memory=2)
    samplers.remember("mem:b", {n: t.clone() for n, t in second.engine.named_weights()})
    on_disk = Session("a", base, str(tmp_path / "w1"), None)
    in_memory = Session("b", base, "mem:b", None)
    base_session = Session("c", base, f"base:{tiny_model_path}", None)

    file = load_file(str(Path(tmp_path / "w1") / WEIGHTS_FILE))
    for _ in range(2):  # switching back and forth reloads each exactly
        held = engine_weights(samplers, on_disk)
        assert all(torch.equal(held[n], file[n]) and torch.equal(held[n], saved[n]) for n in held)
        held = engine_weights(samplers, in_memory)
        assert all(torch.equal(held[n], t) for n, t in second.engine.named_weights())
        held = engine_weights(samplers, base_session)
        original = dict(BaseModelWeights(tiny_model_path))
        assert all(torch.equal(held[n], original[n]) for n in held)
    assert not torch.equal(file["model.layers.0.self_attn.q_proj.weight"],
                           original["model.layers.0.self_attn.q_proj.weight"])  # the adapters changed it


def BaseModelWeights(path):
    from grpoflow.models.loading import load_causal_lm

    return {n: p.detach() for n, p in load_causal_lm(path).named_parameters()}.items()


def test_a_sample_ends_at_the_token_that_completes_a_stop_string():
    from grpoflow.tinker_server.sampling import cut_at_stop

    def decode(ids):
        return "".join({1: "ab", 2: "\n\nUs", 3: "er:", 4: "x"}[i] for i in ids)

    assert cut_at_stop([1, 2, 3, 4], ["\n\nUser:"], decode) == 3   # split over two tokens: cut after the second
    assert cut_at_stop([1, 4], ["\n\nUser:"], decode) is None
    assert cut_at_stop([1, 2, 3], [], decode) is None


def test_an_adapter_snapshot_loads_the_same_merged_weights_bit_for_bit(tiny_model_path):
    """save_weights_and_get_sampling_client keeps a LoRA model's adapters only, a fraction of its weights, and
    the engine merges them into exactly the weights the full snapshot held; each model keeps its own newest."""
    from grpoflow.tinker_server.sampling import adapter_snapshot

    tm = trained_lora(tiny_model_path, 3)
    snapshot = adapter_snapshot(tm.engine.model)
    full = {n: t.clone() for n, t in tm.engine.named_weights()}
    assert snapshot is not None and set(snapshot.deltas) < set(full)
    kept = sum(a.numel() + b.numel() for a, b, _ in snapshot.deltas.values())
    assert kept < sum(t.numel() for t in full.values()) / 4
    samplers = Samplers(keep_in_memory=1)
    base = BaseModel(tiny_model_path, tiny_model_path)
    samplers.remember("mem:s:train:0:sampler:1", snapshot)
    held = engine_weights(samplers, Session("x", base, "mem:s:train:0:sampler:1", None))
    assert all(torch.equal(held[n], full[n]) for n in full)
    samplers.remember("mem:s:train:1:sampler:1", full)        # another client's: kept beside it
    samplers.remember("mem:s:train:0:sampler:2", snapshot)    # the same client's newer one replaces it
    assert set(samplers._memory) == {"mem:s:train:1:sampler:1", "mem:s:train:0:sampler:2"}


def test_a_sample_ends_at_every_eos_id_of_the_generation_config(tiny_model_path, tmp_path):
    """The server's sampler stops where grpoflow's rollouts stop (engines.factory.end_ids): at the tokenizer's EOS
    and at each other `eos_token_id` of generation_config.json (Llama-3-Instruct and Qwen2.5 list several)."""
    import json
    import shutil

    from grpoflow.models.loading import load_tokenizer
    from grpoflow.engines.protocol import SamplingParams

    params = SamplingParams(n=1, max_new_tokens=12, temperature=1.0)  # seeded below: the same draws each time
    prompt = [5, 6, 7]
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path, folder)
    plain, _ = Samplers(keep_in_memory=1).engine_for(Session("a", BaseModel(str(folder), str(folder)),
                                                             f"base:{folder}", None))
    free = generate_batch(plain, [prompt], params, seeds=[3]).response_ids[0].tolist()
    eos = load_tokenizer(str(folder)).eos_token_id
    # the second EOS id: a token the free sample reaches after a few tokens, not earlier and not the tokenizer's EOS
    at = next(i for i, t in enumerate(free) if i >= 2 and t != eos and t not in free[:i])
    second = free[at]
    config_file = folder / "generation_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    config_file.write_text(json.dumps({**config, "eos_token_id": [eos, second]}))

    engine, _ = Samplers(keep_in_memory=1).engine_for(Session("b", BaseModel(str(folder), str(folder)),
                                                              f"base:{folder}", None))
    out = generate_batch(engine, [prompt], params, seeds=[3])
    kept = out.response_ids[0][out.response_mask[0].bool()].tolist()
    assert kept == free[:at + 1]          # the same tokens, up to and including the second EOS id
    assert not bool(out.truncated[0])     # ended by that id, not by max_new_tokens


def test_named_sampler_weights_of_a_lora_model_are_its_adapters_on_the_shared_base(tiny_model_path, tmp_path):
    """save_weights_for_sampler(name) of a LoRA model writes its adapters (referring to the base model by the spec's
    base_model), not a full merged copy, and a session on them samples with the merged weights bit for bit; a full
    fine-tuning model's named weights stay whole."""
    from grpoflow.tinker_server.sampling import ADAPTERS_FILE, adapter_snapshot

    tm = trained_lora(tiny_model_path, 4)
    full = {n: t.clone() for n, t in tm.engine.named_weights()}
    save_sampler_folder(tmp_path / "named", adapter_snapshot(tm.engine.model), tm.spec)
    files = {p.name: p.stat().st_size for p in (tmp_path / "named").iterdir()}
    assert ADAPTERS_FILE in files and WEIGHTS_FILE not in files
    assert files[ADAPTERS_FILE] < sum(t.numel() * t.element_size() for t in full.values()) / 4
    session = Session("n", BaseModel(tiny_model_path, tiny_model_path), str(tmp_path / "named"), None)
    held = engine_weights(Samplers(keep_in_memory=1), session)
    assert all(torch.equal(held[n], full[n]) for n in full)
    save_sampler_folder(tmp_path / "whole", full, ModelSpec(base_model=tiny_model_path, lora_rank=None))
    assert (tmp_path / "whole" / WEIGHTS_FILE).is_file() and not (tmp_path / "whole" / ADAPTERS_FILE).exists()
