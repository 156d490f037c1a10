"""Reward functions in TRL's and verl's shapes run unchanged; verl's data_source routing; a run that would learn
nothing stops (grpoflow/rewards/shapes.py, rewards/by_source.py, controller/reward_health.py)."""

import textwrap

import pytest
import torch

from grpoflow.controller.reward_health import RewardFailure, RewardHealth, all_groups_flat
from grpoflow.errors import UserError
from grpoflow.rewards import RewardScorer, build_reward, unscored_sources
from grpoflow.rewards.shapes import SampleContext, TrainerState, convention_hint, detect_style

TRL_FILE = '''
def accuracy_reward(completions, solution, **kwargs):
    """TRL's quickstart shape: lists in, a list out; conversational completions are message lists."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.strip() == s else 0.0 for t, s in zip(texts, solution)]

def seen(prompts, completions, completion_ids, trainer_state, **kwargs):
    return [float(len(completion_ids[0]) * 100 + trainer_state.global_step + (10 if isinstance(prompts[0], list)
            else 0))]

async def async_len(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]

def none_for_empty(completions, **kwargs):
    return [None if not c else 1.0 for c in completions]
'''

VERL_FILE = '''
from helper_beside import parse   # a module next to the file, as a script imports it

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(parse(solution_str) == ground_truth), "bonus": float(extra_info["index"])}
'''


@pytest.fixture()
def reward_files(tmp_path):
    (tmp_path / "trl_rewards.py").write_text(TRL_FILE)
    (tmp_path / "verl_reward.py").write_text(VERL_FILE)
    (tmp_path / "helper_beside.py").write_text("def parse(text):\n    return text.split('=')[-1].strip()\n")
    return tmp_path


def test_the_shape_is_read_off_the_signature():
    def ours(prompt, completion, **row): ...
    def trl(completions, **kwargs): ...
    def trl_prompts(prompts, completions, answer, **kwargs): ...
    def verl(data_source, solution_str, ground_truth, extra_info=None): ...
    def anything(*args, **kwargs): ...
    assert [detect_style(f) for f in (ours, trl, trl_prompts, verl, anything)] == \
        ["grpoflow", "trl", "trl", "verl", "grpoflow"]


def test_a_trl_reward_scores_standard_and_conversational_rows(reward_files):
    fn = build_reward(f"{reward_files}/trl_rewards.py:accuracy_reward")
    rows = [{"solution": "4", "prompt": "2+2="}, {"solution": "5", "prompt": [{"role": "user", "content": "2+2"}]}]
    scored = RewardScorer(fn).score(["2+2=", "<chat>"], ["4", "4"], rows)
    assert scored.scores == [1.0, 0.0] and scored.errors == 0


def test_a_trl_reward_gets_completion_ids_trainer_state_and_chat_prompts(reward_files):
    fn = build_reward(f"{reward_files}/trl_rewards.py:seen")
    ctx = [SampleContext(row_prompt=[{"role": "user", "content": "hi"}], completion_ids=[5, 6, 7],
                         trainer_state=TrainerState(global_step=4, max_steps=9))]
    assert RewardScorer(fn).score(["hi"], ["x"], [{}], ctx).scores == [314.0]


def test_async_and_none_returning_trl_rewards(reward_files):
    assert RewardScorer(build_reward(f"{reward_files}/trl_rewards.py:async_len")).score(
        ["p", "p"], ["ab", "abcd"], [{}, {}]).scores == [2.0, 4.0]
    scored = RewardScorer(build_reward(f"{reward_files}/trl_rewards.py:none_for_empty")).score(
        ["p", "p"], ["", "a"], [{}, {}])
    assert scored.nones == 1 and scored.scores == [0.0, 1.0]


