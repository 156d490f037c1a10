"""The dependency direction of docs/architecture.md ("The parts and their layering"), checked on the source with
`ast`; the page's parts table is checked against FORBIDDEN_PARTS below, so the two cannot drift.

    errors, plugins, user_code -> algorithms, rewards -> data, models -> training | engines -> trajectories -> plan
        -> workers -> distributed -> controller -> commands -> cli

`training` and `engines` sit side by side and never import each other; `config` imports only `errors`, and inside it
`schema <- checks <- loading` (`moved`, `precedence` and `foreign`'s translations of verl's and TRL's keys: stdlib
only).
`errors` (the user-error types, stdlib only) sits under everything, and so does `atomic_folder` (folders published
whole, stdlib only: the run's checkpoints and the Tinker server's saved states).
`user_code` (processes that run reward functions and tools under limits) is standard library + `plugins`,
`user_code_child` (its child side) and `sandbox` (what a sandboxed worker gives up; stdlib only).

Every import counts, including lazy ones inside functions: a lazy import is still a dependency.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import grpoflow

ROOT = Path(grpoflow.__file__).parent

# The parts of grpoflow, and the grpoflow parts each may NOT import. `tasks` (built-in task data)
# sits with `data`. A new top-level part must be placed here, so the direction stays checked.
UPPER_OF_DATA = {"training", "engines", "trajectories", "plan", "workers", "distributed", "controller", "commands",
                 "tinker_server", "cli", "plotting", "viewer"}
EVERY_PART = {"errors", "plugins", "sandbox", "user_code_child", "user_code", "plotting", "algorithms", "rewards",
              "data", "models", "tasks", "training", "engines", "trajectories", "plan", "workers", "distributed",
              "controller", "commands", "tinker_server", "config", "cli", "viewer",
              "local_http", "atomic_folder", "metrics_file"}
FORBIDDEN_PARTS = {
    "errors": None,  # None: nothing from any other grpoflow part (the user-error types; stdlib only)
    "plugins": EVERY_PART - {"errors", "plugins"},  # registries, user-file loading; stdlib only
    "sandbox": EVERY_PART - {"sandbox"},  # stdlib only: what a sandboxed worker gives up, the reply format
    "user_code_child": EVERY_PART - {"sandbox", "user_code_child"},
    "user_code": EVERY_PART - {"errors", "plugins", "sandbox", "user_code_child", "user_code"},
    # reads metrics.jsonl via metrics_file
    "plotting": {"training", "engines", "plan", "workers", "distributed", "commands", "tinker_server", "cli"},
    # grpoflow view reads run folders (and a run's config.yaml for its schedule); it never loads torch or a model
    "viewer": EVERY_PART - {"errors", "plugins", "config", "viewer", "local_http", "metrics_file"},
    "local_http": EVERY_PART - {"local_http"},  # stdlib only: the local servers' Host and body-type checks
    "atomic_folder": EVERY_PART - {"atomic_folder"},  # stdlib only: checkpoints' and saved states' publishing
    "metrics_file": EVERY_PART - {"errors", "metrics_file"},  # metrics.jsonl read back: the controller's and viewer's
    "algorithms": EVERY_PART - {"errors", "plugins", "algorithms"},
    "rewards": EVERY_PART - {"errors", "plugins", "user_code", "rewards"},
    "data": UPPER_OF_DATA,
    "models": UPPER_OF_DATA,
    "tasks": UPPER_OF_DATA,
    "training": {"engines", "trajectories", "plan", "workers", "distributed", "controller", "commands", "tinker_server",
                 "cli", "plotting"},
    "engines": {"training", "trajectories", "plan", "workers", "distributed", "controller", "commands", "tinker_server",
                "cli", "plotting"},
    # the agent loop drives the engines through a generate function it is given: no workers, no placement
    "trajectories": {"training", "plan", "workers", "distributed", "controller", "commands", "tinker_server", "cli",
                     "plotting"},
    # one place assembles a run: the start-up check's resolved registry names (RunParts, which the workers take) and
    # the plan (rows, model folder, tokenizer, prompts); the controller and the commands take it and resolve nothing
    "plan": {"workers", "distributed", "controller", "commands", "tinker_server", "cli", "plotting"},
    "workers": {"distributed", "controller", "commands", "tinker_server", "cli", "plotting"},
    "distributed": {"controller", "commands", "tinker_server", "cli", "plotting"},
    # the step and the run around it; what builds a run from its config is a command, above it
    "controller": {"commands", "cli", "tinker_server"},
    # train, sft, eval, export, serve: build what the config asks for and run it; only the cli calls them
    "commands": {"cli"},
    # the Tinker API server, on the engines and atomic folders; `grpoflow serve tinker` (commands/serve.py) starts
    # it. It sits beside the controller, not above it: nothing of the RL step or its checkpoints
    "tinker_server": {"commands", "cli", "workers", "distributed", "trajectories", "plan", "controller"},
    # schema, checks and loading of plain values: no torch, no registries (CONFIG_ORDER inside it)
    # verl's keys and TRL's fields -> ours live inside it (config/foreign/)
    "config": EVERY_PART - {"errors", "config"},
    "cli": set(),
}
# The modules of the config package, in import order: each imports only modules before it (no circle); none imports
# the package itself (its __init__ imports them all). `moved` is stdlib only, so run-folder readers can use it;
# `precedence` (which of two keys deciding one thing wins across the layers) too, and the translations of verl's
# and TRL's keys (`foreign`, whose __init__ imports nothing); `foreign.verl_script` reads values through `loading`.
CONFIG_ORDER = ("grpoflow.config.moved", "grpoflow.config.precedence", "grpoflow.config.foreign",
                "grpoflow.config.foreign.translation", "grpoflow.config.foreign.verl", "grpoflow.config.foreign.trl",
                "grpoflow.config.schema", "grpoflow.config.checks", "grpoflow.config.loading",
                "grpoflow.config.foreign.verl_script")
# stdlib only but for one another (a grpoflow import outside these fails)
CONFIG_STDLIB_ONLY = ("grpoflow.config.moved", "grpoflow.config.precedence", "grpoflow.config.foreign",
                      "grpoflow.config.foreign.translation", "grpoflow.config.foreign.verl",
                      "grpoflow.config.foreign.trl")
# third-party modules that the pure parts never touch
PURE_PARTS_NEVER_IMPORT = ("torch.distributed", "ray", "vllm", "grpoflow.config")


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every module name `source` imports; `from a import b` yields both a and a.b."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))
    return found


def all_modules() -> list[tuple[str, str, Path]]:
    """(dotted module name, part, path) of every .py file under grpoflow/."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        part = parts[1] if len(parts) > 1 else "grpoflow"
        out.append((module, part, path))
    return out


