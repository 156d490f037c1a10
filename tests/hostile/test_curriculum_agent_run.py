"""Issue 36 (smaller items): a curriculum silently learned nothing in agent runs. An agent episode may give several
samples (one per fresh context), so a step's groups are not `rollout.n` samples, and the curriculum's feedback
used to observe nothing: every prompt stayed `learnable` for the whole run. Each prompt's pass rate now comes from
its own episodes, found by group id."""

from __future__ import annotations

from grpoflow.commands.run import train
from grpoflow.config import load_config
from grpoflow.controller.metrics import read_metrics

AGENT = '''
async def run(row, client):
    even = int(row["answer"]) % 2 == 0
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}],
                                         max_tokens=3)
    if even:  # a second call on a fresh context: a second sample of this episode
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}],
                                             max_tokens=3)
    return 1.0 if even else 0.0
'''


def test_a_curriculum_learns_pass_rates_in_an_agent_run_whose_groups_are_not_n_samples(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    train(load_config(None, [
        "model.path=builtin:tiny-0.5m", "sft.steps=0", "data.train_files=[builtin:calculator/train]",
        "data.prompts_per_step=4", "rollout.n=2", "rollout.max_new_tokens=8", "reward.function=null",
        f"rollout.agent.program={tmp_path / 'agent.py'}:run", "data.curriculum.enable=true",
        "trainer.total_steps=1", "trainer.val_every=0", "trainer.save_every=0",
        f"trainer.output_dir={tmp_path / 'run'}"]))
    (record,) = read_metrics(tmp_path / "run")
    assert record["agent/samples/mean"] > 1.0  # some episodes gave two samples: groups are not n samples
    # each of the 4 prompts is solved by all of its episodes (even answer) or by none: all 4 leave `learnable`
    assert record["curriculum/easy"] + record["curriculum/hard"] == 4.0, record
    assert record["groups/zero_advantage_share"] == 1.0
