"""verifiers' harness programs, built once per process before step 1 (`rollout.agent.program=verifiers`).

A verifiers harness readies its program in `Harness.setup(runtime)`: the chat loop of the `null` and `bash`
harnesses (and mini-SWE-agent's, Terminus's) is a PEP 723 script held in memory (`CHAT_PROGRAM_SOURCE`), which
`runtime.prepare_uv_script` writes to a path named by its digest (`<scripts_dir>/<sha256>.py`; the subprocess
runtime's scripts_dir is ~/.cache/verifiers/runtimes/scripts) and builds with `uv sync --script`. Left to verifiers
that happens in the first episode of each process, and verifiers runs uv with UV_OFFLINE=false there (it builds
before a sandbox's network is restricted), so offline every episode of step 1 failed.

`prepare_harnesses` does it when the agent is built (the start-up check, then each rollout worker), for each
harness a seat runs locally (the subprocess runtime), once per process:

1. `Harness.setup` against `UvPrograms`, a stand-in runtime that notes the uv programs it is asked to prepare
   (the in-memory source and its environment) and builds nothing;
2. grpoflow writes each where verifiers will and builds it with uv's own settings in force, the user's: `uv lock
   --script` then `uv sync --script` (UV_OFFLINE=1: only the cache, UV_CACHE_DIR; UV_DEFAULT_INDEX: a mirror). The
   lock (`<sha256>.py.lock`, beside the script) pins what was resolved, and an online lock leaves in uv's cache
   what an offline one needs;
3. `Harness.setup` with a real subprocess runtime, verifiers' own code path, as at an episode: with the
   environment built and locked, its `uv sync --script` needs no network although verifiers sets
   UV_OFFLINE=false, and the interpreter it finds is kept in verifiers' per-process table, so no episode builds
   the harness.

A harness whose setup asks the runtime for more than uv programs (Codex, Claude Code: node and npm) skips step 2,
and step 3 does what verifiers does. A failure in step 2 or 3 is one UserError naming the harness, the command,
uv's last lines and the fix. Imports verifiers only when called.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpoflow.errors import UserError

log = logging.getLogger("grpoflow.verifiers")
LOCAL_RUNTIME = {"type": "subprocess"}
TIMEOUT_S = 900.0  # one uv command, or verifiers' setup of one harness
_prepared: set[str] = set()  # the harnesses built in this process (their config as JSON)


@dataclass
class UvProgram:
    source: bytes
    env: dict[str, str]


class UvPrograms:
    """A stand-in for a verifiers runtime in `Harness.setup`: notes each `prepare_uv_script` call, builds nothing.
    A harness whose setup needs any other runtime method fails here with AttributeError."""

    def __init__(self) -> None:
        self.programs: list[UvProgram] = []

    async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        self.programs.append(UvProgram(script.encode() if isinstance(script, str) else script, dict(env or {})))
        return ["true"]


def uv_offline() -> bool:
    return os.environ.get("UV_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def build_failed(harness: str, command: str, failed: str, output: str) -> UserError:
    """The one error of a harness that cannot be built: what ran, uv's last lines, why, and the fix."""
    cache = os.environ.get("UV_CACHE_DIR") or "~/.cache/uv"
    why = (f"UV_OFFLINE is set, so uv looked only in its cache (UV_CACHE_DIR={cache}), which does not hold the "
           "harness's packages" if uv_offline() else "uv could not fetch the harness's packages (no network, a "
           "proxy, or an index it cannot reach: UV_DEFAULT_INDEX / UV_INDEX_URL)")
    tail = "\n".join(output.strip().splitlines()[-12:])
    return UserError(
        f"rollout.agent.program=verifiers: verifiers' harness {harness!r} could not be built before step 1: "
        f"`{command}` {failed}; {why}." + (f"\nuv said:\n{tail}" if tail else "") +
        "\nFix: build it once where uv reaches its index (this run, or that command, online: uv keeps the packages "
        "in its cache), then run offline with UV_OFFLINE=1 and UV_CACHE_DIR pointing at that cache (copy the folder "
        "to this machine if it is another one); or give the seat a container runtime that holds it "
        "({runtime: {type: docker}}).")


