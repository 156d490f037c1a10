"""The headline figure of each recipe the README runs, kept in one place: `bench/headlines.yaml`.

Per recipe the file holds the command a user types, the metric it reports, what was measured (values, seconds,
CPU, threads, whether the machine was idle, date, commit) and the range a run must land in. This module

- renders the figures as README.md and docs/ quote them (`quotes`): `tests/unit/test_headlines.py` checks that
  every rendered quote is in its file, so a doc cannot drift from the data;
- runs a headline command as a user would (`grpoflow train <recipe>` in a subprocess, into a fresh output
  folder), reads its `metrics.jsonl` and checks the result against the range;
- runs it as CI does (`ci_check`): whole where the entry says `ci: full`, else shortened by the entry's `ci`
  overrides and checked against its `ci` range (the warm start's figure, the metrics the docs quote):
  `tests/integration/test_headline_runs.py` (slow stage, tiny-model recipes) and
  `tests/real_model/test_smollm2_headlines.py` (real-model stage). A whole run of every recipe takes about an hour
  on a 2-core CPU, more than CI's budget: re-measure them all when a change may move a figure.

    python bench/headlines.py calculator_tool    # run it whole; prints the `measured:` block for headlines.yaml
    python bench/headlines.py --all              # every recipe whole (SmolLM2 ones: model.path=$GRPOFLOW_SMOLLM2)

Results depend in the last bits on the CPU's float kernels and the thread count (docs/getting-started.md, "The
built-in job: what `make train` does"), so the ranges are wide enough for either CI CPU, and each measurement names
the CPU it ran on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "headlines.yaml"


def load(path: Path = DATA) -> dict[str, dict]:
    """The recipes of headlines.yaml by name."""
    return yaml.safe_load(path.read_text())["recipes"]


def figures(entry: dict) -> dict:
    """The values a quote may name: before, after, gain (after - before), seconds, minutes, for each `also` figure
    <name>_before and <name>_after, and the entry's `measured` and `accept` ({accept[after][0]:.0%})."""
    m = entry["measured"]
    values = {"before": m["before"], "after": m["after"], "gain": m["after"] - m["before"],
              "seconds": m["seconds"], "minutes": m["seconds"] / 60, "measured": m, "accept": entry.get("accept")}
    for name, pair in (m.get("also") or {}).items():
        values[f"{name}_before"], values[f"{name}_after"] = pair
    return values


def quotes(entry: dict) -> list[tuple[str, str]]:
    """(file relative to the repository, the text it must contain) for every quote of the entry."""
    values = figures(entry)
    return [(file, template.format(**values)) for file, templates in entry["quotes"].items()
            for template in templates]


def headline_argv(entry: dict, out: Path, overrides: tuple[str, ...] = ()) -> list[str]:
    """The entry's command as this interpreter runs it, into `out` (`grpoflow X` -> `python -m grpoflow.cli X`)."""
    words = shlex.split(entry["command"])
    if words[0] != "grpoflow":
        raise ValueError(f"headline command {entry['command']!r} must start with `grpoflow`.")
    return [sys.executable, "-m", "grpoflow.cli", *words[1:], f"trainer.output_dir={out}", *overrides]


def read_run(run_dir: Path, entry: dict) -> dict:
    """before/after of the entry's metric (its first and last logged value) and of its `also` metrics."""
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]

    def first_last(key: str) -> list[float]:
        values = [r[key] for r in records if key in r]
        if len(values) < 2:
            raise ValueError(f"{run_dir}/metrics.jsonl has {len(values)} values of {key!r}; a headline run "
                             f"validates before and after GRPO (trainer.val_every).")
        return [round(values[0], 4), round(values[-1], 4)]

    before, after = first_last(entry["metric"])
    also = {name: first_last(key) for name, key in (entry.get("also") or {}).items()}
    return {"before": before, "after": after, **({"also": also} if also else {})}


def out_of_range(measured: dict, entry: dict) -> list[str]:
    """What lies outside the entry's accepted range ([] when the run is as quoted): the metric's before and after
    each within [low, high] and after - before >= min_gain, and the same for each figure under `accept.also`."""
    accept = entry["accept"]
    problems = _outside("", measured["before"], measured["after"], accept)
    for name, spec in (accept.get("also") or {}).items():
        problems += _outside(f"{name} ", *measured["also"][name], spec)
    return problems


