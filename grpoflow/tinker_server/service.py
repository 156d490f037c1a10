"""What each Tinker request does: check it, queue the work, answer with a future (or at once for light ones).

State kept in memory: sessions, training models, sampling sessions, futures. A session ends when the SDK finishes
it or when no heartbeat or request came for `tinker.session_timeout_s`; its queued work is dropped and its
models, sampling sessions and futures are freed (`end_session`, run by `janitor`, which also frees models idle
for `tinker.model_idle_s` and results older than `tinker.future_ttl_s`). State kept on disk under `tinker.root`
(so a restarted server serves it): saved states (`tinker://<model_id>/weights/<name>`) and named sampler weights
(`tinker://<model_id>/sampler_weights/<name>`), each an atomic grpoflow checkpoint folder (a kill at any moment
leaves the old or the new one; `recover_folders` at start finishes or undoes an interrupted replacement).

Every session belongs to the client that created it (a digest of its API key: guard.Caller), and so do its
training models and sampling sessions: another client naming them (a model id is in every tinker:// path) is
refused with 403 (`NotYours`) and uses up none of their seq_ids. Saved states and sampler weights on disk stay
readable by path. Requests take their share of the shared budget (budget.py) before they are queued.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import json
import logging
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import torch
from tinker import types
from tinker.types.checkpoint import ParsedCheckpointTinkerPath

from grpoflow.config import TinkerConfig
from grpoflow.atomic_folder import publish_folder, recover_folders
from grpoflow.tinker_server import sampling, training
from grpoflow.errors import UserError
from grpoflow.engines.whole_batch import generate_batch
from grpoflow.tinker_server.budget import Budget
from grpoflow.tinker_server.futures import Futures, Job, Outcome, Runner, SeqGate
from grpoflow.tinker_server.guard import Caller
from grpoflow.tinker_server.models import (MODEL_FILE, BaseModels, ModelSpec, TrainingModel, check_state,
                                           model_folder_name, safe_name)
from grpoflow.tinker_server.sampling import owner_of
from grpoflow.tinker_server.wire import PROTOBUF, ForwardBackwardCall, encode_forward_backward, encode_sample


log = logging.getLogger("grpoflow.tinker")


def release_memory() -> None:
    """Collect what a freed model left (peft modules hold reference cycles) and, on glibc, hand the freed heap
    back to the system: tensors under malloc's mmap threshold (adapters, optimizer moments) otherwise stay in
    the process's resident memory after they are freed."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def json_outcome(model) -> Outcome:
    return Outcome(body=model.model_dump_json(exclude_none=True).encode())


class NotYours(UserError):
    """A request names a session, model, sampling session or future of another client (answered 403)."""


def budget_of(cfg: TinkerConfig) -> Budget:
    return Budget(int(cfg.max_queued_mb * 2**20), cfg.max_queued_tokens)


