"""Whether a CPU multiplies bf16 in hardware, and the warning a bf16 run gets on one that does not.

torch runs bf16 matrix products on any x86 CPU with AVX-512, but only a CPU with AVX512-BF16 or AMX-BF16 (or an Arm
CPU with the BF16 extension) has instructions for them. Elsewhere each product converts to float32 and back, and
bf16 is several times slower than float32 instead of faster (docs/performance-log.md, "What each optimisation
bought", item 3). `model.compute_dtype=bfloat16` would make such a machine's run several times slower, so the actor
says so at start and names the fix. `model.compute_dtype=auto` (the SmolLM2 agentic recipes set it) picks bfloat16
only where the hardware has the units.

GPUs likewise: torch calls bf16 "supported" on a V100 or T4 (compute capability 7.x), which emulate it; only 8.0
and newer (Ampere, Hopper, Blackwell) have bf16 tensor cores. The default (`model.compute_dtype` None) is bfloat16
with float32 masters on such a GPU, as verl and TRL default to bf16 there, and float32 on every CPU, so that no CPU
run changes with it.
"""

from __future__ import annotations

from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")   # x86 flags; Arm's "Features" name the extension bf16


def cpu_bf16_flags(cpuinfo: Path = CPUINFO) -> list[str]:
    """The bf16 flags `cpuinfo` lists (x86 "flags", Arm "Features"), in BF16_FLAGS' order; [] where none or no file."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return [flag for flag in BF16_FLAGS if flag in value.split()]
    return []


# Measured speed-up of model.compute_dtype=bfloat16 over float32 per RL step, SmolLM2-135M-Instruct, 2 threads
# (docs/performance.md, "The real-model row": 16.79 s -> 7.34 s per step on the AMD EPYC with avx512_bf16)
MEASURED_BF16 = "2.3x faster per step on SmolLM2-135M on an AMD EPYC with avx512_bf16 (docs/performance.md)"


def bf16_available_hint(setting: str | None, resolved: str, device_type: str, cpuinfo: Path = CPUINFO) -> str | None:
    """The start-up line of a run that computes in float32 on a CPU with bf16 units because `model.compute_dtype`
    was left unset (`setting` None): that bfloat16 is there and what it was measured to buy. None otherwise (a GPU,
    a dtype the user chose, a CPU without the units)."""
    flags = cpu_bf16_flags(cpuinfo)
    if setting is not None or resolved != "float32" or device_type != "cpu" or not flags:
        return None
    return (f"this CPU has bf16 units ({', '.join(flags)}): model.compute_dtype=bfloat16 (or auto) computes in bf16 "
            f"with float32 master weights, measured {MEASURED_BF16}; this run computes in float32, the default.")


def cpu_has_bf16_units(cpuinfo: Path = CPUINFO) -> bool | None:
    """True if the CPU lists a bf16 extension in `cpuinfo` (Linux's /proc/cpuinfo: x86 "flags", Arm "Features"),
    False if it lists its flags without one, None where there is no such file to read (macOS, Windows)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return any(flag in value.split() for flag in BF16_FLAGS)
    return None


def slow_bf16_warning(dtype: str, compute_dtype: str | None, device: torch.device,
                      cpuinfo: Path = CPUINFO) -> str | None:
    """The warning for a run that stores (`model.dtype`) or computes (`model.compute_dtype`) in bfloat16 on a CPU
    without bf16 units; None on a GPU, a CPU with them, one that cannot tell, or in float32."""
    if "bfloat16" not in (dtype, compute_dtype) or device.type != "cpu" or cpu_has_bf16_units(cpuinfo) is not False:
        return None
    keys = " and ".join(f"model.{k}=float32" for k, v in (("dtype", dtype), ("compute_dtype", compute_dtype))
                        if v == "bfloat16")
    return (f"bfloat16 on a CPU without bf16 units ({cpuinfo} lists none of avx512_bf16, amx_bf16): torch converts "
            f"each bf16 matrix product to float32 and back, so this run is several times slower than in float32 "
            f"(docs/performance-log.md, \"What each optimisation bought\"). Set {keys} for this machine.")


NATIVE_BF16_CAPABILITY = (8, 0)  # Ampere (A100, RTX 30xx) and newer; V100 (7.0) and T4 (7.5) only emulate bf16


def cuda_has_bf16_units(capability: tuple[int, int]) -> bool:
    """Whether a CUDA device of this compute capability multiplies bf16 in its tensor cores. torch reports bf16 as
    supported on older devices too (`torch.cuda.is_bf16_supported()` counts emulation), where it runs slower than
    float32."""
    return tuple(capability) >= NATIVE_BF16_CAPABILITY


def default_compute_dtype(cuda_capability: tuple[int, int] | None) -> str:
    """`model.compute_dtype` unset (None, the default) resolved: bfloat16 on a CUDA device with native bf16
    (`cuda_capability` >= 8.0), float32 on every other device, every CPU included (so no CPU run changes)."""
    return "bfloat16" if cuda_capability is not None and cuda_has_bf16_units(cuda_capability) else "float32"


def auto_compute_dtype(cuda_capability: tuple[int, int] | None, cpu_units: bool | None) -> str:
    """`model.compute_dtype=auto` resolved: on a CUDA device (`cuda_capability` not None) bfloat16 if it has native
    bf16 (8.0 or newer); without one, bfloat16 if the CPU has bf16 units; float32 otherwise, also where that
    cannot be told."""
    if cuda_capability is not None:
        return default_compute_dtype(cuda_capability)
    return "bfloat16" if cpu_units else "float32"


def this_machines_cuda_capability() -> tuple[int, int] | None:
    """The compute capability of this process's CUDA device (the one a local run trains on), None without CUDA."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return int(major), int(minor)


def this_machines_compute_dtype(setting: str | None = "auto") -> str:
    """`setting` (model.compute_dtype: None, the default, or auto) resolved for this machine."""
    capability = this_machines_cuda_capability()
    if setting is None:
        return default_compute_dtype(capability)
    return auto_compute_dtype(capability, cpu_has_bf16_units())
