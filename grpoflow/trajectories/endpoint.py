"""An OpenAI-compatible endpoint in front of the rollout engines, so that unmodified agent programs can be
trained (docs/agents.md).

`Endpoint(generate, tokenizer)` serves `/v1/chat/completions` and `/v1/models` with FastAPI on uvicorn, on
127.0.0.1 and a free port, from a daemon thread of the controller. Agents reach it during a *session*
(`open_session` ... `close_session`: a step's episodes, or a validation's): each request names its
episode (header `X-Episode-Id`, or the `user` field) and is

1. checked and rendered: the messages become template messages (openai_api.py) and prompt ids through
   the chat template (`ChatRenderer`, whose prefix-preserving check ran once at start);
2. placed in its episode's samples (episode.py: it continues a sample token for token, or starts one)
   and sent to the request batcher as it arrives (engines/batcher.py: it joins the running decode batch;
   the episode's earlier KV cache is reused), with the session's temperature / top-p, the template's
   end-of-turn token as stop token, and at most the sample's remaining budget;
3. recorded (prompt ids, sampled ids, their log-probs, the policy version) and answered: the reply text,
   tool calls parsed from it (its `tool_format`), finish_reason stop / length / tool_calls, usage; a request
   with `stream: true` gets the same reply as server-sent chunks once it is generated (openai_api.stream_events).

Call t of episode j of the prompt with dataset index i draws from `turns.stream_seed(seed, i, n, j, t)`, the
stream of turn t of trajectory j in the environment loop, so an agent and the same episode written as an
environment give the same samples for the same seed, whatever the batching. An engine failure answers
500 to the call and is kept as `failure`, which the caller raises: a broken engine is not an agent's error.
"""


import asyncio
import concurrent.futures
import contextlib
import json
import logging
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoflow.data.tool_format import HERMES, ToolFormat
from grpoflow.trajectories.chat import ChatRenderer, TemplateError
from grpoflow.trajectories.endpoint_limits import (BODY_TIMEOUT_S, MAX_BODY_BYTES, RendererCache, check_prompt_length,
                                                read_json_body)
from grpoflow.trajectories.episode import EpisodeRecord, Placement
from grpoflow.trajectories.openai_api import (APIError, ChatRequest, Reply, completion_body, model_object, models_body,
                                           parse_request, stream_events)
from grpoflow.trajectories.turns import TurnStop, count_engine_work, read_turn, stream_seed
from grpoflow.engines.batcher import EngineFailure
from grpoflow.engines.protocol import Completion, Request, SamplingParams

Submit = Callable[[str, Request], "concurrent.futures.Future[Completion]"]  # (episode, request) -> its completion

log = logging.getLogger("grpoflow.endpoint")


@dataclass
class Session:
    """The episodes the endpoint serves now, and how their calls are sampled."""
    seed: int | None
    params: SamplingParams                       # temperature, top_p (n and max_new_tokens are per call)
    episodes: dict[str, EpisodeRecord]
    streams: dict[str, tuple[int, int, int]]     # episode id -> (dataset index, group size n, episode number)
    submit: Submit                               # thread-safe: the request batcher's generate for an episode
    finish: Callable[[str], None]                # thread-safe: the episode's agent is done
    open: set[str] = field(default_factory=set)  # episodes whose agent still runs


