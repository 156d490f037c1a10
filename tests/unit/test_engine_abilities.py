"""Engines declare their abilities (engines/protocol.py `EngineAbilities`) and are never probed for them; every
engine samples one way, whole-batch generation (engines/whole_batch.py) included.

- the declarations: the HF engines step, pause and sleep; pausing without stepping is refused;
- `build_engine` refuses an engine that does not declare its abilities, or lacks the verbs its declaration
  promises, with a sentence that names what to add (a user engine, `rollout.engine=file.py:fn`);
- callers branch on the declaration: a whole-batch engine is served by `BatchCalls`, a pause of an engine that
  declares no pausing is refused without calling `pause`;
- one sampling path: a single-turn rollout samples what `generate_batch` samples for the same seeds;
- no `hasattr` / `getattr` probe of an engine is left in grpoflow/ (read from the source, so a new one fails here).
"""

import ast
import asyncio
import textwrap
from pathlib import Path

import pytest
import torch

from grpoflow.errors import UserError
from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model
from grpoflow.trajectories.loop import RolloutItem, SingleTurn
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.engines.batcher import EngineFailure, RequestBatcher
from grpoflow.engines.factory import build_engine
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.hf_adapter import HFAdapterEngine
from grpoflow.engines.protocol import EngineAbilities, Generation, Request, SamplingParams
from grpoflow.engines.random_streams import prompt_seeds
from grpoflow.engines.whole_batch import BatchCalls, generate_batch, stepper

TOK = build_char_tokenizer()
MODEL = build_tiny_model(TOK, size="0.5m").eval()
PACKAGE = Path(__file__).resolve().parents[2] / "grpoflow"


def hf_engine():
    return HFRolloutEngine(MODEL, pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)


def test_the_hf_engines_declare_stepping_pausing_and_sleeping():
    everything = EngineAbilities(stepping=True, pausing=True, sleeping=True)
    assert hf_engine().abilities == everything
    adapter = HFAdapterEngine(build_tiny_model(TOK, size="0.5m"), lora={"rank": 2, "alpha": 4,
                                                                        "target_modules": ["q_proj"]},
                              pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)
    assert adapter.abilities == everything and adapter.eos_token_id == TOK.eos_token_id


def test_a_declaration_is_frozen_and_pausing_needs_stepping():
    with pytest.raises(ValueError, match="pausing=True.*needs stepping=True"):
        EngineAbilities(stepping=False, pausing=True)
    with pytest.raises(AttributeError):
        EngineAbilities(stepping=True).stepping = False  # type: ignore[misc]


ENGINE_FILE = """
from grpoflow.engines.protocol import EngineAbilities


class Base:
    version = 0

    def __init__(self, pad_token_id, eos_token_id):
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id

    def update_weights(self, named_tensors, version): ...
    def sleep(self): ...
    def wake(self): ...
    def end_rollout(self): ...


class Undeclared(Base):
    def generate(self, prompts, params, seeds=None): ...


class SteppingWithoutStep(Base):
    abilities = EngineAbilities(stepping=True)
    busy = False

    def admit(self, requests): ...


class BatchWithoutGenerate(Base):
    abilities = EngineAbilities(stepping=False)


def build(cls):
    def builder(model_path, *, pad_token_id, eos_token_id, **options):
        return globals()[cls](pad_token_id, eos_token_id)
    return builder


undeclared, stepping_without_step, batch_without_generate = (build("Undeclared"), build("SteppingWithoutStep"),
                                                             build("BatchWithoutGenerate"))
"""


@pytest.mark.parametrize("fn, message", [
    ("undeclared", r"built a Undeclared, which is not a rollout engine: give it `abilities = EngineAbilities\("),
    ("stepping_without_step", r"built a SteppingWithoutStep, which declares stepping but lacks a verb of it: give it "
                              r"`busy`, `admit`, `tick` and `pause`"),
    ("batch_without_generate", r"built a BatchWithoutGenerate, which declares no stepping but has no "
                               r"`generate\(prompts, params, seeds\)`"),
])
def test_build_engine_refuses_an_engine_that_does_not_declare_what_it_can_do(tmp_path, fn, message):
    path = tmp_path / "my_engine.py"
    path.write_text(textwrap.dedent(ENGINE_FILE))
    with pytest.raises(UserError, match=rf"rollout.engine='{path}:{fn}' " + message):
        build_engine(f"{path}:{fn}", str(tmp_path), TOK)


class EchoBatch:
    """A whole-batch engine (declares no stepping): sample j of a prompt is its last id + 1, then EOS; it records
    the seeds of each call."""
    abilities = EngineAbilities(stepping=False)
    version, pad_token_id, eos_token_id = 4, 0, 2

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, seeds=None):
        from grpoflow.engines.external import pack_samples

        self.calls.append(list(seeds))
        responses = [[p[-1] + 1, 2][:params.max_new_tokens] for p in prompts for _ in range(params.n)]
        return pack_samples(prompts, params.n, responses, [[-0.5] * len(r) for r in responses], pad_token_id=0,
                            eos_token_id=2)

    def end_rollout(self):
        pass


