"""`grpoflow serve tinker` against clients that are each within every per-request bound but together are not
(issue 53 item 3): concurrent sample requests that would be batched into gigabytes, bodies that stall, a client
driving another client's model. The server runs in this process (uvicorn in a thread) on the tiny model, so
its budget can be read directly."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("tinker")
import httpx  # noqa: E402
import uvicorn  # noqa: E402
from tinker import types  # noqa: E402

from grpoflow.config import TinkerConfig  # noqa: E402
from grpoflow.tinker_server.app import build_app  # noqa: E402
from grpoflow.tinker_server.budget import Budget, Busy  # noqa: E402
from grpoflow.tinker_server.futures import Futures, Job, Outcome, Runner  # noqa: E402

MiB = 2**20
ALICE, MALLORY = {"X-API-Key": "tml-alice"}, {"X-API-Key": "tml-mallory"}


def test_sixteen_big_sample_requests_are_never_batched_together_and_the_queue_is_bounded():
    """16 requests of 55,000 tokens each (under tinker.max_sample_tokens = 65,536) with the same weights and
    parameters: batched together they were 880,000 tokens of KV cache (3.8 GB on SmolLM2). Each batch holds at
    most max_sample_tokens; and past tinker.max_queued_tokens a request is refused (429) until work has run."""
    budget = Budget(max_bytes=256 * MiB, max_tokens=4 * 65536)
    tickets, refused = [], 0
    for _ in range(16):
        ticket = budget.ticket()
        try:
            ticket.add(n_tokens=55_000)
            tickets.append(ticket)
        except Busy as e:
            refused += 1
            assert "tinker.max_queued_tokens" in str(e)
    assert len(tickets) == 4 and refused == 12 and budget.tokens == 220_000
    tickets[0].release()
    tickets[0].release()                               # idempotent
    budget.ticket().add(n_tokens=55_000)               # room again for one
    assert budget.tokens == 220_000

    async def main() -> list[int]:
        futures = Futures(asyncio.get_running_loop())
        runner = Runner(futures, max_batch_tokens=65536)
        hold, batches = threading.Event(), []
        runner.submit(Job(futures.new(), lambda _: [Outcome()] if hold.wait(10) else [], client="hold"))
        await asyncio.sleep(0.05)                      # the runner is busy: all 16 queue behind it
        ids = []
        for i in range(16):
            ids.append(futures.new(f"client{i}"))
            runner.submit(Job(ids[-1], lambda payloads: (batches.append(sum(payloads)), [Outcome()] * len(payloads))[1],
                              payload=55_000, batch_key="same weights", max_batch=64, client=f"client{i}",
                              tokens=55_000))
        hold.set()
        for request_id in ids:
            assert await futures.wait(request_id, 10) is not None
        return batches
    batches = asyncio.run(main())
    assert sum(batches) == 16 * 55_000 and max(batches) <= 65536, batches


def settles(check, timeout: float = 5.0) -> bool:
    """`check()` becomes true within `timeout` (a request gives its share back just after its answer is sent)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Server:
    """`grpoflow serve tinker`'s app under uvicorn in a thread, on a free port."""

    def __init__(self, model_path: str, root: str, **limits) -> None:
        self.app = build_app(TinkerConfig(root=root, port=0, **limits), model_path)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        self.service = self.app.state.service
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def stalled_post(self, path: str, declared: int, sent: int) -> socket.socket:
        """A client that declares `declared` bytes, sends `sent` of them and stalls."""
        conn = socket.create_connection(("127.0.0.1", self.port))
        conn.sendall(f"POST /api/v1/{path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nX-API-Key: tml-alice\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n".encode())
        conn.sendall(b" " * sent)
        return conn


