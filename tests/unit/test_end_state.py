"""One end state per trajectory (trajectories/trajectory.py `EndState`) and one turn reader (`read_turn`) for the
environment loops and the agent endpoint."""

import pytest

from grpoflow.trajectories.trajectory import END_REASONS, EndState, Segment, Trajectory, to_batch
from grpoflow.trajectories.turns import TurnStop, read_turn

END, EOS = 7, 2


@pytest.mark.parametrize("state, truncated, error, terminal", [
    (EndState.RUNNING, False, False, False),
    (EndState.PAUSED, False, False, False),
    (EndState.TOKEN_BUDGET, True, False, True),
    (EndState.ERROR, False, True, True),
    (EndState.TIMEOUT, False, True, True),
    (EndState.STOP, False, False, True),
    (EndState.EOS, False, False, True),
    (EndState.MAX_TURNS, False, False, True),
    (EndState.ENV_DONE, False, False, True),
])
def test_each_end_state_answers_the_three_questions(state, truncated, error, terminal):
    assert (state.is_truncated, state.is_error, state.is_terminal) == (truncated, error, terminal)


def test_the_logged_reasons_are_the_states_values():
    assert "" not in END_REASONS and set(END_REASONS) == {e.value for e in EndState} - {""}


@pytest.mark.parametrize("ids, cut, eos, stop", [
    ([5, 6], True, EOS, TurnStop.CUT),                 # cut at its budget, whatever its last token
    ([5, END], True, EOS, TurnStop.CUT),
    ([5, END], False, EOS, TurnStop.END_OF_TURN),
    ([5, EOS], False, EOS, TurnStop.EOS),
    ([5, EOS], False, None, TurnStop.OPEN),            # the environment loop ends a turn on its end-of-turn token only
    ([5, END], False, END, TurnStop.END_OF_TURN),      # a template whose end-of-turn token is EOS: a turn's end
    ([], False, EOS, TurnStop.OPEN),
])
def test_read_turn(ids, cut, eos, stop):
    assert read_turn(ids, cut=cut, end_of_turn=END, eos=eos) is stop


def test_only_a_budget_end_is_a_truncated_sample():
    def ended(end: EndState) -> Trajectory:
        return Trajectory([1], [{"role": "assistant", "content": "x"}], [Segment([5], [-0.5], 0)], turns=1, end=end)

    batch = to_batch([ended(EndState.TOKEN_BUDGET), ended(EndState.EOS), ended(EndState.ERROR)], pad_token_id=0,
                     prompt_texts=["", "", ""], rows=[{}, {}, {}], multi_turn=False)
    assert batch.truncated.tolist() == [True, False, False]


def test_a_trajectory_saved_before_the_end_state_reads_back_with_its_reason():
    """A paused conversation in a checkpoint written with the four fields (truncated, done, ended) resumes."""
    old = Trajectory([1], []).as_data()
    del old["end"]
    old.update(truncated=True, done=True, ended="token_budget")
    assert Trajectory.from_data(old).end is EndState.TOKEN_BUDGET
    assert Trajectory.from_data(Trajectory([1], [], end=EndState.PAUSED).as_data()).end is EndState.PAUSED


def test_a_sample_info_saved_before_the_end_state_reads_back():
    """Samples in flight in an async run's checkpoint were saved as dicts with `ended` and an agent's `status`."""
    import dataclasses

    from grpoflow.trajectories.turns import Carried, SampleInfo, info_from_data

    old = {k: v for k, v in dataclasses.asdict(SampleInfo(turns=2)).items() if k != "end"}
    old.update(final=False, episode=3, paused=False, finished_at=-1, progress=None)  # one dataclass then
    assert info_from_data({**old, "ended": "timeout", "status": "timeout"}) == (
        SampleInfo(turns=2, end=EndState.TIMEOUT), Carried(final=False, episode=3))
    assert info_from_data(dataclasses.asdict(SampleInfo(end=EndState.EOS)))[0].end is EndState.EOS


def test_the_end_state_goes_through_a_checkpoint_file(tmp_path):
    """A checkpoint loads plain values only (torch.load weights_only): a paused conversation and a sample in flight
    keep their end state through one."""
    import torch

    from grpoflow.trajectories.turns import Carried, SampleInfo, info_as_data, info_from_data
    from grpoflow.training.engine import load_tensor_file

    torch.save({"t": Trajectory([1], [], end=EndState.PAUSED).as_data(),
                "i": info_as_data(SampleInfo(end=EndState.TIMEOUT), Carried(episode=2))}, tmp_path / "state.pt")
    state = load_tensor_file(tmp_path / "state.pt")
    assert Trajectory.from_data(state["t"]).end is EndState.PAUSED
    assert info_from_data(state["i"]) == (SampleInfo(end=EndState.TIMEOUT), Carried(episode=2))
