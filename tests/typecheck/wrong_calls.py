"""Worker calls that the type check must reject (`make typecheck` expects exactly these errors).

Not collected by pytest: a file for mypy, proving that a wrong verb, a wrong argument count or a
misused result is caught before anything runs.
"""

from grpoflow.controller.trainer import Controller
from grpoflow.data.batch import Batch
from grpoflow.workers.actor import ActorWorker
from grpoflow.workers.critic import CriticWorker


def wrong(controller: Controller, batch: Batch) -> None:
    controller.actor.call(CriticWorker.compute_values, batch)          # E: a critic verb on the actor group
    controller.actor.call(ActorWorker.update_policy, batch, 3)         # E: one argument too many
    count: int = controller.actor.call(ActorWorker.compute_log_prob, batch)  # E: it returns a Tensor
    print(count)