def _outside(label: str, before: float, after: float, spec: dict) -> list[str]:
    problems = []
    for key, value in (("before", before), ("after", after)):
        if key in spec and not spec[key][0] <= value <= spec[key][1]:
            low, high = spec[key]
            problems.append(f"{label}{key} {_show(value)} outside [{_show(low)}, {_show(high)}]")
    if "min_gain" in spec and after - before < spec["min_gain"]:
        problems.append(f"{label}gain {_show(after - before, '+')} below {_show(spec['min_gain'], '+')}")
    return problems


def _show(value: float, sign: str = "") -> str:
    """A fraction as a percentage (0.25 -> 25.0%), a count as it is (52.0 -> 52)."""
    return f"{value:{sign}.1%}" if abs(value) <= 1 else f"{value:{sign}g}"


def cpu_name() -> str:
    """`lscpu`'s model name and the bf16 flags: 'AMD EPYC (avx512_bf16)', 'Intel(R) Xeon(R) ... (amx_bf16)'."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{name}, {os.cpu_count()} cores ({', '.join(bf16) or 'no bf16 units'})"


def commit() -> str:
    """The short commit of the checkout, with `+changes` when the package (code or recipes) differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "--", "grpoflow") else "")


def run_headline(name: str, out: Path, overrides: tuple[str, ...] = ()) -> dict:
    """Run recipe `name`'s headline command into `out`, echoing its output; its `measured:` block."""
    entry = load()[name]
    argv = headline_argv(entry, out, overrides)
    load_before, checkout = round(os.getloadavg()[0], 2), commit()
    print(f"headline {name}: {' '.join(argv)} (load average {load_before})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "console.log"   # progress bars and all: only the summary lines are echoed
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    seconds = time.perf_counter() - start
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"`{entry['command']}` exited with {proc.returncode}; the end of its output:\n"
                           f"{text[-4000:]}")
    shown = ("held-out accuracy", "held-out mean reward", "done in")
    print("\n".join(line for line in text.splitlines() if line.startswith(shown)))
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    return {**read_run(out, entry), "seconds": round(seconds), "cpu": cpu_name(), "threads": threads,
            "load_before": load_before, "load_after": round(os.getloadavg()[0], 2),
            "date": datetime.date.today().isoformat(), "commit": checkout}


def ci_check(name: str, out: Path, overrides: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """Run recipe `name` as CI does: whole against its range (`ci: full`), or shortened by its `ci.overrides`
    against `ci.accept`; (what the run gave, what lies outside the range)."""
    entry = load()[name]
    if entry["ci"] == "full":
        measured = run_headline(name, out, overrides)
        return measured, out_of_range(measured, entry)
    measured = run_headline(name, out, (*entry["ci"]["overrides"], *overrides))
    return measured, out_of_range(measured, {"accept": entry["ci"]["accept"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", choices=sorted(load()))
    parser.add_argument("overrides", nargs="*", help="k=v added to the command (model.path=... for SmolLM2)")
    parser.add_argument("--all", action="store_true", help="run every recipe whole, one after another "
                        "(the SmolLM2 ones with model.path=$GRPOFLOW_SMOLLM2)")
    args = parser.parse_args()
    if args.all == bool(args.recipe):
        parser.error("name one recipe, or --all")
    names = sorted(load()) if args.all else [args.recipe]
    if args.all and not os.environ.get("GRPOFLOW_SMOLLM2"):   # before the first hour of runs, not after it
        parser.error("--all needs GRPOFLOW_SMOLLM2 (the SmolLM2 folder .ci/real_model_stage prepare makes)")
    failed = []
    for name in names:
        overrides = tuple(args.overrides)
        if args.all and name.startswith("smollm2_"):
            overrides += (f"model.path={os.environ['GRPOFLOW_SMOLLM2']}",)
        with tempfile.TemporaryDirectory() as tmp:
            measured = run_headline(name, Path(tmp) / "run", overrides)
        problems = out_of_range(measured, load()[name])
        print(yaml.safe_dump({name: {"measured": measured}}, sort_keys=False, default_flow_style=None), end="")
        print("in range" if not problems else "OUT OF RANGE: " + "; ".join(problems), flush=True)
        failed += [name] if problems else []
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
