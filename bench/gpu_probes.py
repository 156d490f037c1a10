"""What the GPU check (bench/gpu_check.py) measures beside its stages' own figures.

    memory_truth()     the allocator's view after a stage: free and used device memory (`torch.cuda.mem_get_info`,
                       what the driver sees: used beyond reserved is the CUDA context and memory torch does not
                       manage), reserved against allocated now and at the peak (the gap is what the caching
                       allocator holds unused: fragmentation, freed blocks); on a CPU the peak RSS
    UtilSampler        nvidia-smi polled in the background (every 500 ms) over the whole check; each stage gets the
                       mean and peak utilisation and the peak memory used in its own time window; without
                       nvidia-smi (a CPU) it is skipped and the table's title says so
    decode_figures()   the HF engine's decode step (engines/continuous.py) at a given row count: ms per step, the
                       device's busy time within it (the sum of its kernels, from the profiler), kernel launches and
                       host waits per step (the profiler names engines/decode_state.py's test counts), and the KV
                       cache's peak against its budget
"""

from __future__ import annotations

import datetime
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

HOST_WAITS = ("aten::_local_scalar_dense", "aten::lift_fresh", "aten::resolve_neg")
GIB = float(2**30)


def memory_truth() -> dict[str, Any]:
    """The device memory as the allocator and the driver see it (GiB), or the peak RSS on a CPU; {} for a stage that
    never touched CUDA (asking would create a context)."""
    import torch

    if not torch.cuda.is_available():
        return {"rss_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    if not torch.cuda.is_initialized():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"free_gib": round(free / GIB, 1), "used_gib": round((total - free) / GIB, 1),
            "alloc_gib": round(torch.cuda.memory_allocated() / GIB, 2),
            "reserved_gib": round(torch.cuda.memory_reserved() / GIB, 2),
            "peak_alloc_gib": round(torch.cuda.max_memory_allocated() / GIB, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 2)}


class UtilSampler:
    """nvidia-smi's utilisation and memory every 500 ms into `path` while the check runs (module docstring)."""

    QUERY = "--query-gpu=timestamp,utilization.gpu,memory.used"

    def __init__(self, path: Path) -> None:
        self.path, self.proc = path, None
        self.note = ""
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.note = "utilisation: nvidia-smi not found, not sampled"
            return
        self.file = path.open("w")
        self.proc = subprocess.Popen([smi, self.QUERY, "--format=csv,noheader,nounits", "-lms", "500"],
                                     stdout=self.file, stderr=subprocess.DEVNULL)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Mean and peak utilisation (%) and peak memory used (GiB) of the samples between `start` and `end` (time.time
        values); {} without samples."""
        if self.proc is None:
            return {}
        self.file.flush()
        util, used = [], []
        for line in self.path.read_text(errors="replace").splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                at = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                u, m = float(parts[1]), float(parts[2])
            except (ValueError, IndexError):
                continue  # a partial line or "[N/A]"
            if start <= at <= end:
                util.append(u)
                used.append(m)
        if not util:
            return {}
        return {"util_mean": round(statistics.mean(util)), "util_max": round(max(util)),
                "smi_used_gib": round(max(used) / 1024, 1)}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.file.close()


def decode_figures(engine: Any, rows: int, *, prompt: int, steps: int, profiled: int) -> dict[str, Any]:
    """`rows` requests of `prompt` tokens admitted at once into `engine` (an HFRolloutEngine), two decode steps to
    warm up, `steps` timed, `profiled` more under the profiler; the slots are freed after.

    Returns ms (wall per step, synchronised), gpu_ms (the device's kernels per step; None on a CPU), launches
    (kernels per step), waits (host waits per step: HOST_WAITS), kv_peak (columns) and kv_budget (columns)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grpoflow.engines.protocol import Request

    cuda = next(engine.model.parameters()).is_cuda

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    # distinct prompts (identical ones would be prefilled once and copied), ids away from the special tokens
    engine.admit([(i, Request(tuple(3 + (i * 7 + j) % 90 for j in range(prompt)), 2 + steps + profiled + 2,
                              stream=i)) for i in range(rows)])
    for _ in range(2):
        engine.tick(0)
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        engine.tick(0)
    sync()
    ms = (time.perf_counter() - started) * 1e3 / steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(profiled):
            engine.tick(0)
        sync()
    waits = sum(1 for e in prof.events() if e.name in HOST_WAITS) / profiled
    out: dict[str, Any] = {"ms": round(ms, 2), "gpu_ms": None, "launches": None, "waits": waits}
    if cuda:
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        out["gpu_ms"] = round(sum(e.self_device_time_total for e in kernels) / 1e3 / profiled, 2)
        out["launches"] = round(sum(e.count for e in kernels) / profiled)
    live = sum(r is not None for r in engine.sampler.rows)
    out.update(live=live, kv_peak=engine.sampler.peak_columns, kv_budget=engine.sampler.budget)
    engine.pause()
    engine.sleep()
    return out
