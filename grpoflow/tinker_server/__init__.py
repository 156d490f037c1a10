"""`grpoflow serve tinker`: the Tinker API served by grpoflow, for the unmodified `tinker` SDK (docs/tinker.md).

    app.py       the HTTP routes the SDK calls (FastAPI), parsed into the SDK's own request types
    service.py   what each request does: sessions, training models, saved states, sampling sessions
    training.py  forward / forward_backward / optim_step on grpoflow's TrainEngine with the Tinker losses
    sampling.py  sampler weight snapshots and sampling on grpoflow's HF rollout engine
    models.py    base_model names -> local models; LoRA / full training models; saved states
    futures.py   futures (long-polled), the one worker thread (clients round-robin), seq_id ordering per model
    guard.py     around every route: API key, bounded bodies read in time, refused requests' seq_ids, bugs as JSON
                 errors
    budget.py    the bytes and tokens all clients' requests hold at once (429 past it)
    wire.py      the SDK's protobuf wire format (its own schema, tinker.proto)

The command that builds the app and runs uvicorn on 127.0.0.1 is grpoflow/commands/serve.py.
"""