def test_bodies_that_stall_are_dropped_and_the_byte_budget_answers_429(tiny_model_path, tmp_path):
    """max_request_mb 2, max_queued_mb 2, body_timeout_s 1: a client that sends 1.5 of 2 MiB and stalls holds its
    share for one second, then gets 408 and holds nothing; meanwhile a second 1.5 MiB body does not fit (429 with
    Retry-After, its bytes read and dropped) while a small one (under 64 KiB: a long poll, an optim_step) is never
    counted nor refused; once the first is gone, the big one fits."""
    with Server(tiny_model_path, str(tmp_path), max_request_mb=2, max_queued_mb=2, body_timeout_s=1.0) as srv:
        started = time.monotonic()
        stalled = srv.stalled_post("create_session", 2 * MiB, 3 * MiB // 2)
        while srv.service.budget.bytes == 0:
            time.sleep(0.01)
        assert srv.service.budget.bytes == 2 * MiB     # the declared length, taken once its first bytes came
        body = b'{"tags": [], "sdk_version": "0", "user_metadata": {"pad": "' + b"x" * (3 * MiB // 2) + b'"}}'
        busy = httpx.post(f"{srv.url}/create_session", content=body, headers={**ALICE, "Content-Type":
                                                                                "application/json"})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "2", busy.text
        assert "tinker.max_queued_mb" in busy.json()["error"]
        small = httpx.post(f"{srv.url}/create_session", headers=ALICE,   # under 64 KiB: never counted nor refused
                           json={"tags": [], "sdk_version": "0", "user_metadata": None})
        assert small.status_code == 200 and srv.service.budget.bytes == 2 * MiB
        stalled.settimeout(5)
        answer = b""
        while chunk := stalled.recv(4096):         # to the end: the server closes the stalled connection
            answer += chunk
        answer = answer.decode()
        assert answer.startswith("HTTP/1.1 408") and "tinker.body_timeout_s" in answer, answer
        assert 0.9 < time.monotonic() - started < 4
        stalled.close()
        assert settles(lambda: srv.service.budget.bytes == 0)   # nothing held after the timeout
        fits = httpx.post(f"{srv.url}/create_session", content=body, headers={**ALICE, "Content-Type":
                                                                                "application/json"})
        assert fits.status_code == 200, fits.text
        assert settles(lambda: srv.service.budget.bytes == 0)


def new_model(srv: Server, base: str) -> tuple[str, str, dict]:
    """ALICE's session, a LoRA model in it, and the create_model future."""
    session = httpx.post(f"{srv.url}/create_session", headers=ALICE,
                         json={"tags": [], "sdk_version": "0", "user_metadata": None}).json()["session_id"]
    create = types.CreateModelRequest(session_id=session, model_seq_id=0, base_model=base,
                                      lora_config=types.LoraConfig(rank=2))
    future = httpx.post(f"{srv.url}/create_model", headers=ALICE, timeout=60,
                        json=create.model_dump(mode="json", exclude_none=True)).json()
    model_id = httpx.post(f"{srv.url}/retrieve_future", headers=ALICE, timeout=60,
                          json={"request_id": future["request_id"]}).json()["model_id"]
    return session, model_id, future


def test_the_chunk_a_models_queued_chunks_wait_for_is_admitted_past_a_full_budget(tiny_model_path, tmp_path):
    """The SDK sends a big batch's chunks at once, first chunk last; the later ones wait in the model's seq_id gate
    holding their bytes. With the budget full, another client's request gets 429, but the first chunk is admitted:
    refused, it would be sent again forever while the others wait for it."""
    from tinker.proto import tinker_public_pb2 as pb

    with Server(tiny_model_path, str(tmp_path), max_request_mb=1, max_queued_mb=1) as srv:
        _, model_id, _ = new_model(srv, tiny_model_path)
        tokens = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.ones(150_000, np.int32).tobytes()))

        def chunk(seq_id: int) -> httpx.Response:                 # 600 KB each
            body = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy",
                                             data=[pb.Datum(model_input=[tokens])]).SerializeToString()
            return httpx.post(f"{srv.url}/forward_backward", content=body, timeout=60,
                              headers={**ALICE, "Content-Type": "application/x-protobuf"})
        second = chunk(2)
        assert second.status_code == 200 and srv.service.budget.bytes > 600_000   # parked, holding its bytes
        pad = b'{"tags": [], "sdk_version": "0", "user_metadata": {"pad": "' + b"x" * 600_000 + b'"}}'
        other = httpx.post(f"{srv.url}/create_session", content=pad, headers={**MALLORY, "Content-Type":
                                                                                   "application/json"})
        assert other.status_code == 429
        first = chunk(1)
        assert first.status_code == 200, first.text
        for future in (first.json(), second.json()):              # both ran (and were refused: no targets)
            done = httpx.post(f"{srv.url}/retrieve_future", headers=ALICE, timeout=60,
                              json={"request_id": future["request_id"]})
            assert done.status_code == 200 and "needs loss_fn_inputs" in done.json()["error"], done.text
        assert settles(lambda: srv.service.budget.bytes == 0)


