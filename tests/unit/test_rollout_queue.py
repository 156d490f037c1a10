"""The rollout queue's checkpoint of steps in flight: an agent episode may give its prompt several samples, so the
samples' dataset rows are restored by group id, not by an even split of the batch over the prompts."""

import torch

from grpoflow.controller.rollouts import PendingRollout, RolloutQueue
from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import EpochSampler
from grpoflow.trajectories.turns import Carried, SampleInfo
from grpoflow.engines.protocol import SamplingParams


def queue(items):
    return RolloutQueue(None, items, EpochSampler(len(items), seed=0), prompts_per_step=2, params=SamplingParams(),
                        ahead=1, last_step=10, seed_of=lambda step: step)


def test_a_saved_step_in_flight_gets_back_each_samples_own_row():
    items = [PromptItem([i], f"p{i}", {"prompt": f"p{i}", "answer": str(i)}, "s", index=i) for i in range(3)]
    # the step's prompts are items 2 and 0; item 2's two episodes gave three samples, item 0's two gave one each
    groups = torch.tensor([0, 0, 0, 1, 1])
    batch = Batch(prompt_ids=torch.ones(5, 1, dtype=torch.long), prompt_mask=torch.ones(5, 1, dtype=torch.long),
                  response_ids=torch.ones(5, 2, dtype=torch.long), response_mask=torch.ones(5, 2, dtype=torch.long),
                  group_ids=groups, prompts=["a", "b", "c", "d", "e"],
                  rows=[items[2].row] * 3 + [items[0].row] * 2,
                  infos=[SampleInfo(turns=t) for t in [2, 1, 3, 1, 1]],
                  carried=[Carried(episode=e) for e in [0, 0, 1, 2, 3]])
    saving = queue(items)
    saving.in_flight.append((4, PendingRollout([items[2], items[0]], None, done=(batch, 1.5)), {}))
    state = saving.state_dict()
    loaded = queue(items)
    loaded.load_state_dict(state["sampler"], 3, state["in_flight"])
    (step, pending, _), = loaded.in_flight
    restored, busy = pending.result()
    assert step == 4 and loaded.next_step == 5
    assert busy == 1.5 and restored.group_ids.tolist() == [0, 0, 0, 1, 1]
    assert [r["answer"] for r in restored.rows] == ["2", "2", "2", "0", "0"]
    assert restored.prompts == ["a", "b", "c", "d", "e"]
    assert [i.turns for i in restored.infos] == [2, 1, 3, 1, 1] and isinstance(restored.infos[0], SampleInfo)
    assert [c.episode for c in restored.carried] == [0, 0, 1, 2, 3] and isinstance(restored.carried[0], Carried)
