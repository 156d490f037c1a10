"""The HTTP routes the Tinker SDK calls (FastAPI), each a thin shell around `TinkerService`.

Request bodies are parsed into the SDK's own request types (JSON) or its protobuf schema (`forward_backward`);
responses are the SDK's response types. Every error answers in the SDK's `RequestFailedResponse` shape,
`{"error": <sentence>, "category": "user" | "server"}`: a request the server will not run 400 (413 for a body
over `tinker.max_request_mb`, 403 for another client's session or model), a route it does not have 404, a bug 500
(which the SDK retries). 4xx answers are final for the SDK, and a refused request still takes its place in its
training client's order (guard.py), so nothing retries or hangs; except 429 (the shared budget is full now:
budget.py) and 408 (a body that did not arrive in time), after which the SDK sends the same request again. Work
that fails after it was queued resolves its future to the same error shape, which the SDK raises as
`RequestFailedError`. Only local programs reach the server (local_http.LocalOnly: the Host header, JSON or
protobuf bodies only).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from tinker import types
from tinker.types.try_again_response import TryAgainResponse

from grpoflow.config import TinkerConfig
from grpoflow.errors import UserError
from grpoflow.local_http import LocalOnly
from grpoflow.tinker_server.budget import RETRY_AFTER_S, Busy
from grpoflow.tinker_server.guard import PROTOBUF, Caller, Guard
from grpoflow.tinker_server.service import NotYours, TinkerService, budget_of
from grpoflow.tinker_server.wire import decode_forward_backward

API = "/api/v1"
POLL_S = 25.0  # a retrieve_future waits this long for a result before answering try-again (the SDK waits 45 s)


def _error(status: int, message: str, category: str = "user") -> JSONResponse:
    return JSONResponse({"error": message, "category": category}, status_code=status)


def caller(request: Request) -> Caller:
    """The request's client and budget ticket, set by the guard."""
    return request.state.caller


def _json(model: Any) -> Response:
    return Response(model.model_dump_json(exclude_none=True), media_type="application/json")


async def _parse(request: Request, kind: Any) -> Any:
    try:
        return kind.model_validate(await request.json())
    except (ValidationError, ValueError) as e:
        raise UserError(f"{request.url.path}: the body is not a valid {kind.__name__} ({e}).".replace("\n", " ")
                        ) from None