def part_of(name: str) -> str | None:
    """The grpoflow part an imported module name belongs to (None if it is not grpoflow's)."""
    bits = name.split(".")
    if bits[0] != "grpoflow":
        return None
    return bits[1] if len(bits) > 1 else "grpoflow"


def _imports(module, path):
    return imported_modules(path.read_text(), module, path.name == "__init__.py")


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# ---------------------------------------------------------------- the checker itself


def test_import_collector_sees_every_form():
    source = (
        "import ray\n"
        "from grpoflow import config\n"
        "from torch import distributed as dist\n"
        "from . import sibling\n"
        "from ..training.engine import TrainEngine\n"
        "import importlib\n"
        "def f():\n"
        "    import vllm.engine\n"
        "    return importlib.import_module('sglang')\n"
    )
    found = imported_modules(source, "grpoflow.workers.actor", is_package=False)
    assert {"ray", "grpoflow.config", "torch.distributed", "grpoflow.workers.sibling",
            "grpoflow.training.engine", "vllm.engine", "sglang"} <= found


def test_checker_sees_the_real_tree():
    modules = {m: (part, p) for m, part, p in all_modules()}
    expected = {"grpoflow.algorithms.advantages", "grpoflow.workers.actor", "grpoflow.config", "grpoflow.cli"}
    assert expected <= set(modules)
    # a known edge is found, so an empty scan cannot pass silently
    part, path = modules["grpoflow.workers.actor"]
    assert "grpoflow.training.forward" in _imports("grpoflow.workers.actor", path)


def test_every_part_is_placed_in_the_layering():
    parts = {part for _, part, _ in all_modules()} - {"grpoflow"}
    unplaced = parts - set(FORBIDDEN_PARTS)
    assert not unplaced, (f"place {sorted(unplaced)} in FORBIDDEN_PARTS and give each a row in "
                          "docs/architecture.md's parts table")