def test_trl_rewards_get_their_context_inside_combinations_and_routes(reward_files):
    ctx = [SampleContext(row_prompt=[{"role": "user", "content": "hi"}], completion_ids=[5, 6, 7],
                         trainer_state=TrainerState(global_step=4, max_steps=9))]
    seen = f"{reward_files}/trl_rewards.py:seen"
    combined = build_reward([seen, "length"], [1.0, 0.0])
    routed = build_reward("length", routes={"mine": seen})
    assert RewardScorer(combined).score(["hi"], ["x"], [{}], ctx).scores == [314.0]
    assert RewardScorer(routed).score(["hi"], ["x"], [{"data_source": "mine"}], ctx).scores == [314.0]


def test_trl_rewards_combine_and_run_in_worker_processes(reward_files):
    fn = build_reward([f"{reward_files}/trl_rewards.py:accuracy_reward", "length"], [1.0, 0.0])
    with RewardScorer(fn, workers=1, timeout_s=30) as scorer:
        assert scorer.uses_processes
        scored = scorer.score(["q"], ["4"], [{"solution": "4"}])
    assert scored.scores == [1.0] and scored.errors == 0


def test_a_verl_compute_score_runs_unchanged_and_imports_what_is_beside_it(reward_files):
    fn = build_reward(f"{reward_files}/verl_reward.py:compute_score")
    rows = [{"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "12"}, "extra_info": {"index": 3}}]
    scored = RewardScorer(fn).score(["q"], ["so 5+7 = 12"], rows)
    assert scored.scores == [1.0] and scored.extras == {"bonus": [3.0]}


def test_a_missing_import_in_a_reward_file_is_one_clear_error(tmp_path):
    (tmp_path / "r.py").write_text("import not_a_module_anywhere\ndef f(prompt, completion, **row):\n    return 1\n")
    with pytest.raises(UserError, match="not_a_module_anywhere.*Install that package"):
        build_reward(f"{tmp_path}/r.py:f")


def test_auto_scores_rows_by_data_source_as_verl_does():
    fn = build_reward("auto")
    rows = [{"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}},
            {"data_source": "lighteval/MATH", "reward_model": {"ground_truth": "\\frac{1}{2}"}},
            {"answer": "85"}]
    completions = ["She has 8*9 = 72 apples.\n#### 72", "So it is \\boxed{\\frac12}.", "85"]
    assert RewardScorer(fn).score(["q"] * 3, completions, rows).scores == [1.0, 1.0, 1.0]
    assert unscored_sources(rows + [{"data_source": "math_dapo"}, {"data_source": "mine"}]) == ["math_dapo", "mine"]


def test_convention_hints_name_the_shape_and_the_fix():
    def ours(prompt, completion, **row): ...
    assert "reward.style=trl" in convention_hint(ours, "it returned [1.0], not a finite number")
    assert "TypeError" not in convention_hint(ours, None) and convention_hint(ours, None) == ""
    hint = convention_hint(build_reward("auto"), "TypeError: f() missing 1 required positional argument")
    assert "reward.style=trl or reward.style=verl" in hint


def health(share=0.5):
    warnings = []
    return RewardHealth("reward.function=r.py:f", lambda e: " HINT.", share, warnings.append), warnings


def scores_of(scores, failed=0, first="Traceback: boom"):
    from grpoflow.rewards.scoring import Scores
    return Scores(list(scores), errors=failed, first_error=first if failed else None)


def test_a_step_on_which_every_reward_call_failed_stops_the_run():
    h, _ = health()
    with pytest.raises(RewardFailure, match=r"(?s)r.py:f failed on all 4 samples of step 1.* HINT.*boom"):
        h.check(1, scores_of([0.0] * 4, failed=4), torch.zeros(4), torch.tensor([0, 0, 1, 1]))


def test_a_share_of_failures_over_the_window_stops_the_run():
    h, _ = health(share=0.5)
    for step in range(1, 5):  # 3 of 4 failing per step, but the window is not full yet
        h.check(step, scores_of([0.0, 1.0, 0.0, 0.0], failed=3), torch.tensor([0.0, 1, 0, 0]), torch.tensor([0] * 4))
    with pytest.raises(RewardFailure, match="failed on 15 of the 20 samples of steps 1-5"):
        h.check(5, scores_of([0.0, 1.0, 0.0, 0.0], failed=3), torch.tensor([0.0, 1, 0, 0]), torch.tensor([0] * 4))
    h, _ = health(share=0.8)
    for step in range(1, 7):  # under the share: goes on
        h.check(step, scores_of([0.0, 1.0, 0.0, 0.0], failed=3), torch.tensor([0.0, 1, 0, 0]), torch.tensor([0] * 4))


def test_groups_without_signal_in_the_first_steps_warn_once():
    h, warnings = health()
    flat, groups = torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    for step in range(1, 6):
        h.check(step, scores_of(flat.tolist()), flat, groups)
    assert len(warnings) == 1 and "every advantage was 0" in warnings[0] and "r.py:f" in warnings[0]
    h, warnings = health()
    for step, s in enumerate([flat, torch.tensor([0.0, 1.0, 1.0, 1.0]), flat], 1):
        h.check(step, scores_of(s.tolist()), s, groups)
    assert warnings == [] and not all_groups_flat(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]))
    short = RewardHealth("reward.function=auto", lambda e: "", 0.5, warnings.append, total_steps=2)
    for step in (1, 2):  # a run shorter than 3 steps is judged on all of them
        short.check(step, scores_of(flat.tolist()), flat, groups)
    assert len(warnings) == 1 and "first 2 step(s)" in warnings[0]


def test_style_must_match_when_given(reward_files):
    fn = build_reward(f"{reward_files}/trl_rewards.py:accuracy_reward", style="grpoflow")
    scored = RewardScorer(fn).score(["q"], ["4"], [{"solution": "4"}])
    assert scored.errors == 1 and "TypeError" in scored.first_error


def test_a_trl_reward_that_returns_a_scalar_names_the_convention(tmp_path):
    (tmp_path / "r.py").write_text(textwrap.dedent('''
        def f(completions, **kwargs):
            return 1.0
    '''))
    scored = RewardScorer(build_reward(f"{tmp_path}/r.py:f")).score(["q"], ["4"], [{}])
    assert scored.errors == 1 and "must return a list with one score per completion" in scored.first_error


def test_the_last_line_says_accuracy_only_for_rewards_that_score_0_or_1():
    from grpoflow.commands.run import zero_one_reward
    from grpoflow.config import load_config

    gsm8k, countdown = [{"data_source": "openai/gsm8k"}], [{"data_source": "countdown"}]
    assert zero_one_reward(load_config(None, ["model.path=/m"]), gsm8k)
    assert not zero_one_reward(load_config(None, ["model.path=/m"]), countdown)  # 0.1 for the format
    assert not zero_one_reward(load_config(None, ["model.path=/m", "reward.function=length"]), gsm8k)
    assert not zero_one_reward(load_config(None, ["model.path=/m", "reward.functions=[gsm8k,format]"]), gsm8k)


def test_a_reward_that_only_timed_out_gets_the_timeout_not_the_shape_hint():
    """Issue 53 item 7: a TRL- or verl-shaped function whose every call timed out was told to check its arguments
    and return type. The hint names reward.timeout_s instead; a mix of timeouts and errors keeps the shape hint."""
    from grpoflow.rewards.scoring import Scores

    h = RewardHealth("reward.function=r.py:f", lambda e: " HINT.", 0.5, [].append, timeout_s=2.0)
    timed_out = Scores([0.0] * 4, timeouts=4, first_error="it timed out")
    with pytest.raises(RewardFailure) as err:
        h.check(1, timed_out, torch.zeros(4), torch.tensor([0, 0, 1, 1]))
    assert "HINT" not in str(err.value) and "each call ran past reward.timeout_s=2 s" in str(err.value)
    mixed = Scores([0.0] * 4, timeouts=3, errors=1, first_error="TypeError: f() got an unexpected keyword")
    with pytest.raises(RewardFailure, match="HINT"):
        RewardHealth("reward.function=r.py:f", lambda e: " HINT.", 0.5, [].append, timeout_s=2.0).check(
            1, mixed, torch.zeros(4), torch.tensor([0, 0, 1, 1]))