class TinkerService:
    def __init__(self, cfg: TinkerConfig, model_path: str, seed: int, loop: asyncio.AbstractEventLoop,
                 budget: Budget | None = None) -> None:
        self.cfg = cfg
        self.root = Path(cfg.root)
        self.budget = budget_of(cfg) if budget is None else budget
        self.bases = BaseModels(self.root, model_path, cfg.model_name, seed=seed)
        self.futures = Futures(loop, ttl_s=cfg.future_ttl_s)
        self.runner = Runner(self.futures, max_batch_tokens=cfg.max_sample_tokens)
        self.samplers = sampling.Samplers(cfg.sampler_snapshots, seed=seed, base_weights=lambda base: {
            n: p.detach() for n, p in self.bases.shared(base).named_parameters()})
        self.models: dict[str, TrainingModel] = {}
        self.gates: dict[str, SeqGate] = {}
        self.sessions: dict[str, float] = {}  # session id -> when it was last heard of (time.monotonic)
        self.ended: dict[str, str] = {}       # session id -> why it ended
        self.owners: dict[str, str] = {}      # session id -> the client that created it (guard.Caller.client)
        self._lock = threading.RLock()
        self._counter = itertools.count()
        self._clients: dict[str, itertools.count] = {}
        recovered = sum(recover_folders(kind) for kind in (self.root / "runs").glob("*/*") if kind.is_dir())
        if recovered:
            log.info("finished or undid %d interrupted state saves under %s", recovered, self.root / "runs")

    # --- sessions -------------------------------------------------------------------------------------------
    def create_session(self, client: str) -> types.CreateSessionResponse:
        session_id = uuid.uuid4().hex[:16]
        self.own(session_id, client)
        self.touch(session_id)
        return types.CreateSessionResponse(session_id=session_id, info_message=(
            f"grpoflow serve tinker: session {session_id}; states are kept in {self.root.resolve()}"))

    def own(self, session_id: str, client: str, adopt: bool = True) -> None:
        """NotYours unless `client` created session `session_id`. A session this server never saw (it was
        restarted) becomes the first asking client's when `adopt`."""
        with self._lock:
            owner = self.owners.setdefault(session_id, client) if adopt else self.owners.get(session_id, client)
        if owner != client:
            raise NotYours(f"session {session_id} and its models belong to another client (one with another API "
                           "key): a client drives only the sessions and models it created. Start a ServiceClient of "
                           "your own; saved states and sampler weights load by their tinker:// path.")

    def owns(self, session_id: str, client: str) -> bool:
        with self._lock:
            return self.owners.get(session_id) == client

    def touch(self, session_id: str) -> None:
        """Session `session_id` is alive now (a heartbeat or a request of its)."""
        with self._lock:
            self.sessions[session_id] = time.monotonic()
            self.ended.pop(session_id, None)

    def heartbeat(self, session_id: str, client: str) -> bool:
        """False if the session has ended (the SDK then stops beating); a session this server never saw (it was
        restarted) is taken as alive."""
        self.own(session_id, client)
        with self._lock:
            if session_id in self.ended:
                return False
        self.touch(session_id)
        return True

    def end_session(self, session_id: str, why: str) -> None:
        """Drop the session's queued work and free its models, gates, sampling sessions and futures."""
        with self._lock:
            self.sessions.pop(session_id, None)
            self.ended[session_id] = why
            gone = [m for m in self.models if owner_of(m) == session_id]
            gates = [self.gates.pop(m) for m in [*self.gates] if owner_of(m) == session_id]
            for model_id in gone:
                del self.models[model_id]
            for key in [k for k in self._clients if owner_of(k) == session_id]:
                del self._clients[key]
        self.samplers.drop_owner(session_id)
        dropped = self.runner.drop(session_id) + sum(gate.drop() for gate in gates)
        self.futures.drop_owner(session_id)
        log.info("session %s %s: %d models freed, %d queued requests dropped", session_id, why, len(gone), dropped)
        release_memory()

    def free_model(self, model_id: str, why: str) -> None:
        with self._lock:
            self.models.pop(model_id, None)
            gate = self.gates.pop(model_id, None)
            self.ended[model_id] = why
        if gate is not None:
            gate.drop()
        log.info("model %s freed: %s", model_id, why)
        release_memory()

    def reap(self, now: float | None = None) -> None:
        """End sessions not heard of for session_timeout_s, free models idle for model_idle_s, drop old results."""
        now = time.monotonic() if now is None else now
        with self._lock:
            dead = [s for s, seen in self.sessions.items() if now - seen > self.cfg.session_timeout_s]
            idle = [m for m, tm in self.models.items()
                    if self.cfg.model_idle_s > 0 and now - tm.last_used > self.cfg.model_idle_s]
        for session_id in dead:
            self.end_session(session_id, f"timed out (no heartbeat or request for {self.cfg.session_timeout_s:g} s)")
        for model_id in idle:
            self.free_model(model_id, f"no request used it for {self.cfg.model_idle_s:g} s (tinker.model_idle_s)")
        self.futures.expire(now)

    async def janitor(self) -> None:
        """`reap` every few seconds, on the server's event loop."""
        period = max(0.05, min(10.0, self.cfg.session_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            self.reap()

    def skip(self, model_id: str, seq_id: int, client: str) -> None:
        """A refused request of `model_id` passes its seq_id through the model's gate (see futures.SeqGate); one
        from another client than the model's owner changes nothing."""
        with self._lock:
            gate = self.gates.get(model_id)
        if gate is not None and self.owns(owner_of(model_id), client):
            gate.skip(seq_id)

    def unblocks(self, model_id: str, seq_id: int, client: str) -> bool:
        """The owner's request that `model_id`'s queued requests wait for (budget.py admits it past the budget)."""
        with self._lock:
            gate = self.gates.get(model_id)
        return gate is not None and self.owns(owner_of(model_id), client) and gate.blocking(seq_id)

    def capabilities(self) -> types.GetServerCapabilitiesResponse:
        from tinker.types.get_server_capabilities_response import SupportedModel

        models = []
        for name in self.bases.served():
            try:
                context = self.bases.context_length(self.bases.resolve(name))
            except UserError:
                context = None
            models.append(SupportedModel(model_name=name, max_context_length=context, trainable=True,
                                         sampleable=True))
        return types.GetServerCapabilitiesResponse(supported_models=models)

    # --- futures ---------------------------------------------------------------------------------------------
    def _queue(self, run, payload=None, *, caller: Caller, model_id: str | None = None, seq_id: int | None = None,
               client: str | None = None, batch_key=None, max_batch: int = 1, tokens: int = 0,
               sequence_ids: list[str] | None = None) -> types.UntypedAPIFuture:
        """Queue `run` for the runner as work of session `client` (default: the model's), through the model's
        sequence gate when there is a model; the job keeps the caller's budget ticket until it has run."""
        client = owner_of(client if client is not None else model_id or "")
        request_id = self.futures.new(client)
        job = Job(request_id, run, payload, batch_key, max_batch, client, tokens, caller.ticket)
        caller.ticket.kept = True
        try:
            if model_id is None:
                self.runner.submit(job)
            else:
                self._gate(model_id).offer(seq_id, job)
        except UserError:
            caller.ticket.kept = False
            self.futures.discard(request_id)
            raise
        return types.UntypedAPIFuture(request_id=request_id, model_id=model_id, sample_sequence_ids=sequence_ids)

    def _gate(self, model_id: str) -> SeqGate:
        with self._lock:
            if model_id not in self.gates:
                self.gates[model_id] = SeqGate(self.runner.submit)
            return self.gates[model_id]

    def model(self, model_id: str, client: str) -> TrainingModel:
        self.own(owner_of(model_id), client, adopt=False)
        with self._lock:
            tm = self.models.get(model_id)
            why = self.ended.get(model_id) or self.ended.get(owner_of(model_id))
        if tm is None and why is not None:
            raise UserError(f"model {model_id} was freed: {why}; continue from a saved state "
                            "(create_training_client_from_state(path)).")
        if tm is None:
            raise UserError(f"unknown model_id {model_id!r}: create it with create_lora_training_client (a restarted "
                            "server keeps saved states only: create_training_client_from_state(path)).")
        tm.last_used = time.monotonic()
        self.touch(owner_of(model_id))
        return tm

    # --- training models -------------------------------------------------------------------------------------
    def create_model(self, req: types.CreateModelRequest, caller: Caller) -> types.UntypedAPIFuture:
        self.own(req.session_id, caller.client)
        if getattr(req.optimizer_config, "type", "adamw") != "adamw":
            raise UserError(f"optimizer {req.optimizer_config.type!r} is not supported; this server runs AdamW.")
        lora = req.lora_config
        spec = ModelSpec(base_model=req.base_model, lora_rank=None if lora is None else lora.rank,
                         lora_alpha=self.cfg.lora_alpha, train_attn=True if lora is None else lora.train_attn,
                         train_mlp=True if lora is None else lora.train_mlp,
                         train_unembed=True if lora is None else lora.train_unembed,
                         seed=None if lora is None else lora.seed)
        model_id = self._model_id(req.session_id, req.model_seq_id)

        def run(_):
            self._new_model(model_id, spec)
            return [json_outcome(types.CreateModelResponse(model_id=model_id))]
        return self._queue(run, caller=caller, client=req.session_id)

    def _model_id(self, session_id: str, model_seq_id: int) -> str:
        model_id = f"{session_id}:train:{model_seq_id}"
        model_folder_name(model_id)  # UserError for a session id of other characters
        self.touch(session_id)
        return model_id

    def _new_model(self, model_id: str, spec: ModelSpec) -> TrainingModel:
        with self._lock:
            if model_id in self.models:
                raise UserError(f"model {model_id} exists already; each training client needs a new model_seq_id.")
            if owner_of(model_id) in self.ended:
                raise UserError(f"session {owner_of(model_id)} has ended ({self.ended[owner_of(model_id)]}); "
                                "start a new ServiceClient.")
        base = self.bases.resolve(spec.base_model)
        shared = self.bases.shared(base) if spec.lora_rank is not None else None
        tm = TrainingModel(model_id, base, spec, self._gate(model_id), shared=shared)
        with self._lock:
            self.models[model_id] = tm
        return tm

    def get_info(self, model_id: str, client: str) -> types.GetInfoResponse:
        tm = self.model(model_id, client)
        model = tm.engine.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
        arch = type(base).__name__
        data = types.ModelData(arch=arch, model_name=tm.base.name, tokenizer_id=tm.base.folder)
        return types.GetInfoResponse(model_data=data, model_id=model_id, is_lora=tm.spec.lora_rank is not None,
                                     lora_rank=tm.spec.lora_rank, model_name=tm.base.name)

    def forward_backward(self, call: ForwardBackwardCall, caller: Caller) -> types.UntypedAPIFuture:
        tm = self.model(call.model_id, caller.client)

        def run(_):
            if call.error is not None:
                raise UserError(call.error)
            outputs, metrics = training.forward_backward(tm, call.data, call.loss_fn, call.loss_fn_config,
                                                         forward_only=call.forward_only,
                                                         microbatch_tokens=self.cfg.microbatch_tokens,
                                                         max_length=self.bases.context_length(tm.base))
            return [Outcome(body=encode_forward_backward(outputs, metrics), media_type=PROTOBUF)]
        return self._queue(run, caller=caller, model_id=tm.model_id, seq_id=call.seq_id)

    def optim_step(self, req: types.OptimStepRequest, caller: Caller) -> types.UntypedAPIFuture:
        tm = self.model(req.model_id, caller.client)
        training.check_adam(req.optim_params)  # a refusal here still passes its seq_id (guard.py)

        def run(_):
            return [json_outcome(types.OptimStepResponse(metrics=training.optim_step(tm, req.optim_params)))]
        return self._queue(run, caller=caller, model_id=tm.model_id, seq_id=req.seq_id)

    # --- saved states ----------------------------------------------------------------------------------------
    def _folder(self, model_id: str, kind: str, name: str) -> tuple[Path, str]:
        path = f"tinker://{model_id}/{kind}/{name}"
        return self.root / "runs" / model_folder_name(model_id) / kind / safe_name(name), path

    def folder_of(self, tinker_path: str, kind: str) -> Path:
        try:
            parsed = ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
        except ValueError:
            raise UserError(f"{tinker_path!r} is not a tinker path; give one like tinker://<model_id>/{kind}/<name>, "
                            "as save_state / save_weights_for_sampler return.") from None
        segment, _, name = parsed.checkpoint_id.partition("/")
        if segment != kind:
            raise UserError(f"{tinker_path!r} points at {segment}, not at {kind} (saved by "
                            f"{'save_state' if kind == 'weights' else 'save_weights_for_sampler'}).")
        return self._folder(parsed.training_run_id, kind, name)[0]

    # A request that carries a seq_id is refused inside its job, never before it is queued: the model's later
    # requests wait for every earlier seq_id, so a refusal must take its place in the order.
    def save_weights(self, req: types.SaveWeightsRequest, caller: Caller) -> types.UntypedAPIFuture:
        tm = self.model(req.model_id, caller.client)
        name = req.path or f"state-{next(self._counter):06d}"
        safe_name(name)

        def run(_):
            folder, path = self._folder(tm.model_id, "weights", name)
            if folder.exists() and not req.overwrite:
                raise UserError(f"a state named {name!r} exists already for this model; pick another name or pass "
                                "overwrite=True.")
            tm.save(folder)
            return [json_outcome(types.SaveWeightsResponse(path=path))]
        return self._queue(run, caller=caller, model_id=tm.model_id, seq_id=req.seq_id)

    def load_weights(self, req: types.LoadWeightsRequest, caller: Caller) -> types.UntypedAPIFuture:
        if req.model_id is not None:
            tm = self.model(req.model_id, caller.client)

            def run_existing(_):
                tm.load(self.folder_of(req.path, "weights"), optimizer=req.optimizer)
                return [json_outcome(types.LoadWeightsResponse(path=req.path, model_id=tm.model_id))]
            return self._queue(run_existing, caller=caller, model_id=tm.model_id, seq_id=req.seq_id)
        if req.session_id is None or req.model_seq_id is None:
            raise UserError("load_weights needs either model_id or session_id and model_seq_id.")
        self.own(req.session_id, caller.client)
        model_id = self._model_id(req.session_id, req.model_seq_id)

        folder = self.folder_of(req.path, "weights")

        def run_new(_):
            spec = check_state(folder)
            if req.base_model is not None:
                spec = ModelSpec(**{**asdict(spec), "base_model": req.base_model})
            tm = self._new_model(model_id, spec)
            tm.load(folder, optimizer=req.optimizer)
            return [json_outcome(types.LoadWeightsResponse(path=req.path, model_id=model_id))]
        return self._queue(run_new, caller=caller, client=req.session_id)

    # --- sampling ----------------------------------------------------------------------------------------------
    def save_for_sampler(self, req: types.SaveWeightsForSamplerRequest, caller: Caller) -> types.UntypedAPIFuture:
        tm = self.model(req.model_id, caller.client)
        if req.path is not None:
            safe_name(req.path)

        def run(_):
            if req.path is None and req.sampling_session_seq_id is None:
                raise UserError("save_weights_for_sampler needs a name (path) or a sampling_session_seq_id.")
            if req.path is not None:
                adapters = sampling.adapter_snapshot(tm.engine.model) if tm.spec.lora_rank is not None else None
                folder, path = self._folder(tm.model_id, "sampler_weights", req.path)
                save_sampler_folder(folder, adapters if adapters is not None else {
                    name: t.detach().clone().cpu() for name, t in tm.engine.named_weights()}, tm.spec)
                return [json_outcome(types.SaveWeightsForSamplerResponseInternal(path=path))]
            session_id = f"{tm.model_id}:sampler:{req.sampling_session_seq_id}"
            key = f"mem:{session_id}"
            snapshot = sampling.adapter_snapshot(tm.engine.model) if tm.spec.lora_rank is not None else None
            self.samplers.remember(key, snapshot if snapshot is not None else {
                name: t.detach().clone() for name, t in tm.engine.named_weights()})
            self.samplers.add_session(sampling.Session(session_id, tm.base, key, None))
            return [json_outcome(types.SaveWeightsForSamplerResponseInternal(sampling_session_id=session_id))]
        return self._queue(run, caller=caller, model_id=tm.model_id, seq_id=req.seq_id)

    def sampling_session(self, session_id: str, model_path: str | None, base_model: str | None) -> sampling.Session:
        """A session on saved sampler weights (model_path) or on a base model."""
        if model_path is not None:
            folder = self.folder_of(model_path, "sampler_weights")
            if not (folder / MODEL_FILE).is_file():
                raise UserError(f"no sampler weights at {model_path}: save them with "
                                "training_client.save_weights_for_sampler(name) first.")
            spec = ModelSpec(**json.loads((folder / MODEL_FILE).read_text()))
            base = self.bases.resolve(base_model or spec.base_model)
            return sampling.Session(session_id, base, str(folder), model_path)
        if base_model is None:
            raise UserError("a sampling session needs a model_path or a base_model.")
        base = self.bases.resolve(base_model)
        return sampling.Session(session_id, base, f"base:{base.folder}", None)

    def create_sampling_session(self, req: types.CreateSamplingSessionRequest,
                                client: str) -> types.CreateSamplingSessionResponse:
        self.own(req.session_id, client)
        session_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        self.samplers.add_session(self.sampling_session(session_id, req.model_path, req.base_model))
        return types.CreateSamplingSessionResponse(sampling_session_id=session_id)

    def join(self, session_id: str, client: str) -> types.JoinSamplingSessionResponse:
        self.own(owner_of(session_id), client, adopt=False)
        self.samplers.session(session_id)
        with self._lock:
            counter = self._clients.setdefault(session_id, itertools.count(1))
            return types.JoinSamplingSessionResponse(client_counter=next(counter))

    def sampler_info(self, session_id: str, client: str) -> types.GetSamplerResponse:
        self.own(owner_of(session_id), client, adopt=False)
        session = self.samplers.session(session_id)
        return types.GetSamplerResponse(sampler_id=session_id, base_model=session.base.name,
                                        model_path=session.model_path)

    def asample(self, req: types.SampleRequest, caller: Caller) -> types.UntypedAPIFuture:
        if req.sampling_session_id is not None:
            self.own(owner_of(req.sampling_session_id), caller.client, adopt=False)
            session = self.samplers.session(req.sampling_session_id)
            self.touch(owner_of(session.session_id))
        else:
            session = self.sampling_session(f"oneoff-{uuid.uuid4().hex}:sample:0", req.model_path, req.base_model)
        prompt = req.prompt.to_ints()
        if not prompt:
            raise UserError("the prompt is empty; give at least one token.")
        params = sampling.engine_params(req, self.cfg.max_tokens)  # checked before queueing
        tokens = sampling.check_size(len(prompt), params[0], self.bases.context_length(session.base),
                                     self.cfg.max_sample_tokens)
        caller.ticket.add(n_tokens=tokens)  # budget.Busy (429) while the queue holds too many
        key = (session.snapshot, repr(params), bool(req.prompt_logprobs), req.prompt_logprobs_last_n,
               req.topk_prompt_logprobs)
        prefix = uuid.uuid4().hex[:12]
        ids = [f"{prefix}-{j}" for j in range(req.num_samples)]
        return self._queue(self._sample_batch, (session, req), caller=caller, client=session.session_id,
                           batch_key=key, max_batch=self.cfg.max_sample_batch, tokens=tokens, sequence_ids=ids)

    @torch.no_grad()
    def _sample_batch(self, payloads: list) -> list[Outcome]:
        """Every request of the batch shares weights and parameters (the batch key): one generate call."""
        session, first = payloads[0]
        engine, tokenizer = self.samplers.engine_for(session)
        params, stop_strings = sampling.engine_params(first, self.cfg.max_tokens)
        prompts = [req.prompt.to_ints() for _, req in payloads]
        seeds = [req.sampling_params.seed if req.sampling_params.seed is not None else self.samplers.next_seed()
                 for _, req in payloads]
        vocab = int(engine.model.config.vocab_size)  # type: ignore[union-attr,arg-type]  # an HF model's config
        if any(t < 0 or t >= vocab for p in prompts for t in p):
            raise UserError(f"prompt token ids must lie in [0, {vocab}).")
        generation = generate_batch(engine, prompts, params, seeds=seeds)
        outcomes = []
        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=False)  # type: ignore[attr-defined]
        for i, (_, req) in enumerate(payloads):
            seqs = sampling.sequences(generation, range(i * params.n, (i + 1) * params.n), stop_strings, decode)
            scores = None
            if req.prompt_logprobs or req.topk_prompt_logprobs > 0:
                scores = sampling.prompt_scores(engine.model, prompts[i], req.prompt_logprobs_last_n,
                                                bool(req.prompt_logprobs), req.topk_prompt_logprobs)
            outcomes.append(Outcome(body=encode_sample(seqs, scores), media_type=PROTOBUF))
        return outcomes


def save_sampler_folder(folder: Path, weights: sampling.Snapshot, spec: ModelSpec) -> None:
    """Named sampler weights and the spec (its base_model names the base), as an atomic folder: a LoRA model's
    adapters (an AdapterSnapshot: `adapters.safetensors`, a rank-r fraction of the weights) or a full model's
    weights (`model.safetensors`)."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        if isinstance(weights, sampling.AdapterSnapshot):
            sampling.save_adapters(weights, tmp / sampling.ADAPTERS_FILE)
        else:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / sampling.WEIGHTS_FILE))
        (tmp / MODEL_FILE).write_text(json.dumps(asdict(spec), indent=1))
    publish_folder(folder, write)