# ---------------------------------------------------------------- the direction


_PLACED = [(m, part, p) for m, part, p in all_modules() if part in FORBIDDEN_PARTS]


@pytest.mark.parametrize("module, part, path", _PLACED, ids=[m for m, _, _ in _PLACED])
def test_dependency_direction(module, part, path):
    forbidden = FORBIDDEN_PARTS[part]
    bad = []
    for name in sorted(_imports(module, path)):
        other = part_of(name)
        if other is None or other == part or other == "grpoflow":
            continue
        if forbidden is None or other in forbidden:
            bad.append(name)
    assert not bad, f"{module} ({part}) must not import {bad}; see docs/architecture.md (the parts table)"


def _config_siblings(module: str, path: Path) -> set[str]:
    """The config package's modules (or the package itself) that `module` imports."""
    found = set()
    for name in _imports(module, path):
        if not _matches(name, "grpoflow.config"):
            continue
        # the longest match: grpoflow.config.foreign.verl is that module, not its package
        found.add(max((m for m in CONFIG_ORDER if _matches(name, m)), key=len, default="grpoflow.config"))
    return found - {module}


def test_every_config_module_is_placed_in_the_import_order():
    modules = {m for m, part, _ in all_modules() if part == "config"} - {"grpoflow.config"}
    assert modules == set(CONFIG_ORDER), f"place {sorted(modules - set(CONFIG_ORDER))} in CONFIG_ORDER"


@pytest.mark.parametrize("module", CONFIG_ORDER)
def test_the_config_modules_import_one_way(module):
    path = next(p for m, _, p in all_modules() if m == module)
    earlier = set(CONFIG_ORDER[:CONFIG_ORDER.index(module)])
    siblings = _config_siblings(module, path)
    assert siblings <= earlier, (f"{module} imports {sorted(siblings - earlier)}: a config module imports only those "
                                 f"before it in {CONFIG_ORDER} (the package's docstring)")
    if module in CONFIG_STDLIB_ONLY:
        others = {n for n in _imports(module, path)
                  if part_of(n) and not any(_matches(n, m) for m in CONFIG_STDLIB_ONLY)}
        assert not others, f"{module} is stdlib only (but for {CONFIG_STDLIB_ONLY}); it imports {sorted(others)}"


def test_the_config_order_check_sees_a_circle(tmp_path):
    # so that a pass above means something: checks importing loading (which imports checks) is caught
    path = tmp_path / "checks.py"
    path.write_text("from grpoflow.config.loading import load_config\nfrom grpoflow.config import Config\n")
    assert _config_siblings("grpoflow.config.checks", path) == {"grpoflow.config.loading", "grpoflow.config"}
    # a module of a sub-package is itself, not its package: verl's translation importing the script reader (which
    # imports loading) is a circle, caught
    path.write_text("from grpoflow.config.foreign.verl_script import verl_script_pairs\n")
    assert _config_siblings("grpoflow.config.foreign.verl", path) == {"grpoflow.config.foreign.verl_script"}


@pytest.mark.parametrize("part", ["algorithms", "rewards"])
def test_pure_parts_never_import_distributed_ray_vllm_or_config(part):
    bad = []
    for module, p, path in all_modules():
        if p != part:
            continue
        for name in _imports(module, path):
            if any(_matches(name, prefix) for prefix in PURE_PARTS_NEVER_IMPORT):
                bad.append(f"{module} -> {name}")
    assert not bad, bad


def test_only_controller_commands_cli_and_workers_import_the_config():
    """Workers take their own typed section (e.g. ActorConfig); the plan (just below them) reads the whole config
    once; nothing below it sees the config (the viewer,
    at the top, reads a run's config.yaml; the Tinker server, a command beside the controller, takes its own
    TinkerConfig section)."""
    bad = []
    for module, part, path in all_modules():
        if part in ("controller", "commands", "cli", "config", "plan", "workers", "viewer", "tinker_server"):
            continue
        bad += [f"{module} -> {name}" for name in _imports(module, path) if _matches(name, "grpoflow.config")]
    assert not bad, bad


# ---------------------------------------------------------------- what importing pulls in

_PROBE = (
    "import sys\n"
    "import {module}\n"
    "heavy = ('ray', 'vllm', 'sglang', 'flash_attn', 'wandb', 'mlflow'{extra})\n"
    "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
)