class Endpoint:
    def __init__(self, tokenizer: Any, *, model_name: str = "policy", tool_format: ToolFormat = HERMES,
                 max_calls: int = 4, max_prompt_tokens: int = 32768, max_body_bytes: int = MAX_BODY_BYTES,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        """`max_calls`: calls per episode (rollout.multi_turn.max_turns); more are refused (400); `max_prompt_tokens`,
        `max_body_bytes`, `body_timeout_s`: the request limits of endpoint_limits.py; `tool_format`: how tool calls
        are read from replies and written from an agent's messages (rollout.multi_turn.tool_parser). Sessions bring
        the engine (`open_session(submit=...)`)."""
        self.tokenizer, self.model_name = tokenizer, model_name
        self.tool_format, self.max_calls = tool_format, max_calls
        self.renderer = ChatRenderer(tokenizer)  # checks the template once
        self._renderers: RendererCache[ChatRenderer] = RendererCache()
        self.max_prompt_tokens, self.max_body_bytes = max_prompt_tokens, max_body_bytes
        self.body_timeout_s = body_timeout_s
        self._lock = threading.Lock()            # guards the session, shared by the server and the controller
        self._session: Session | None = None
        self._sessions = 0
        self.failure: BaseException | None = None  # the engine's error during the session
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, with `_stopping` (set by close)
        self._stopping: asyncio.Event | None = None
        self.url = ""

    # ------------------------------------------------------------ lifecycle (controller thread)

    def start(self, timeout_s: float = 30.0) -> "Endpoint":
        """Serve on 127.0.0.1 and a free port; `url` is then the base URL (http://127.0.0.1:PORT/v1)."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self), log_level="warning", access_log=False, lifespan="on",
                                timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="grpoflow-endpoint")
        self._thread.start()
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive() or waited > timeout_s:
                raise RuntimeError(f"the agent endpoint did not start on 127.0.0.1:{port} within {timeout_s:.0f} s.")
            threading.Event().wait(0.01)
            waited += 0.01
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    def close(self) -> None:
        """Stop serving now: calls still waiting for a body or for the engine (their agent gone, or their session
        over) are answered 503 at once, so uvicorn's shutdown has nothing to wait for."""
        if self._server is not None and self._thread is not None:
            if self._loop is not None and self._stopping is not None:
                self._loop.call_soon_threadsafe(self._stopping.set)
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    async def until_closed(self, work: Any, cancel: bool = True) -> Any:
        """`await work`, unless the endpoint closes first: then APIError 503 (and `work` is cancelled if
        `cancel`; an engine call is left to finish on its own loop)."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping.wait()) if self._stopping is not None else None
        try:
            await asyncio.wait([t for t in (task, stopping) if t is not None], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stopping is not None:
                stopping.cancel()
        if task.done():
            return task.result()
        if cancel:
            task.cancel()
        else:
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its outcome is not wanted now
        raise APIError(503, "the endpoint is closing: this call's session is over.", type="server_error",
                       code="shutting_down")

    def __enter__(self) -> "Endpoint":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open_session(self, *, seed: int | None, params: SamplingParams, episodes: list[tuple[int, int, int]],
                     submit: Submit, finish: Callable[[str], None] = lambda episode: None) -> list[str]:
        """Serve episodes (dataset index i, group size n, episode number j), each sample's response at most
        `params.max_new_tokens`, their calls sampled by `submit(episode, request)`; `finish(episode)` is called
        when an episode's agent is done. Returns their ids (unique across sessions)."""
        with self._lock:
            if self._session is not None:
                raise RuntimeError("open_session while another session is open.")
            self._sessions += 1
            # readable, plus a secret: an agent cannot name (and so join) another agent's episode
            ids = [f"s{self._sessions}-p{i}-e{j}-{secrets.token_urlsafe(16)}" for i, _, j in episodes]
            self._session = Session(seed, params, {e: EpisodeRecord(params.max_new_tokens) for e in ids},
                                    dict(zip(ids, episodes)), submit, finish, set(ids))
            self.failure = None
        return ids

    def close_episode(self, episode: str) -> None:
        """The agent of `episode` finished: its later calls are refused."""
        with self._lock:
            session = self._session
            if session is not None and episode in session.episodes:
                session.episodes[episode].closed = True
                session.open.discard(episode)
        if session is not None:
            session.finish(episode)

    def close_session(self) -> dict[str, EpisodeRecord]:
        """End the session; every episode's record."""
        with self._lock:
            session, self._session = self._session, None
        if session is None:
            raise RuntimeError("close_session without an open session.")
        for record in session.episodes.values():
            record.closed = True
        return session.episodes

    # ------------------------------------------------------------ requests (server thread)

    def renderer_for(self, tools: list[dict] | None) -> ChatRenderer:
        if not tools:
            return self.renderer

        def build() -> ChatRenderer:
            try:
                return ChatRenderer(self.tokenizer, tools)
            except TemplateError as e:
                raise APIError(400, f"the chat template cannot render these tools: {e}", param="tools") from None
        return self._renderers.get(json.dumps(tools, sort_keys=True), build)

    async def chat(self, body: Any, episode: str | None) -> dict[str, Any] | list[str]:
        """One chat completion for `episode`: its JSON object, or its server-sent events when it asked to stream."""
        if not episode:
            raise APIError(400, "name the episode: send the X-Episode-Id header (the client grpoflow gives the agent "
                                "does) or the `user` field.", param="user", code="missing_episode_id")
        with self._lock:
            session = self._session
            record = session.episodes.get(episode) if session is not None else None
            if record is None or record.closed:
                raise APIError(404, f"episode {episode!r} is not running (it ended, timed out, or belongs to another "
                                    "step).", param="user", code="episode_not_found")
            request = parse_request(body, model_name=self.model_name, raw_text=dict(record.raw_text),
                                    tool_names=dict(record.tool_names), tool_format=self.tool_format)
        assert session is not None
        renderer = self.renderer_for(request.tools)
        try:  # in a thread: a huge conversation must not stall the other episodes' calls on this event loop
            prompt_ids = await asyncio.to_thread(renderer.prompt_ids, request.messages)
        except TemplateError as e:
            raise APIError(400, str(e), param="messages") from None
        check_prompt_length(prompt_ids, self.max_prompt_tokens)
        with self._lock:
            if record.calls >= self.max_calls:
                raise APIError(400, f"episode {episode!r} made its {self.max_calls} calls "
                                    "(rollout.multi_turn.max_turns); end the episode or raise "
                                    "rollout.multi_turn.max_turns.", code="max_turns_exceeded")
            turn, record.calls = record.calls, record.calls + 1
            placement = record.place(prompt_ids)
            index, n, number = session.streams[episode]
        limit = min(request.max_tokens or placement.left, placement.left)
        job = Request(tuple(prompt_ids), limit, stream_seed(session.seed, index, n, number, turn),
                      (self.renderer.turn.end_token_id,), session.params.temperature, session.params.top_p)
        try:
            completion = await self.until_closed(asyncio.wrap_future(session.submit(episode, job)), cancel=False)
        except APIError:
            with self._lock:
                record.release(placement)
            raise
        except Exception as e:  # the engine's failure: the caller raises it after the session
            cause = e.__cause__ if isinstance(e, EngineFailure) and isinstance(e.__cause__, Exception) else e
            log.warning("the rollout engine failed on an agent call: %s: %s", type(cause).__name__, cause)
            self.failure = cause
            with self._lock:
                record.release(placement)
            raise APIError(500, f"the rollout engine failed: {type(cause).__name__}: {cause}", type="server_error",
                           code="engine_error") from None
        try:
            reply = self._answer(episode, record, request, prompt_ids, turn, placement, limit, completion)
        except Exception as e:  # a reply that cannot be read back: the call fails
            log.exception("reading the engine's reply to an agent call failed")
            self.failure = e
            raise APIError(500, f"reading the engine's reply failed: {e}", type="server_error",
                           code="engine_error") from None
        body = completion_body(reply, model_name=self.model_name, logprobs=request.logprobs)
        return stream_events(body, include_usage=request.include_usage) if request.stream else body

    def _answer(self, episode: str, record: EpisodeRecord, request: ChatRequest, prompt_ids: list[int], turn: int,
                placement: Placement, limit: int, out: Completion) -> Reply:
        """Record the engine's completion of a call and the reply to send."""
        ids, log_probs = out.ids[:limit], out.log_probs[:limit]
        cut = out.truncated
        stopped_on = cut_at_stop(ids, request.stop, self.renderer) if request.stop else None
        if stopped_on is not None:
            ids, log_probs, cut = ids[:stopped_on[0]], log_probs[:stopped_on[0]], False
        stop = read_turn(ids, cut=cut, end_of_turn=self.renderer.turn.end_token_id, eos=self.tokenizer.eos_token_id)
        truncated = stop is TurnStop.CUT or (stopped_on is None and stop is TurnStop.OPEN)
        text = stopped_on[1] if stopped_on is not None else self.renderer.decode(ids)
        calls = self.tool_format.parse(text) if request.parse_tools else None
        version = min(out.versions, default=0)
        with self._lock:
            call_ids = [f"call_{episode}_{turn}_{k}" for k in range(len(calls.calls) if calls else 0)]
            if record.closed:  # the agent is gone: nothing to record
                record.release(placement)
            else:
                for i, c in zip(call_ids, calls.calls if calls else []):
                    record.raw_text[i], record.tool_names[i] = text, c.name
                messages = request.messages + [{"role": "assistant", "content": text}]
                t = record.record(placement, prompt_ids, messages, ids, log_probs, version,
                                  out_of_budget=truncated and len(ids) >= placement.left,
                                  tool_calls=len(calls.calls) + len(calls.errors) if calls else 0,
                                  tool_errors=len(calls.errors) if calls else 0)
                count_engine_work(t, out, len(prompt_ids))
        finish = "length" if truncated else "tool_calls" if calls is not None and calls.calls else "stop"
        return Reply(text, finish, len(prompt_ids),
                     [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids] if request.logprobs else [],
                     log_probs, calls, (self.tool_format.strip(text) or None) if calls else None, call_ids)


def cut_at_stop(ids: list[int], stops: list[str], renderer: ChatRenderer) -> tuple[int, str] | None:
    """(how many ids to keep, the reply text) when the text of `ids` contains a stop string: the ids up to the one
    that completes the first stop string found, and the text before it; None when none occurs."""
    for k in range(1, len(ids) + 1):
        text = renderer.decode(ids[:k])
        found = [text.find(s) for s in stops if s in text]
        if found:
            return k, text[:min(found)]
    return None


def build_app(endpoint: Endpoint) -> Any:
    """The FastAPI app: routes, and every error as OpenAI's error JSON."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    @contextlib.asynccontextmanager
    async def lifespan(_: Any):
        endpoint._loop, endpoint._stopping = asyncio.get_running_loop(), asyncio.Event()
        yield

    app = FastAPI(title="grpoflow agent endpoint", lifespan=lifespan)

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "not_found" if e.status_code == 404 else "method_not_allowed" if e.status_code == 405 else None
        message = f"no route {request.method} {request.url.path}" if kind else str(e.detail)
        return error(APIError(e.status_code, message, code=kind))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return error(APIError(400, f"invalid request: {e.errors()}"))

    @app.get("/v1/models")
    async def models() -> dict:
        return models_body(endpoint.model_name)

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict:
        if model != endpoint.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this endpoint serves `{endpoint.model_name}`.",
                           param="model", code="model_not_found")
        return model_object(model)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await endpoint.until_closed(read_json_body(request, endpoint.max_body_bytes, endpoint.body_timeout_s))
        user = body.get("user") if isinstance(body, dict) else None
        reply = await endpoint.chat(body, request.headers.get("x-episode-id") or user)
        return StreamingResponse(iter(reply), media_type="text/event-stream") if isinstance(reply, list) else reply

    return app
