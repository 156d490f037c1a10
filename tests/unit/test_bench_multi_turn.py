"""The multi-turn bench's pieces (no training): TRL's last turn, tool use, the overlap arithmetic, the Hermes tool
templates that let TRL's tool loop run on a ChatML model, and async mode's wait metrics."""

import sys
from pathlib import Path

import pytest

from grpoflow.controller.trainer import wait_metrics
from grpoflow.data.tool_format import HERMES, ToolCall
from grpoflow.models.tiny import build_char_tokenizer

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # the scripts import their siblings
    try:
        import compare_trl_multi_turn
        import figures
        import hermes_tools
        yield compare_trl_multi_turn, figures, hermes_tools
    finally:
        sys.path.remove(str(BENCH))


def test_last_turn_is_what_follows_the_last_assistant_header(bench):
    mt, _, _ = bench
    header = [7, 8]
    # turn 1 [1, 2], the tool's reply [3, 7, 8] ending with the header, turn 2 [4, 5]
    assert mt.last_turn_ids([1, 2, 3, 7, 8, 4, 5], header) == [4, 5]
    assert mt.last_turn_ids([1, 2, 9], header) == [1, 2, 9]  # one turn: the whole completion
    assert mt.last_turn_ids([7, 8, 1, 7, 8], header) == []   # a last turn cut to nothing
    assert mt.last_turn_ids([1, 7], header) == [1, 7]        # half a header is not one


def test_tool_use_averages_the_last_three_steps(bench):
    mt, _, _ = bench
    steps = [{"tool_calls": c, "trajectories": 16, "turns": t} for c, t in ((0, 1.0), (8, 1.5), (12, 1.75), (16, 2.0))]
    # last 3: calls 8/16, 12/16, 16/16 -> mean 0.75; turns (1.5 + 1.75 + 2) / 3 = 1.75
    assert mt.tool_use(steps) == pytest.approx({"tool_calls": 0.75, "turns": 1.75})


def test_overlap_figures_by_hand(bench):
    _, figures, _ = bench
    # async step 3 s: the trainer waited 0.5 s, trained 2.5 s; the engines generated 2 s -> in a row 4.5 s,
    # 1.5 s of generation hidden; shares 0.5 / 3 and rollout_wait 1 / 3. Second step: 5 s, waited 1, gen 3 ->
    # train 4, in a row 7, hidden 2; the medians of two values are their means
    records = [{"timing_s/step": 3.0, "timing_s/trainer_wait": 0.5, "timing_s/gen_busy": 2.0,
                "timing_s/rollout_wait": 1.0},
               {"timing_s/step": 5.0, "timing_s/trainer_wait": 1.0, "timing_s/gen_busy": 3.0,
                "timing_s/rollout_wait": 2.0}]
    f = figures.overlap_figures(records)
    assert f == pytest.approx({"step_s": 4.0, "gen_busy_s": 2.5, "train_s": 3.25, "in_a_row_s": 5.75,
                               "hidden_s": 1.75, "trainer_wait_share": (0.5 / 3 + 0.2) / 2,
                               "rollout_wait_share": (1 / 3 + 0.4) / 2})
    # sync: the trainer waits out the generation stage (gen 2.1 s, the engines' 2.0 s of it): nothing hidden
    sync = figures.overlap_figures([{"timing_s/step": 4.0, "timing_s/gen": 2.1, "timing_s/gen_busy": 2.0}])
    assert sync["hidden_s"] == pytest.approx(-0.1) and sync["in_a_row_s"] == pytest.approx(3.9)
    assert sync["rollout_wait_share"] == 0.0


def test_wait_metrics_by_hand():
    # a 4 s step whose trainer waited 1 s and whose engines generated 3 s: engines idle 1 s; shares 1/4 and 1/4
    assert wait_metrics(4.0, 1.0, 3.0) == pytest.approx(
        {"timing_s/rollout_wait": 1.0, "perf/trainer_wait_share": 0.25, "perf/rollout_wait_share": 0.25})
    assert wait_metrics(2.0, 0.0, 2.5)["timing_s/rollout_wait"] == 0.0  # generated longer than the step: never idle


CONVERSATION = [{"role": "user", "content": "347*29"},
                {"role": "assistant", "content": HERMES.render(ToolCall("calculator", {"expression": "347*29"}))},
                {"role": "tool", "name": "calculator", "content": "10063"}, {"role": "assistant", "content": "10063"}]


def test_hermes_template_renders_plain_conversations_as_chatml_and_tool_calls_as_hermes(bench):
    _, _, hermes = bench
    tok = build_char_tokenizer()
    before = tok.apply_chat_template(CONVERSATION, tokenize=False)
    hermes.install_hermes_tools(tok)
    assert tok.apply_chat_template(CONVERSATION, tokenize=False) == before  # what grpoflow renders is unchanged
    structured = [CONVERSATION[0], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347*29"}}}]}]
    rendered = tok.apply_chat_template(structured, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n" + CONVERSATION[1]["content"] + "<|im_end|>\n")
    # SmolLM2-style: a default system message when the conversation has none
    tok.chat_template = hermes.hermes_chatml_template("You are a bot")
    assert tok.apply_chat_template(CONVERSATION[:1], tokenize=False) == \
        "<|im_start|>system\nYou are a bot<|im_end|>\n<|im_start|>user\n347*29<|im_end|>\n"
    assert hermes.default_system_of(tok) == "You are a bot"


def test_a_template_that_is_not_chatml_is_refused(bench):
    _, _, hermes = bench
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="not plain ChatML"):
        hermes.install_hermes_tools(tok)


def test_the_response_template_parses_the_calls_grpoflow_parses(bench):
    trl_templates = pytest.importorskip("trl.chat_template_utils")
    _, _, hermes = bench
    tok = build_char_tokenizer()
    hermes.install_hermes_tools(tok)
    assert trl_templates.supports_tool_calling(tok) and trl_templates.is_chat_template_prefix_preserving(tok)
    prefix = tok(tok.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True),
                 add_special_tokens=False)["input_ids"]
    text = "Let me: " + CONVERSATION[1]["content"] + "<|im_end|>"
    parsed = trl_templates.parse_response(tok, tok(text, add_special_tokens=False)["input_ids"], prefix=prefix)
    ours = HERMES.parse(text)
    assert [c["function"] for c in parsed["tool_calls"]] == [{"name": c.name, "arguments": c.arguments}
                                                             for c in ours.calls]
    assert parsed["content"] == "Let me:"
    answer = trl_templates.parse_response(tok, tok("10063<|im_end|>", add_special_tokens=False)["input_ids"],
                                          prefix=prefix)
    assert answer == {"role": "assistant", "content": "10063"}


def test_the_lockstep_commit_gets_its_flat_keys(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import multi_turn
    finally:
        sys.path.remove(str(BENCH))
    given = ["rollout.multi_turn.env=x.py:Env", "rollout.multi_turn.max_turns=8", "rollout.n=4"]
    assert multi_turn.keys_of(BENCH.parent, given) == given  # this code: the section
    # the "before" checkout (6753cb0) predates the rollout.multi_turn section
    assert multi_turn.keys_of(tmp_path, given) == ["rollout.env=x.py:Env", "rollout.max_turns=8", "rollout.n=4"]