def _loaded_after_import(module: str, extra: tuple = ()) -> list[str]:
    code = _PROBE.format(module=module, extra="".join(f", {e!r}" for e in extra))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip())


# Every module a `grpoflow train` with the default (local) backend imports: none of them may pull in Ray,
# vLLM, SGLang or a tracker; those load only when a config chooses them.
ENTRY_MODULES = ("grpoflow.cli, grpoflow.commands.run, grpoflow.controller.trainer, grpoflow.commands.evaluate, "
                 "grpoflow.plan.run_plan")


def test_the_cli_and_controller_do_not_import_ray_vllm_or_trackers():
    assert _loaded_after_import(ENTRY_MODULES) == []


def test_the_probe_sees_a_heavy_import():
    # so that an empty list above means something: the probe does report what a module pulls in
    assert "ray" in _loaded_after_import("grpoflow.config, ray")


def test_rewards_and_config_import_without_torch():
    # docs/architecture.md: rewards depend on the stdlib, config on nothing; both load in a plain process.
    assert _loaded_after_import("grpoflow.rewards.scoring, grpoflow.config", extra=("torch",)) == []


# ---------------------------------------------------------------- no circles between modules


def import_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a module graph (its strongly connected components of more than one module, sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(edges[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return circles


def test_no_module_imports_itself_through_others():
    """Every import counts (lazy and TYPE_CHECKING ones too): two modules that need each other are one module or
    a sign that one path was written twice (partial rollout's loop.py <-> partial.py was)."""
    modules = {m: p for m, _, p in all_modules()}
    edges = {m: {n for n in _imports(m, p) if n in modules and n != m} for m, p in modules.items()}
    assert import_circles(edges) == []


def test_the_circle_check_sees_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(edges) == [["a", "b", "c"]]


# ---------------------------------------------------------------- the page that describes the layering

ARCHITECTURE_PAGE = ROOT.parent / "docs" / "architecture.md"


def parts_on_the_page(text: str) -> dict[str, set[str]]:
    """The parts table of docs/architecture.md ("| `part` | what it owns | must not import |") as {part: the parts
    it must not import}: "any other part", "anything but `a`, `b`", "nothing: ..." or a list of `parts`."""
    section = text.split("## The parts and their layering", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        part, rule = cells[0].strip("`"), cells[2]
        named = {name for name in rule.split("`")[1::2]}
        if rule.startswith("any other part"):
            table[part] = EVERY_PART - {part}
        elif rule.startswith("anything but"):
            table[part] = EVERY_PART - named - {part}
        elif rule.startswith("nothing"):
            table[part] = set()
        else:
            table[part] = named
    return table


def enforced_parts() -> dict[str, set[str]]:
    """FORBIDDEN_PARTS with None ("nothing from any other part") written out as every other part."""
    return {part: (EVERY_PART - {part}) if rule is None else set(rule) for part, rule in FORBIDDEN_PARTS.items()}


def test_the_architecture_page_lists_the_enforced_parts():
    on_page, enforced = parts_on_the_page(ARCHITECTURE_PAGE.read_text()), enforced_parts()
    assert sorted(on_page) == sorted(enforced), (
        f"docs/architecture.md's parts table has {sorted(set(on_page) - set(enforced))} that FORBIDDEN_PARTS lacks "
        f"and lacks {sorted(set(enforced) - set(on_page))}: give each part one row there")
    differ = {part: (sorted(on_page[part] - enforced[part]), sorted(enforced[part] - on_page[part]))
              for part in enforced if on_page[part] != enforced[part]}
    assert not differ, (f"docs/architecture.md's 'must not import' column differs from FORBIDDEN_PARTS "
                        f"(part: (only on the page, only in the test)): {differ}")


def test_the_page_reader_sees_each_way_of_writing_a_rule():
    page = ("## The parts and their layering\n\n| part | what it owns | must not import |\n|---|---|---|\n"
            "| `errors` | x | any other part |\n| `plugins` | x | anything but `errors` |\n"
            "| `commands` | x | `cli` |\n| `cli` | x | nothing: it sits on top |\n\n## Next\n| `data` | x | `cli` |\n")
    assert parts_on_the_page(page) == {"errors": EVERY_PART - {"errors"},
                                       "plugins": EVERY_PART - {"errors", "plugins"},
                                       "commands": {"cli"}, "cli": set()}
