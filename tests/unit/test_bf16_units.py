"""A bf16 run on a CPU without bf16 units is told so at start (training/bf16_units.py): cpuinfo read as Linux
writes it, for x86 and Arm, and the actor's warning on this machine."""

import logging

import pytest
import torch

from grpoflow.training.bf16_units import cpu_has_bf16_units, slow_bf16_warning

ICE_LAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni avx512_bitalg\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd atomics\n"


def info(tmp_path, text):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, has", [(ICE_LAKE, False), (SAPPHIRE, True), (EPYC, True), (GRAVITON3, True),
                                       (GRAVITON2, False), ("processor\t: 0\n", None)])
def test_the_flags_say_whether_the_cpu_has_bf16_units(tmp_path, text, has):
    assert cpu_has_bf16_units(info(tmp_path, text)) is has


def test_no_cpuinfo_cannot_tell(tmp_path):
    assert cpu_has_bf16_units(tmp_path / "absent") is None


def test_only_bf16_on_a_cpu_without_units_is_warned(tmp_path):
    cpu, none, units = torch.device("cpu"), info(tmp_path, ICE_LAKE), tmp_path / "units"
    units.write_text(SAPPHIRE)
    message = slow_bf16_warning("float32", "bfloat16", cpu, none)
    assert message is not None and "Set model.compute_dtype=float32 for this machine." in message
    assert "model.dtype=float32 and model.compute_dtype=float32" in slow_bf16_warning("bfloat16", "bfloat16", cpu, none)
    assert slow_bf16_warning("float32", "float32", cpu, none) is None
    assert slow_bf16_warning("float32", "bfloat16", cpu, units) is None
    assert slow_bf16_warning("float32", "bfloat16", cpu, tmp_path / "absent") is None
    assert slow_bf16_warning("float32", "bfloat16", torch.device("cuda", 0), none) is None


def test_the_actor_warns_at_start_where_this_machine_lacks_them(tiny_model_path, caplog):
    from grpoflow.config import ActorConfig, ModelConfig
    from grpoflow.workers.actor import ActorWorker

    expected = slow_bf16_warning("float32", "bfloat16", torch.device("cpu"))  # None on a CPU with bf16 units
    with caplog.at_level(logging.WARNING, logger="grpoflow.precision"):
        ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=1.0, horizon=4, seed=0,
                    model_cfg=ModelConfig(compute_dtype="bfloat16"))
        ActorWorker(0, 1, model_path=tiny_model_path, cfg=ActorConfig(), temperature=1.0, horizon=4, seed=0)
    said = [r.getMessage() for r in caplog.records if r.name == "grpoflow.precision"]
    assert said == ([expected] if expected else [])
