"""Issue 36: SIGKILL + resume of a run whose model calls a sandboxed tool equals the uninterrupted run. The tool
(sandboxed_draw_calculator.py) answers with a draw from `random` and a count of the calls its process served, so
the equality holds only if every call runs in a fresh child seeded from the call alone (user_code_child.py's fork
server), the same after a restart as before it."""

import json
import random
from pathlib import Path

import pytest
import torch

from grpoflow.commands.run import sft_stage, train
from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager
from kills import comparable, kill_at_step, train_process

TOOL = f"{Path(__file__).with_name('sandboxed_draw_calculator.py')}:calculator"
BASE = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=160",
        "rollout.multi_turn.max_turns=2", "data.val_files=[]", "trainer.val_every=0", "trainer.log_every=1",
        "trainer.resume=never", "resources.cpus_per_rank=0.5"]


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory) -> str:
    """The tiny model warm-started on the calculator demonstrations (half call the tool), short and hot."""
    run = tmp_path_factory.mktemp("calculator")
    return sft_stage(load_config("calculator_tool", BASE + ["sft.steps=60", "sft.batch_size=16", "sft.lr=3e-3",
                                                            f"trainer.output_dir={run}"]))


def tool_replies(run_dir: Path) -> list[tuple[int, str]]:
    """(step, content) of the tool messages of the run's logged training groups."""
    return [(group["step"], m["content"]) for group in map(json.loads, open(run_dir / "train_samples.jsonl"))
            for s in group["samples"] for m in s["conversation"] if m["role"] == "tool"]


@pytest.mark.slow
def test_sigkill_mid_tool_run_then_resume_equals_the_uninterrupted_run(tmp_path, calculator_model):
    args = BASE + [f"model.path={calculator_model}", "sft.steps=0", f"rollout.multi_turn.tools=[{TOOL}]",
                   "trainer.total_steps=5", "trainer.save_every=1", "trainer.keep_last=0", "trainer.resume=auto",
                   "trainer.log_train_groups=4"]
    full = tmp_path / "full"
    train(load_config("calculator_tool", args + [f"trainer.output_dir={full}"]))
    out = tmp_path / "killed"
    proc = train_process(["calculator_tool", *args, f"trainer.output_dir={out}"],
                         threads=torch.get_num_threads())  # the same float sums as the in-process run
    kill_after = random.Random().randint(2, 3)
    kill_at_step(proc, out, kill_after)
    latest = CheckpointManager(out).latest()
    assert latest is not None
    killed_at = int(latest.name.split("_")[-1])  # step_000002: the resumed run goes on from step 3
    print(f"killed after step {killed_at}")
    assert killed_at < 5, "the SIGKILL came after the run's last step: nothing was resumed"
    train(load_config("calculator_tool", args + [f"trainer.output_dir={out}"]))
    records = comparable(full)
    assert comparable(out) == records
    # not a vacuous equality: the sandboxed tool really ran and answered, in the resumed steps too
    resumed = [r for r in records if "tools/calls" in r and r["step"] > killed_at]
    assert sum(r["tools/calls"] - r["tools/errors"] for r in resumed) > 0, records
    replies = tool_replies(full)
    assert [s for s, _ in replies if s > killed_at], (killed_at, replies)
    assert all(" ~" in reply and reply.endswith(" #1") for _, reply in replies if "#" in reply), replies