def uv_build(program: UvProgram, scripts_dir: str, harness: str) -> None:
    """Step 2: write `program` where verifiers' subprocess runtime puts it and lock and sync it with the user's uv
    settings (verifiers' command, `uv sync --script <path> -q --no-config`, with UV_OFFLINE left as the user set it)."""
    path = Path(scripts_dir) / f"{hashlib.sha256(program.source).hexdigest()}.py"
    if not path.is_file() or path.read_bytes() != program.source:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(program.source)
        tmp.replace(path)  # atomic, as verifiers' `mv -f`: a concurrent reader never sees half a script
    env = {k: v for k, v in os.environ.items() if "API_KEY" not in k.upper()}  # as verifiers' subprocess runtime
    env.update(program.env)
    uv = shutil.which("uv") or "uv"
    for args in (["lock", "--script", str(path), "--no-config"], ["sync", "--script", str(path), "-q", "--no-config"]):
        command = " ".join(["uv", *args])
        try:
            done = subprocess.run([uv, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise build_failed(harness, command, f"did not finish in {TIMEOUT_S:.0f} s", "") from None
        except OSError as e:
            raise build_failed(harness, command, f"could not start ({e})", "") from None
        if done.returncode:
            raise build_failed(harness, command, f"exited {done.returncode}", done.stderr or done.stdout)


async def prepare_one(vf: Any, harness_config: Any, runtime_config: Any) -> None:
    """Steps 1-3 of the module docstring for one harness of a local seat."""
    from verifiers.v1.runtimes import SubprocessRuntime, provision_runtime

    name = str(harness_config.id)
    plan = UvPrograms()
    try:
        await vf.load_harness(harness_config).setup(plan)
    except AttributeError as e:  # its setup needs a real runtime (node, npm): verifiers alone builds it (step 3)
        log.info("verifiers' harness %r readies more than uv programs (%s); it is built as verifiers does", name, e)
        plan.programs = []
    for program in plan.programs:
        await asyncio.to_thread(uv_build, program, SubprocessRuntime.scripts_dir, name)
    try:
        async with provision_runtime(runtime_config) as runtime:
            await asyncio.wait_for(vf.load_harness(harness_config).setup(runtime), TIMEOUT_S)
    except Exception as e:  # verifiers' own setup: its uv (UV_OFFLINE=false), npm, ...
        raise build_failed(name, f"verifiers' Harness.setup of {name!r} (uv sync --script, which verifiers runs "
                                 "with UV_OFFLINE=false)", f"failed ({type(e).__name__})", str(e)) from None


def local_harnesses(vf: Any, configs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """(harness config, runtime config) of every seat that runs in the subprocess runtime, one per harness config;
    `configs`: (a resolved EnvConfig, the harness of its seats that name none)."""
    found: dict[str, tuple[Any, Any]] = {}
    for config, default in configs:
        for _, seat in config:
            if isinstance(seat, vf.AgentConfig) and seat.runtime.type == LOCAL_RUNTIME["type"]:
                harness = seat.harness if seat.harness is not None else default
                found.setdefault(harness.model_dump_json(), (harness, seat.runtime))
    return list(found.values())


def prepare_harnesses(vf: Any, configs: list[tuple[Any, Any]]) -> None:
    """Build the harness of each local seat of `configs` ((EnvConfig, default harness) pairs) before step 1, once per
    process (module docstring)."""
    for harness, runtime in local_harnesses(vf, configs):
        key = harness.model_dump_json()
        if key in _prepared:
            continue
        start = time.perf_counter()
        asyncio.run(prepare_one(vf, harness, runtime))
        _prepared.add(key)
        log.info("verifiers' harness %r built in %.1f s", str(harness.id), time.perf_counter() - start)
