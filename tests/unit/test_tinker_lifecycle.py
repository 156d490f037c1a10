"""The Tinker server's models and work over their lifetime: LoRA clients on one base model share its weights,
and a session that ends (finished, or no heartbeat) takes its models, queued work and futures with it."""

import asyncio
import gc
import weakref

import pytest
import torch

pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from grpoflow.config import TinkerConfig  # noqa: E402
from grpoflow.tinker_server.guard import Caller  # noqa: E402
from grpoflow.tinker_server.service import TinkerService  # noqa: E402

KEY = "client-key"  # one client (one API key) owns every session here


def caller(svc: TinkerService) -> Caller:
    return Caller(KEY, svc.budget.ticket())


def q_proj(tm) -> torch.Tensor:
    """The base weight of the first attention projection, as the client's model holds it."""
    for name, p in tm.engine.model.named_parameters():
        if name.endswith(("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.base_layer.weight")):
            return p
    raise AssertionError("no q_proj")


async def create(svc: TinkerService, session: str, seq: int, base: str, lora: bool = True) -> str:
    request = types.CreateModelRequest(session_id=session, model_seq_id=seq, base_model=base,
                                       lora_config=types.LoraConfig(rank=2, seed=seq) if lora else None)
    future = svc.create_model(request, caller(svc))
    outcome = await svc.futures.wait(future.request_id, 60)
    assert outcome is not None and outcome.error is None, outcome
    return f"{session}:train:{seq}"


def test_lora_clients_share_one_base_and_a_finished_session_frees_its_models(tiny_model_path, tmp_path):
    async def main():
        svc = TinkerService(TinkerConfig(root=str(tmp_path)), tiny_model_path, 0, asyncio.get_running_loop())
        a, b = await create(svc, "s1", 0, tiny_model_path), await create(svc, "s1", 1, tiny_model_path)
        c = await create(svc, "s2", 0, tiny_model_path)
        full = await create(svc, "s2", 1, tiny_model_path, lora=False)
        ptrs = {m: q_proj(svc.models[m]).data_ptr() for m in (a, b, c, full)}
        assert ptrs[a] == ptrs[b] == ptrs[c]           # one copy of the base for every LoRA client
        assert ptrs[full] != ptrs[a]                   # full fine-tuning trains its own
        # the sampler's base weights are that copy too
        base = svc.bases.resolve(tiny_model_path)
        assert svc.samplers._base_weights_of(base)["model.layers.0.self_attn.q_proj.weight"].data_ptr() == ptrs[a]

        # training one client moves its adapters only: the shared weights and the other clients stay as they were
        before = q_proj(svc.models[b]).detach().clone()
        tm = svc.models[a]
        for p in tm.engine.model.parameters():
            if p.requires_grad:
                p.grad = torch.ones_like(p)
        tm.engine.optimizer_step()
        assert torch.equal(q_proj(svc.models[b]), before)
        del tm

        models = [weakref.ref(svc.models[m].engine.model) for m in (a, b)]
        svc.end_session("s1", "finished")
        gc.collect()
        assert all(ref() is None for ref in models)    # adapters, optimizer state: gone
        assert set(svc.models) == {c, full}
        with pytest.raises(Exception, match="was freed: finished"):
            svc.model(a, KEY)
        assert not svc.heartbeat("s1", KEY)                 # the SDK stops beating on 410
    asyncio.run(main())


def test_a_session_without_heartbeat_has_its_queued_work_dropped(tiny_model_path, tmp_path):
    async def main():
        cfg = TinkerConfig(root=str(tmp_path), session_timeout_s=30.0)
        svc = TinkerService(cfg, tiny_model_path, 0, asyncio.get_running_loop())
        dead, alive = await create(svc, "dead", 0, tiny_model_path), await create(svc, "alive", 0, tiny_model_path)
        svc.touch("alive")
        gate = asyncio.Event()
        loop = asyncio.get_running_loop()

        def blocker(_):  # holds the runner until released, so the dead client's work stays queued
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(30)
            return []
        svc._queue(blocker, caller=caller(svc), client="other")
        await asyncio.sleep(0.1)
        adam = types.OptimStepRequest(adam_params=types.AdamParams(learning_rate=1e-3), model_id=dead, seq_id=1)
        queued = [svc.optim_step(adam, caller(svc))]
        assert svc.runner.queued("dead") == 1 and svc.futures.known(queued[0].request_id)
        clock = __import__("time").monotonic() + 31
        svc.sessions["alive"] = clock                  # heard of just now, at the clock below
        svc.reap(now=clock)
        assert svc.runner.queued("dead") == 0 and not svc.futures.known(queued[0].request_id)
        assert dead not in svc.models and alive in svc.models
        gate.set()
    asyncio.run(main())
