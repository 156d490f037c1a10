"""Findings 8 and 9: the agent endpoint. An agent cannot name its neighbour's episode, and a request that is
too big, too deep or too long is refused with an OpenAI-shaped error before it costs the trainer anything,
while rendering a big one does not stall the other episodes. All on 127.0.0.1, with bounded request counts."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.engines.protocol import Completion, EngineAbilities
from scripted import serving


class EchoEngine:
    """A StepEngine that replies "ok" + the end-of-turn token to every request; counts the prompt tokens it was
    sent."""
    version = 0
    abilities = EngineAbilities(stepping=True)

    def __init__(self, tok):
        self.tok, self.end_id, self.prompt_tokens, self.admitted = tok, None, 0, []

    @property
    def busy(self):
        return bool(self.admitted)

    def admit(self, requests):
        self.prompt_tokens += sum(len(q.prompt_ids) for _, q in requests)
        self.admitted += requests

    def tick(self, version):
        admitted, self.admitted = self.admitted, []
        ids = self.tok.encode("ok", add_special_tokens=False) + [self.end_id]
        return [(rid, Completion(ids, [0.0] * len(ids), [version] * len(ids), "stop")) for rid, _ in admitted]


@pytest.fixture
def served():
    tok = build_char_tokenizer()
    engine = EchoEngine(tok)
    with serving(engine, tok, max_prompt_tokens=2000) as endpoint:
        yield endpoint, engine


def open_episodes(endpoint, count):
    return endpoint.sessions.open(endpoint, episodes=count, budget=50, n=count, seed=1, index=44)


def post(endpoint, episode, body, timeout=30.0):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{endpoint.url}/chat/completions", content=data, timeout=timeout,
                      headers={"X-Episode-Id": episode, "Content-Type": "application/json"})


def chat(text):
    return {"model": "policy", "messages": [{"role": "user", "content": text}]}


def assert_openai_error(response, status, code=None):
    assert response.status_code == status, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error


# ---------------------------------------------------------------- finding 8: guessable episode ids


def test_an_agent_cannot_call_into_its_neighbours_episode(served):
    endpoint, _ = served
    mine, neighbour = open_episodes(endpoint, 2)
    try:
        guesses = {mine.replace("-e0", "-e1"), mine.rsplit("-", 1)[0].replace("-e0", "-e1"), "s1-p44-e1"}
        for guess in sorted(guesses - {mine}):
            assert_openai_error(post(endpoint, guess, chat("hi")), 404, "episode_not_found")
    finally:
        records = endpoint.close_session()
    assert records[neighbour].calls == 0, "calls were injected into the neighbour's episode"
    assert len(mine) - len("s1-p44-e0-") >= 20  # at least 120 bits of secret


# ---------------------------------------------------------------- finding 9: sizes, depth, rendering, the cache


def test_a_body_over_the_limit_is_refused_with_413(served):
    endpoint, engine = served
    (episode,) = open_episodes(endpoint, 1)
    try:
        assert_openai_error(post(endpoint, episode, chat("x" * (5 * 2**20))), 413)
    finally:
        endpoint.close_session()
    assert engine.prompt_tokens == 0


def test_deeply_nested_json_is_a_400_not_a_500(served):
    endpoint, _ = served
    (episode,) = open_episodes(endpoint, 1)
    try:
        assert_openai_error(post(endpoint, episode, "[" * 200_000 + "]" * 200_000), 400)
    finally:
        endpoint.close_session()


def test_a_prompt_over_the_limit_never_reaches_the_engine(served):
    endpoint, engine = served
    (episode,) = open_episodes(endpoint, 1)
    try:
        assert_openai_error(post(endpoint, episode, chat("y" * 5000)), 400, "context_length_exceeded")
        assert post(endpoint, episode, chat("short")).status_code == 200  # the episode goes on
    finally:
        endpoint.close_session()
    assert engine.prompt_tokens < 2000


def test_rendering_a_huge_request_does_not_stall_the_event_loop(served):
    endpoint, _ = served
    (big, small) = open_episodes(endpoint, 2)
    answered = {}

    def send_big():
        answered["big"] = post(endpoint, big, chat("z" * (3 * 2**20)), timeout=120).status_code

    try:
        thread = threading.Thread(target=send_big)
        thread.start()
        time.sleep(0.5)  # the big body is uploaded and being rendered
        start = time.monotonic()
        models = httpx.get(f"{endpoint.url}/models", timeout=30)
        waited = time.monotonic() - start
        thread.join(120)
    finally:
        endpoint.close_session()
    assert models.status_code == 200 and waited < 1.0, f"/v1/models waited {waited:.1f} s behind a render"
    assert answered["big"] == 400  # refused as too long, after rendering off the loop


def test_the_renderer_cache_is_bounded(served):
    endpoint, _ = served
    for k in range(100):
        tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": "d",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        endpoint.renderer_for(tools)
    assert len(endpoint._renderers) <= 32


# ---------------------------------------------------------------- issue 36: surrogates and stalled clients


def test_a_lone_surrogate_is_a_json_400_not_a_plain_500(served):
    endpoint, engine = served
    (episode,) = open_episodes(endpoint, 1)
    try:
        body = '{"model": "policy", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
        assert_openai_error(post(endpoint, episode, body), 400)
        assert post(endpoint, episode, chat("fine")).status_code == 200  # the episode goes on
    finally:
        endpoint.close_session()


def test_a_stalled_client_gets_a_408_and_its_half_body_is_dropped():
    import socket

    tok = build_char_tokenizer()
    with serving(EchoEngine(tok), tok, body_timeout_s=0.5) as endpoint:
        host, port = endpoint.url.split("//")[1].split("/")[0].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"model\": ")  # then nothing more
            start, reply = time.monotonic(), ""
            while "request_timeout" not in reply and time.monotonic() - start < 10:  # headers and body may come apart
                chunk = s.recv(65536).decode()
                if not chunk:
                    break
                reply += chunk
        assert time.monotonic() - start < 10
        assert reply.startswith("HTTP/1.1 408") and '"code":"request_timeout"' in reply.replace(" ", ""), reply


def test_clients_that_disconnect_are_quiet_and_close_is_prompt(capfd):
    """Issue 53 item 7: an agent that disconnects mid-body, or while its call waits for the engine, printed a
    traceback per call, and close() then waited 10 s for the call the engine never answered. Now nothing is
    printed and close() returns at once, a third client still sending its body included."""
    import concurrent.futures
    import socket

    from grpoflow.engines.protocol import SamplingParams
    from grpoflow.trajectories.endpoint import Endpoint

    endpoint = Endpoint(build_char_tokenizer(), max_calls=4).start()
    never = []                                          # the engine never answers

    def submit(episode, request):
        never.append(concurrent.futures.Future())
        return never[-1]
    episode, = endpoint.open_session(seed=1, params=SamplingParams(n=1, max_new_tokens=20), episodes=[(0, 1, 0)],
                                     submit=submit)
    port = int(endpoint.url.rsplit(":", 1)[1].split("/")[0])
    body = json.dumps(chat("hi")).encode()

    def send(data: bytes, declared: int) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"X-Episode-Id: {episode}\r\nContent-Length: {declared}\r\n\r\n".encode() + data)
        return conn
    send(body[:10], 1000).close()                       # gone mid-body
    waiting = send(body, len(body))                     # its call reaches the engine, then it goes
    for _ in range(200):
        if never:
            break
        time.sleep(0.01)
    assert never
    waiting.close()
    stalled = send(body[:10], 1000)                     # still sending when the endpoint closes
    time.sleep(0.3)
    endpoint.close_session()
    started = time.monotonic()
    endpoint.close()
    assert time.monotonic() - started < 2
    stalled.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "ClientDisconnect" not in out + err, (out + err)[-2000:]
