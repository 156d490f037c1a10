"""Issue 53, finding 3: one environment whose `reset` opens with more than data.max_prompt_length stopped the run.

It raised out of the rollout (rc 2, a traceback) after tokenizing the whole opening (2 MB per trajectory peaked at
1.2 GB). Now that trajectory alone ends ("error", reward.error_score, a warning naming the size and the fix), and an
opening far over the budget is refused from its length in characters, never tokenized.
"""

import sys
from pathlib import Path

from grpoflow.data.dataset import PromptItem
from grpoflow.engines.protocol import SamplingParams
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import GuessNumber
from grpoflow.trajectories.loop import EnvLoop

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from scripted import ScriptedEngine, play  # noqa: E402  (tests/unit's scripted engine)


class Huge(GuessNumber):
    def reset(self, *, seed, secret=None, **_):
        if secret == 2:
            return "x" * 2_000_000  # 2 MB
        return super().reset(seed=seed, secret=secret)


def test_an_opening_over_the_budget_ends_only_its_trajectory_and_is_never_tokenized(caplog):
    tok = build_char_tokenizer()
    renderer = ChatRenderer(tok)
    rendered: list[int] = []
    prompt_ids = renderer.prompt_ids

    def spy(messages):
        rendered.append(sum(len(str(m.get("content") or "")) for m in messages))
        return prompt_ids(messages)

    renderer.prompt_ids = spy  # records the size of every conversation tokenized
    engine = ScriptedEngine(tok, lambda text: "4", renderer.turn.end_token_id)
    loop = EnvLoop(renderer, env_cls=Huge, tools=None, max_turns=2,
                   opening=lambda row: [{"role": "user", "content": row["prompt"]}], max_prompt_length=200)
    rows = [PromptItem(prompt_ids=[], prompt_text="", row={"prompt": "Guess 1-8", "secret": s}, data_source="g",
                       index=i) for i, s in enumerate([1, 2])]
    batch, metrics = play(loop, engine, rows, SamplingParams(n=2, max_new_tokens=50, temperature=1.0), seed=0)
    ended = [info.end.value for info in batch.infos]
    assert ended[2:] == ["error", "error"] and "error" not in ended[:2], ended
    assert max(rendered) < 10_000, f"a {max(rendered)}-character opening was tokenized"
    assert any("Huge.reset opened a conversation of 2000000 characters, over data.max_prompt_length=200"
               in r.getMessage() for r in caplog.records)
