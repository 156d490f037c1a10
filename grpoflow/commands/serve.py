"""`grpoflow serve tinker [recipe.yaml] [key=value ...]`: run the Tinker API server until Ctrl-C."""

from __future__ import annotations

import logging

from grpoflow.config import Config
from grpoflow.errors import MissingExtraError
from grpoflow.local_http import WILDCARDS


def _require_extras() -> None:
    missing = []
    for module in ("tinker", "fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingExtraError(f"grpoflow serve tinker needs {missing}: pip install 'grpoflow[tinker]'.")


def serve_tinker(cfg: Config) -> None:
    """Serve `cfg.tinker` on its host and port; `model.path` is the default base model."""
    _require_extras()
    import uvicorn

    from grpoflow.tinker_server.app import build_app

    t = cfg.tinker
    logging.getLogger("grpoflow.tinker").setLevel(logging.INFO)
    names = [n for n in (t.model_name, cfg.model.path) if n]
    # the key itself is never printed: a console is often logged or shared
    key = "the key given as tinker.api_key" if t.api_key else "any key with the SDK's tml- prefix, e.g. tml-local"
    print(f"grpoflow serve tinker: http://{t.host}:{t.port}  (TINKER_BASE_URL=http://{t.host}:{t.port}; "
          f"TINKER_API_KEY: {key})\n  base models: {names}, or any local folder / .gguf / builtin:tiny-<size>\n"
          f"  states in {t.root}", flush=True)
    if t.host in WILDCARDS:
        print(f"  tinker.host={t.host}: reachable from other machines, Host header not checked", flush=True)
    uvicorn.run(build_app(t, cfg.model.path, seed=cfg.trainer.seed), host=t.host, port=t.port, log_level="warning")