def test_a_whole_batch_engine_is_served_by_batch_calls_with_each_requests_stream():
    engine = EchoBatch()
    assert isinstance(stepper(engine), BatchCalls)
    hf = hf_engine()
    assert stepper(hf) is hf
    gen = generate_batch(engine, [[10, 11], [20]], SamplingParams(n=2, max_new_tokens=5), seeds=[7, 8])
    assert isinstance(gen, Generation) and gen.response_ids.tolist() == [[12, 2], [12, 2], [21, 2], [21, 2]]
    assert not gen.truncated.any() and len(engine.calls) == 1 and len(set(engine.calls[0])) == 4


def pause_with(engine):
    """A request admitted, then the batcher paused while it runs: what the trajectory gets (or raises)."""
    async def main():
        batcher = RequestBatcher(engine, version=lambda: 0)
        server = asyncio.ensure_future(batcher.serve())
        client = batcher.client(0)
        pending = asyncio.ensure_future(client.generate(Request((5, 6), 50, stream=1)))
        while not batcher.engine.busy:  # until the request runs
            await asyncio.sleep(0)
        batcher.pause()
        try:
            return await pending
        finally:
            client.done()
            batcher.close()
            await asyncio.gather(server, return_exceptions=True)

    return asyncio.run(main())


class NeverFinishes:
    """A stepping engine that declares no pausing: its `pause` must not be called."""
    abilities = EngineAbilities(stepping=True)

    def __init__(self):
        self.admitted = []

    @property
    def busy(self):
        return bool(self.admitted)

    def admit(self, requests):
        self.admitted += requests

    def tick(self, version):
        return []

    def pause(self):
        raise AssertionError("pause() called on an engine that declares no pausing")


def test_a_pause_follows_the_declaration():
    with pytest.raises(EngineFailure, match="NeverFinishes cannot stop its requests at a token boundary \\(it "
                                            "declares no pausing\\); rollout.partial needs rollout.engine=hf"):
        pause_with(NeverFinishes())
    paused = pause_with(hf_engine())  # declares pausing: the request comes back unfinished
    assert paused.finish == "paused" and len(paused.ids) < 50


def test_a_rollout_samples_what_whole_batch_generation_samples_for_the_same_seeds():
    """One sampling path and one seeding scheme: prompt i seeded `prompt_seeds(5, i)` in `generate_batch` gives the
    samples of a single-turn rollout with seed 5."""
    engine = hf_engine()
    prompts = [list(TOK.encode(p, add_special_tokens=False)) for p in ("1+2=", "30+4=", "7+7=")]
    params = SamplingParams(n=2, max_new_tokens=8, temperature=1.0)
    batch = run_rollout(SingleTurn(TOK), engine, [RolloutItem(p, i, i) for i, p in enumerate(prompts)], params, 5)
    whole = generate_batch(engine, prompts, params, seeds=prompt_seeds(5, torch.arange(3)).tolist())
    width = batch.response_ids.shape[1]
    assert torch.equal(batch.response_ids, whole.response_ids[:, :width])
    assert torch.equal(batch.response_attention_mask, whole.response_mask[:, :width])
    assert torch.equal(batch.rollout_log_probs, whole.log_probs[:, :width])


# --------------------------------------------------------------------------- no probes left in the package

ABILITY_NAMES = {"abilities", "admit", "tick", "busy", "pause", "sleep", "wake", "can_sleep", "end_rollout",
                 "generate", "update_weights", "eos_token_id", "pad_token_id", "admission_wait_s"}


def probes(source: str) -> list[str]:
    """`hasattr` / `getattr` calls on something named like an engine, or for a name an engine declares or defines,
    and `except AttributeError` clauses around engine calls, as 'line: code'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") \
                and node.args:
            target = ast.unparse(node.args[0]).lower()
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
            if "engine" in target or name in ABILITY_NAMES:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                caught = ast.unparse(handler.type) if handler.type is not None else ""
                if "AttributeError" in caught and "engine" in ast.unparse(node).lower():
                    found.append(f"{handler.lineno}: except {caught}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_no_engine_is_probed_for_its_abilities_anywhere_in_the_package():
    found = {str(path.relative_to(PACKAGE.parent)): hits for path in sorted(PACKAGE.rglob("*.py"))
             if (hits := probes(path.read_text()))}
    assert not found, f"engines declare their abilities (EngineAbilities); read engine.abilities instead: {found}"


def test_the_probe_finder_finds_the_probes_this_change_removed():
    removed = """
step_engine = engine if hasattr(engine, "admit") else BatchCalls(engine)
end = getattr(engine, "end_rollout", None)
pause = getattr(self.engine, "pause", None)
wait = getattr(kind, "admission_wait_s", None)
try:
    self.engine.pause()
except AttributeError:
    pass
ok = getattr(result, "success", True)
"""
    assert [hit.split(":")[0] for hit in probes(removed)] == ["2", "3", "4", "5", "8"]