def test_another_client_cannot_drive_a_model_or_use_up_its_seq_ids(tiny_model_path, tmp_path):
    """A model id is in every tinker:// path; a client with another API key that names it is refused (403) and
    uses up none of its seq_ids: the owner's request with that seq_id still runs. Its session cannot be ended or
    kept alive by the other client either."""
    with Server(tiny_model_path, str(tmp_path)) as srv:
        def post(path: str, body, key=ALICE) -> httpx.Response:
            return httpx.post(f"{srv.url}/{path}", headers=key, timeout=60,
                              json=body.model_dump(mode="json", exclude_none=True))

        session, model_id, future = new_model(srv, tiny_model_path)
        create = types.CreateModelRequest(session_id=session, model_seq_id=0, base_model=tiny_model_path,
                                          lora_config=types.LoraConfig(rank=2))
        step = types.OptimStepRequest(adam_params=types.AdamParams(learning_rate=1e-3), model_id=model_id, seq_id=1)
        stolen = post("optim_step", step, MALLORY)
        assert stolen.status_code == 403 and "belong to another client" in stolen.json()["error"], stolen.text
        bad = types.OptimStepRequest(adam_params=types.AdamParams(learning_rate=float("nan")), model_id=model_id,
                                     seq_id=1)
        assert post("optim_step", bad, MALLORY).status_code == 400   # refused, and its seq_id passes for nobody
        assert post("get_info", types.GetInfoRequest(model_id=model_id), MALLORY).status_code == 403
        assert post("retrieve_future", types.FutureRetrieveRequest(request_id=future["request_id"]),
                    MALLORY).status_code == 403
        heartbeat = types.SessionHeartbeatRequest(session_id=session)
        assert post("session_heartbeat", heartbeat, MALLORY).status_code == 403
        assert httpx.post(f"{srv.url}/sessions/{session}/finish", headers=MALLORY, json={}).status_code == 403
        assert post("create_model", create.model_copy(update={"model_seq_id": 1}), MALLORY).status_code == 403
        mine = post("optim_step", step).json()        # seq_id 1 is still the owner's
        result = httpx.post(f"{srv.url}/retrieve_future", headers=ALICE, timeout=60,
                            json={"request_id": mine["request_id"]}).json()
        assert "grad_norm:mean" in result["metrics"], result


def test_a_negative_stop_token_is_refused_naming_it(tiny_model_path, tmp_path):
    with Server(tiny_model_path, str(tmp_path)) as srv:
        request = types.SampleRequest(num_samples=1, prompt=types.ModelInput.from_ints([5, 6]),
                                      base_model=tiny_model_path,
                                      sampling_params=types.SamplingParams(max_tokens=2, stop=[-1]))
        answer = httpx.post(f"{srv.url}/asample", headers=ALICE,
                            json=request.model_dump(mode="json", exclude_none=True))
        assert answer.status_code == 400 and "stop=[-1]" in answer.json()["error"], answer.text
        assert settles(lambda: srv.service.budget.tokens == 0 and srv.service.budget.bytes == 0)


def test_the_sdk_waits_out_a_429_and_every_sample_comes_back(tiny_model_path, tmp_path):
    """The unmodified SDK against a queue that holds one sample request's tokens at a time: four concurrent
    requests (630 tokens each, 1,000 allowed) are refused 429 while another is queued, the SDK sends them again
    after Retry-After, and all four come back whole."""
    tinker = pytest.importorskip("tinker")

    with Server(tiny_model_path, str(tmp_path), max_sample_tokens=1000, max_queued_tokens=1000) as srv:
        service = tinker.ServiceClient(base_url=f"http://127.0.0.1:{srv.port}", api_key="tml-alice")
        try:
            sampler = service.create_sampling_client(base_model=tiny_model_path)
            params = types.SamplingParams(max_tokens=200, temperature=1.0, seed=1)
            futures = [sampler.sample(types.ModelInput.from_ints([5 + i] * 10), 3, params) for i in range(4)]
            results = [f.result(120) for f in futures]
        finally:
            service.close("success")
        assert [len(r.sequences) for r in results] == [3] * 4
        assert srv.service.budget.refused >= 1 and settles(lambda: srv.service.budget.tokens == 0)
