"""A bf16 run on a CPU without bf16 units is told so at start, and model.compute_dtype=auto picks bf16 only where the
hardware has them (training/bf16_units.py): cpuinfo read as Linux writes it, for x86 and Arm; the actor's warning
the recipes' auto resolved for this machine when a run starts, into config.yaml; auto refused with Ray."""

import logging

import pytest
import torch
import yaml

from grpoflow.config import load_config
from grpoflow.errors import UserError
from grpoflow.commands.run import train
from grpoflow.plan.run_plan import with_compute_dtype
from grpoflow.training.bf16_units import (auto_compute_dtype, cpu_has_bf16_units, default_compute_dtype,
                                          slow_bf16_warning, this_machines_compute_dtype,
                                          this_machines_cuda_capability)

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


# compute capabilities of devices as torch.cuda.get_device_capability() reports them
H200, A100, RTX_3090, T4, V100 = (9, 0), (8, 0), (8, 6), (7, 5), (7, 0)


def test_auto_is_bf16_only_on_hardware_with_bf16_units():
    assert auto_compute_dtype(None, True) == "bfloat16"        # a CPU with AVX512-BF16 or AMX
    assert auto_compute_dtype(None, False) == "float32"        # AVX-512 without them: emulated, slower
    assert auto_compute_dtype(None, None) == "float32"         # cannot tell (no /proc/cpuinfo)
    for gpu in (H200, A100, RTX_3090):
        assert auto_compute_dtype(gpu, False) == "bfloat16"    # a GPU with bf16 tensor cores, whatever the CPU
    for gpu in (T4, V100):                                     # torch calls bf16 "supported" there: emulated
        assert auto_compute_dtype(gpu, True) == "float32"


def test_the_default_is_bf16_on_a_gpu_with_native_bf16_and_float32_on_every_cpu():
    for gpu in (H200, A100, RTX_3090):
        assert default_compute_dtype(gpu) == "bfloat16"
    for gpu in (T4, V100):
        assert default_compute_dtype(gpu) == "float32"
    assert default_compute_dtype(None) == "float32"            # a CPU, with or without bf16 units: as before
    cfg = load_config(None)
    assert cfg.model.compute_dtype is None                     # the default, shown as asked
    assert with_compute_dtype(cfg).model.compute_dtype == default_compute_dtype(this_machines_cuda_capability())
    if not torch.cuda.is_available():                          # CI: a CPU run computes in float32, as it did
        assert with_compute_dtype(cfg).model.compute_dtype == "float32"
        assert with_compute_dtype(load_config(None, ["backend=ray"])).model.compute_dtype == "float32"


def test_the_agentic_recipes_resolve_auto_for_this_machine_when_a_run_starts():
    here = this_machines_compute_dtype()
    if not torch.cuda.is_available():
        assert here == auto_compute_dtype(None, cpu_has_bf16_units())
    for recipe in ("smollm2_calculator", "smollm2_guess_number"):
        cfg = load_config(recipe)
        assert cfg.model.compute_dtype == "auto"                 # as asked: `grpoflow config` shows it
        run = with_compute_dtype(cfg)
        assert run.model.compute_dtype == here and cfg.model.compute_dtype == "auto"
        assert slow_bf16_warning(run.model.dtype, run.model.compute_dtype, torch.device("cpu")) is None
    fixed = load_config(None, ["model.compute_dtype=bfloat16"])
    assert with_compute_dtype(fixed) is fixed


def test_a_run_writes_the_resolved_dtype_into_config_yaml(tmp_path):
    train(load_config(None, [f"trainer.output_dir={tmp_path}", "model.compute_dtype=auto", "sft.steps=2",
                             "trainer.total_steps=1", "data.prompts_per_step=2", "rollout.n=2",
                             "rollout.max_new_tokens=3", "trainer.val_every=0", "trainer.save_every=0"]))
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["model"]["compute_dtype"] == this_machines_compute_dtype()


def test_auto_with_ray_asks_for_the_ranks_dtype():
    with pytest.raises(UserError, match=r"model.compute_dtype=auto looks at this machine's hardware, and with "
                                        r"backend=ray the ranks may compute on others: set "
                                        r"model.compute_dtype=bfloat16 .* or float32"):
        with_compute_dtype(load_config("smollm2_calculator", ["backend=ray"]))
    cfg = load_config("smollm2_calculator", ["backend=ray", "model.compute_dtype=float32"])
    assert with_compute_dtype(cfg) is cfg