def build_app(cfg: TinkerConfig, model_path: str, seed: int = 0) -> FastAPI:
    """The app; the service (models, futures, the worker thread) is made when the server starts."""
    state: dict[str, TinkerService] = {}
    budget = budget_of(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(this: FastAPI):
        state["service"] = this.state.service = TinkerService(cfg, model_path, seed, asyncio.get_running_loop(),
                                                              budget)
        janitor = asyncio.create_task(state["service"].janitor())
        yield
        janitor.cancel()

    app = FastAPI(title="grpoflow serve tinker", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def service() -> TinkerService:
        return state["service"]

    # the outermost runs first: LocalOnly (Host, body type), then Guard (key, body size, seq_ids of refusals)
    app.add_middleware(Guard, api_key=cfg.api_key, max_bytes=int(cfg.max_request_mb * 2**20),
                       body_timeout_s=cfg.body_timeout_s, budget=budget,
                       skip=lambda model_id, seq_id, client: service().skip(model_id, seq_id, client),
                       unblocks=lambda model_id, seq_id, client: service().unblocks(model_id, seq_id, client),
                       open_paths=(f"{API}/healthz",))
    app.add_middleware(LocalOnly, host=cfg.host, port=cfg.port, json_posts=True, body_types=(PROTOBUF,))

    @app.exception_handler(UserError)
    async def user_error(_: Request, e: UserError):
        return _error(400, str(e))

    @app.exception_handler(NotYours)
    async def not_yours(_: Request, e: NotYours):
        return _error(403, str(e))

    @app.exception_handler(Busy)
    async def busy(_: Request, e: Busy):  # the SDK waits and sends the request again
        answer = _error(429, str(e))
        answer.headers["Retry-After"] = str(RETRY_AFTER_S)
        return answer

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):  # 405 and the like, in the SDK's error shape
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        return _error(400, f"{request.url.path}: the request is not valid ({e.errors()}).")

    @app.exception_handler(404)
    async def not_found(request: Request, _: Exception):
        return _error(404, f"grpoflow serve tinker has no {request.method} {request.url.path}: that part of the "
                           "Tinker API is not supported here (docs/tinker.md lists what is).")

    _service_routes(app, service)
    _training_routes(app, service)
    _sampling_routes(app, service)
    return app


def _service_routes(app: FastAPI, service: Callable[[], TinkerService]) -> None:
    @app.get(f"{API}/healthz")
    async def healthz():
        return _json(types.HealthResponse(status="ok"))

    @app.post(f"{API}/client/config")
    async def client_config():
        # API keys (no JWT exchange), plain httpx, JSON futures polled one by one, custom losses run in the SDK
        return _json(types.ClientConfigResponse(pjwt_auth_enabled=False, use_pyqwest_transport=False,
                                                proto_compress_fwdbwd=False, sample_use_retrieve_futures=False,
                                                custom_loss_server_side=False, sample_join_sampling_session=False))

    @app.post(f"{API}/client/dynamic_config")
    async def dynamic_config():
        return _json(types.ClientDynamicConfigResponse(sample_cancel_enabled=False))

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities():
        return _json(await asyncio.to_thread(service().capabilities))  # may build or convert a base model once

    @app.post(f"{API}/create_session")
    async def create_session(request: Request):
        await _parse(request, types.CreateSessionRequest)
        return _json(service().create_session(caller(request).client))

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat(request: Request):
        req = await _parse(request, types.SessionHeartbeatRequest)
        if not service().heartbeat(req.session_id, caller(request).client):  # 410: the SDK stops its heartbeat loop
            return _error(410, f"session {req.session_id} has ended (finished, or no heartbeat for "
                               f"{service().cfg.session_timeout_s:g} s); its models and futures are freed.")
        return _json(types.SessionHeartbeatResponse())

    @app.post(f"{API}/sessions/{{session_id}}/finish")
    async def finish(session_id: str, request: Request):
        service().own(session_id, caller(request).client)
        service().end_session(session_id, "finished")
        return JSONResponse(None)

    @app.post(f"{API}/telemetry")
    async def telemetry():
        return _json(types.TelemetryResponse(status="accepted"))

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request):
        req = await _parse(request, types.FutureRetrieveRequest)
        futures = service().futures
        owner = futures.owner(req.request_id)
        if owner is not None:
            service().own(owner, caller(request).client, adopt=False)
        if owner:
            service().touch(owner)  # a client polling for its result is alive, heartbeat or not
        if owner is None:
            return _error(404, f"unknown request id {req.request_id}: this server did not issue it, was restarted "
                               "since, or dropped it (its session ended, or its result waited unread longer than "
                               "tinker.future_ttl_s); send the request again.")
        outcome = await futures.wait(req.request_id, POLL_S)
        if outcome is None:
            return Response(TryAgainResponse(request_id=req.request_id, queue_state="active").model_dump_json(),
                            status_code=408, media_type="application/json")
        if outcome.error is not None:
            category = types.RequestErrorCategory(outcome.category)
            return _json(types.RequestFailedResponse(error=outcome.error, category=category))
        return Response(outcome.body, media_type=outcome.media_type)

    @app.post(f"{API}/cancel_future")
    async def cancel_future():
        return JSONResponse(None)  # work already queued runs to the end; its result is simply never fetched


def _training_routes(app: FastAPI, service: Callable[[], TinkerService]) -> None:
    @app.post(f"{API}/create_model")
    async def create_model(request: Request):
        return _json(service().create_model(await _parse(request, types.CreateModelRequest), caller(request)))

    @app.post(f"{API}/get_info")
    async def get_info(request: Request):
        return _json(service().get_info((await _parse(request, types.GetInfoRequest)).model_id, caller(request).client))

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request):
        body = await request.body()  # decompressed by the guard
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise UserError("forward_backward takes the SDK's protobuf ForwardBackwardRequest "
                            f"(Content-Type: {PROTOBUF}).")
        try:
            call = decode_forward_backward(body)
        except Exception as e:  # protobuf's DecodeError, or a datum the decoder refuses
            raise UserError(f"the forward_backward body is not a ForwardBackwardRequest ({e}).") from None
        return _json(service().forward_backward(call, caller(request)))

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request):
        return _json(service().optim_step(await _parse(request, types.OptimStepRequest), caller(request)))

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request):
        return _json(service().save_weights(await _parse(request, types.SaveWeightsRequest), caller(request)))

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request):
        return _json(service().load_weights(await _parse(request, types.LoadWeightsRequest), caller(request)))

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        req = await _parse(request, types.SaveWeightsForSamplerRequest)
        return _json(service().save_for_sampler(req, caller(request)))


def _sampling_routes(app: FastAPI, service: Callable[[], TinkerService]) -> None:
    @app.post(f"{API}/create_sampling_session")
    async def create_sampling_session(request: Request):
        req = await _parse(request, types.CreateSamplingSessionRequest)
        return _json(await asyncio.to_thread(service().create_sampling_session, req,  # may build a base model
                                             caller(request).client))

    @app.post(f"{API}/join_sampling_session")
    async def join(request: Request):
        req = await _parse(request, types.JoinSamplingSessionRequest)
        return _json(service().join(req.sampling_session_id, caller(request).client))

    @app.get(f"{API}/samplers/{{session_id}}")
    async def sampler(session_id: str, request: Request):
        return _json(service().sampler_info(session_id, caller(request).client))

    @app.post(f"{API}/asample")
    async def asample(request: Request):
        return _json(service().asample(await _parse(request, types.SampleRequest), caller(request)))
