"""Issue 36: a data file whose content changed under a checkpoint with partial rollout carried samples onto other
prompts. The saved pool now holds a digest of each group's prompt; a resume drops the groups whose prompt changed."""

from __future__ import annotations

from grpoflow.controller.partial import Group, PartialQueue
from grpoflow.controller.rollouts import Rollouts
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import EpochSampler
from grpoflow.engines.protocol import SamplingParams
from grpoflow.trajectories.trajectory import EndState, Segment, Trajectory


def items_of(texts: list[str]) -> list[PromptItem]:
    return [PromptItem([ord(c) for c in t], t, {"prompt": t}, "s", index=i) for i, t in enumerate(texts)]


def queue_of(items: list[PromptItem]) -> PartialQueue:
    return PartialQueue(Rollouts(None), items, EpochSampler(len(items), seed=0),  # type: ignore[arg-type]
                        prompts_per_step=2, params=SamplingParams(n=2, max_new_tokens=8), oversample=2.0,
                        max_staleness=1, seed_of=lambda step: step, version=lambda: 1, pad_token_id=0)


def begun(first: int) -> Trajectory:
    """A single-turn sample paused after two tokens."""
    return Trajectory([1, 2], [], end=EndState.PAUSED, open=Segment([first, 6], [-0.5, -0.25], 0, [0, 0]))


def saved_pool() -> tuple[list[PromptItem], dict]:
    items = items_of(["1+1=", "2+2=", "3+3=", "4+4="])
    queue = queue_of(items)
    queue.pool = [Group(1, 1, [begun(1), None]), Group(3, 3, [begun(3), begun(4)]), Group(0, 0, [begun(0), None])]
    return items, queue.state_dict()


def test_groups_whose_prompt_changed_under_the_checkpoint_are_dropped_with_one_warning(capsys):
    items, state = saved_pool()
    edited = items_of(["1+1=", "2+2=", "3+3=", "9*9="])  # row 3 edited in the data file
    queue = queue_of(edited)
    queue.load_state_dict(state["sampler"], 1, state["in_flight"])
    assert [g.item for g in queue.pool] == [1, 0]  # 3's samples were of "4+4=": not carried onto "9*9="
    for g in queue.pool:  # every carried group continues on the prompt it was sampled for
        assert edited[g.item].prompt_ids == items[g.item].prompt_ids
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING:")]
    assert len(warnings) == 1, warnings
    assert "dropped 1 of the 3 groups" in warnings[0] and "2 samples begun" in warnings[0]
    assert "data.train_files" in warnings[0] and "changed" in warnings[0]


def test_a_shorter_data_file_drops_the_groups_past_its_end(capsys):
    _, state = saved_pool()
    queue = queue_of(items_of(["1+1=", "2+2="]))
    queue.load_state_dict(state["sampler"], 1, state["in_flight"])
    assert [g.item for g in queue.pool] == [1, 0]
    assert "dropped 1 of the 3 groups" in capsys.readouterr().out


def test_unchanged_data_and_old_checkpoints_without_digests_resume_as_before(capsys):
    items, state = saved_pool()
    queue = queue_of(items_of(["1+1=", "2+2=", "3+3=", "4+4="]))
    queue.load_state_dict(state["sampler"], 1, state["in_flight"])
    assert [(g.item, g.seed, g.samples) for g in queue.pool] == [(1, 1, [begun(1), None]), (3, 3, [begun(3), begun(4)]),
                                                                  (0, 0, [begun(0), None])]
    for g in state["in_flight"]["partial_pool"]:  # written before the digests were saved
        del g["prompt"]
    queue = queue_of(items_of(["1+1=", "2+2=", "3+3=", "9*9="]))
    queue.load_state_dict(state["sampler"], 1, state["in_flight"])
    assert [g.item for g in queue.pool] == [1, 3, 0]
    assert "WARNING" not in capsys.readouterr().out


def test_a_shrunk_data_file_or_a_tampered_pool_is_one_sentence_not_a_traceback(tmp_path):
    """Issue 53 item 7: a sampler position past a shorter data file raised a bare ValueError, and a pool edited in
    controller.pt (a group without samples, a sample with a field Progress lacks, an index that is not a number)
    raised KeyError / TypeError from inside the queue. Each is one UserError naming the cause and the fix."""
    import pytest

    from grpoflow.controller.checkpoint import CheckpointStateError, restore_queue
    from grpoflow.errors import UserError

    items, state = saved_pool()
    path = tmp_path / "controller.pt"
    shrunk = queue_of(items_of(["1+1=", "2+2="]))
    with pytest.raises(UserError, match=r"data.train_files changed size.*trainer.resume=never") as err:
        restore_queue(shrunk, {"sampler": {"epoch": 0, "position": 3}, "step": 1, "in_flight": None}, path)
    assert "\n" not in str(err.value)
    tampered = [lambda pool: pool[0].pop("samples"), lambda pool: pool[1]["samples"][0].update(extra=1),
                lambda pool: pool[2].update(item="zero"), lambda pool: pool.append(7)]
    for tamper in tampered:
        _, state = saved_pool()
        tamper(state["in_flight"]["partial_pool"])
        with pytest.raises(CheckpointStateError, match=r"controller.pt holds a rollout state .* was edited") as err:
            restore_queue(queue_of(items), {**state, "step": 1}, path)
        assert "\n" not in str(err.value)
    _, state = saved_pool()
    restore_queue(queue_of(items), {**state, "step": 1}, path)   # an untouched one loads


def test_a_pool_saved_before_it_held_trajectories_is_refused_in_one_sentence(tmp_path):
    """Before the pool carried `Trajectory` and the workers' rows, a group's samples were `Progress` dicts (with
    their seed); such a checkpoint is refused with the way out, not loaded into the wrong shape."""
    import pytest

    from grpoflow.controller.checkpoint import restore_queue
    from grpoflow.errors import UserError

    items, state = saved_pool()
    old = {"seed": 1, "ids": [5, 6], "log_probs": [-0.5, -0.25], "versions": [0, 0], "finish": "", "text": "",
           "past": None, "floors": []}
    for g in state["in_flight"]["partial_pool"]:
        del g["seed"]
        g["samples"] = [dict(old), dict(old, ids=[], log_probs=[], versions=[])]
    with pytest.raises(UserError, match=r"written by an older grpoflow.*trainer.resume=never") as err:
        restore_queue(queue_of(items), {**state, "step": 1}, tmp_path / "controller.pt")
    assert "\n" not in str(err.value)
