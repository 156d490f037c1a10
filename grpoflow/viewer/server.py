"""`grpoflow view RUN_DIR...`: a page on 127.0.0.1 with a run's curves, its rollouts and its facts.

A FastAPI app serves the page (static/), Plotly's own bundle from the `plotly` package (no CDN: the page works
with no network) and a few JSON routes over the run folders (watched_run.py); the page polls them, so it follows
a run that is training. Routes (`i` is the run's position on the command line):

    GET /api/runs                               [{id, name, path}]
    GET /api/runs/{i}/metrics?count=&generation=   metrics.jsonl records after the first `count`
    GET /api/runs/{i}/steps                     {train: [steps with training groups], val: [validation steps]}
    GET /api/runs/{i}/groups?kind=train|val&step=  the groups of a step, with their mean and spread
    GET /api/runs/{i}/facts                     config, schedule, checkpoints, restarts, files

Needs the `view` extra (fastapi, uvicorn, plotly): `pip install 'grpoflow[view]'`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Sequence

from grpoflow.errors import MissingExtraError, UserError
from grpoflow.local_http import LocalOnly
from grpoflow.viewer.watched_run import WatchedRun

STATIC = Path(__file__).parent / "static"
PAGES = {"index.html": "text/html", "app.js": "text/javascript", "curves.js": "text/javascript",
         "rollouts.js": "text/javascript", "facts.js": "text/javascript", "style.css": "text/css"}


class MissingViewExtraError(MissingExtraError):
    """fastapi, uvicorn or plotly is not installed."""


def require_view_extra() -> None:
    missing = [m for m in ("fastapi", "uvicorn", "plotly") if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingViewExtraError(f"grpoflow view needs {', '.join(missing)}: pip install 'grpoflow[view]' "
                                    f"(fastapi, uvicorn, plotly).")


def plotly_bundle() -> Path:
    """plotly.min.js as the `plotly` Python package ships it (plotly/package_data/)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise MissingViewExtraError("grpoflow view needs plotly: pip install 'grpoflow[view]'.")
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    if not path.exists():
        raise MissingViewExtraError(f"the installed plotly package has no {path}; reinstall it: "
                                    f"pip install --force-reinstall plotly")
    return path


def build_app(run_dirs: Sequence[str | Path], *, refresh_s: float = 2.0, host: str = "127.0.0.1",
              port: int | None = None) -> Any:
    """The FastAPI app over these run folders (each must exist; it may still be empty). It answers only requests
    whose Host header is `host` (or localhost) and `port` when given (local_http.LocalOnly: no DNS rebinding)."""
    require_view_extra()
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import FileResponse, JSONResponse, Response

    runs = [WatchedRun(d) for d in run_dirs]
    bundle = plotly_bundle()
    app = FastAPI(title="grpoflow view", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(LocalOnly, host=host, port=port)

    def run(i: int) -> WatchedRun:
        if not 0 <= i < len(runs):
            raise HTTPException(404, f"no run {i}: this viewer shows runs 0..{len(runs) - 1}")
        return runs[i]

    @app.get("/")
    def index() -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/plotly.min.js")
    def plotly_js() -> Response:
        return FileResponse(bundle, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in PAGES:
            raise HTTPException(404, f"no such file: {name}")
        return FileResponse(STATIC / name, media_type=PAGES[name], headers={"Cache-Control": "no-cache"})

    @app.get("/api/runs")
    def list_runs() -> JSONResponse:
        return JSONResponse({"refresh_s": refresh_s,
                             "runs": [{"id": i, "name": r.name, "path": str(r.path)} for i, r in enumerate(runs)]})

    @app.get("/api/runs/{i}/metrics")
    def metrics(i: int, count: int = 0, generation: int = -1) -> JSONResponse:
        file = run(i).metrics
        records, reset = file.since(count, generation)
        return JSONResponse({"records": records, "reset": reset, "generation": file.generation,
                             "count": len(file.records)})

    @app.get("/api/runs/{i}/steps")
    def steps(i: int) -> JSONResponse:
        return JSONResponse(run(i).rollout_steps())

    @app.get("/api/runs/{i}/groups")
    def groups(i: int, step: int, kind: str = "train") -> JSONResponse:
        try:
            return JSONResponse({"step": step, "kind": kind, "groups": run(i).groups(kind, step)})
        except ValueError as e:
            raise HTTPException(400, str(e)) from None

    @app.get("/api/runs/{i}/facts")
    def facts(i: int) -> JSONResponse:
        return JSONResponse(run(i).facts())

    return app


def serve(run_dirs: list[str], *, host: str = "127.0.0.1", port: int = 8765, refresh_s: float = 2.0) -> None:
    """Serve the page until Ctrl-C; prints its URL once the port is bound (port 0: any free port)."""
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); pass another --port (0: any free one).") \
            from None
    bound = sock.getsockname()[1]
    try:
        app = build_app(run_dirs, refresh_s=refresh_s, host=host, port=bound)
    except BaseException:
        sock.close()
        raise
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    print(f"grpoflow view: http://{host}:{bound}/  ({len(run_dirs)} run(s); Ctrl-C stops)", flush=True)
    server.run(sockets=[sock])
