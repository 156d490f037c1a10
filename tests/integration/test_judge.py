"""LLM judges for real: an OpenAI-compatible HTTP server (FastAPI + uvicorn, in this process) backed by a tiny
model through grpoflow's own engine, the `openai` client against it, and the local judge role; then whole runs."""

import asyncio
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from grpoflow.config import load_config  # noqa: E402
from grpoflow.controller.judging import Judging  # noqa: E402
from grpoflow.controller.metrics import read_metrics  # noqa: E402
from grpoflow.engines.factory import build_engine  # noqa: E402
from grpoflow.models.attention import GROUPED_ATTENTION  # noqa: E402
from grpoflow.commands.run import train  # noqa: E402
from grpoflow.rewards.judge import JUDGE_COLUMN, JudgeStats, OpenAIJudge  # noqa: E402
from grpoflow.workers.judge import JudgeWorker  # noqa: E402

TINY = ["model.path=builtin:tiny-0.5m", "sft.steps=20", "data.prompts_per_step=4", "rollout.n=2",
        "rollout.max_new_tokens=4", "trainer.total_steps=2", "trainer.val_every=0", "trainer.log_every=1"]


class JudgeServer:
    """/v1/chat/completions in the OpenAI wire format. model "tiny": the tiny model's greedy reply (grpoflow's
    engine); "slow": sleeps 3 s first; "flaky": HTTP 500 on the first attempt of each prompt. Records what it served."""

    def __init__(self, model_path: str) -> None:
        self.worker = JudgeWorker(0, 1, model_path=model_path, max_new_tokens=6)
        self.replies: dict[str, str] = {}
        self.seen: set[str] = set()
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        app = FastAPI()
        app.post("/v1/chat/completions")(self.chat)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def chat(self, request: Request):
        body = await request.json()
        text, model = body["messages"][-1]["content"], body["model"]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if model == "slow":
                await asyncio.sleep(3.0)
            elif model == "flaky" and text not in self.seen:
                self.seen.add(text)
                return JSONResponse({"error": {"message": "overloaded", "type": "server_error"}}, status_code=500)
            await asyncio.sleep(0.05)  # so that concurrent requests overlap
            with self.lock:
                reply = self.worker.complete([text])[0]
            self.replies[text] = reply
            return {"id": "c1", "object": "chat.completion", "created": 0, "model": model,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        finally:
            self.in_flight -= 1

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def judge_model(tmp_path_factory):
    from grpoflow.models.tiny import save_tiny_model
    return save_tiny_model(tmp_path_factory.mktemp("judge") / "model", size="0.5m", seed=3)


@pytest.fixture(scope="module")
def server(judge_model):
    s = JudgeServer(judge_model)
    with s as url:
        s.url = url
        yield s


def client(url: str, model: str = "tiny", **kw) -> OpenAIJudge:
    opts = dict(model=model, api_key_env="NO_SUCH_KEY", max_concurrency=2, timeout_s=2.0, retries=1, max_tokens=6,
                temperature=0.0)
    return OpenAIJudge(url, **{**opts, **kw})


TEXTS = [f"Rate {a}+{b}={a + b}" for a, b in [(1, 2), (30, 4), (5, 55), (12, 9), (7, 70)]]


def test_url_judge_replies_are_the_served_model_replies_and_equal_the_local_judge(server, judge_model):
    stats = JudgeStats()
    replies = client(server.url).complete(TEXTS, stats)
    assert replies == [server.replies[t] for t in TEXTS] and all(isinstance(r, str) for r in replies)
    assert (stats.failed, stats.retries) == (0, 0)
    assert 1 < server.most_in_flight <= 2  # the calls overlap, never more than max_concurrency
    # the same model through the local judge role (one batched generate) replies the same, greedy; on a CPU its
    # engine decodes with grouped attention (training/precision.py's judge row), which replies as sdpa does
    local = JudgeWorker(0, 1, model_path=judge_model, max_new_tokens=6)
    assert local.complete(TEXTS) == replies
    assert local.engine.model.config._attn_implementation == GROUPED_ATTENTION  # type: ignore[attr-defined]
    local.engine = build_engine("hf", judge_model, local.tokenizer, dtype="float32")
    assert local.engine.model.config._attn_implementation == "sdpa"  # type: ignore[attr-defined]
    assert local.complete(TEXTS) == replies


def test_a_server_error_is_retried_and_a_slow_server_times_out_without_hanging(server):
    stats = JudgeStats()
    replies = client(server.url, "flaky").complete(TEXTS[:3], stats)
    assert all(r is not None for r in replies) and (stats.retries, stats.failed) == (3, 0)
    stats = JudgeStats()
    began = time.perf_counter()
    replies = client(server.url, "slow", timeout_s=0.3, retries=1, max_concurrency=3).complete(TEXTS[:3], stats)
    elapsed = time.perf_counter() - began
    assert replies == [None] * 3 and stats.timeouts == 6 and stats.retries == 3
    assert elapsed < 2.0  # 2 attempts x 0.3 s (+ backoff), all 3 at once: not the server's 3 s
    stats = JudgeStats()
    assert client("http://127.0.0.1:9/v1", retries=0).complete(TEXTS[:2], stats) == [None, None]  # nothing listens


def test_judging_scores_what_the_parser_reads_and_counts_the_rest(server, tmp_path):
    parser = tmp_path / "parse.py"
    parser.write_text("def length(text):\n    return float(len(text)) if len(text) % 2 == 0 else None\n")
    cfg = load_config(None, ["reward.function=judge", f"reward.judge.url={server.url}", "reward.judge.model=tiny",
                             f"reward.judge.parser={parser}:length", "reward.judge.max_score=null",
                             "reward.error_score=-5", "reward.judge.template='Rate {prompt} -> {completion}'"])
    rows = [{"answer": str(i)} for i in range(5)]
    out, counts = Judging(cfg.reward, None).rows([f"{i}+{i}=" for i in range(5)], ["x"] * 5, rows)
    served = [server.replies[f"Rate {i}+{i}= -> x"] for i in range(5)]
    assert [r[JUDGE_COLUMN] for r in out] == [float(len(s)) if len(s) % 2 == 0 else -5.0 for s in served]
    assert counts["reward/judge/unparsable"] == sum(len(s) % 2 for s in served) and counts["reward/judge/calls"] == 5
    assert JUDGE_COLUMN not in rows[0]  # the dataset's rows are not modified


@pytest.mark.parametrize("where", ["local", "url"])
def test_a_run_combines_the_judge_with_a_rule_reward(tmp_path, where, server, judge_model):
    judge = [f"reward.judge.path={judge_model}"] if where == "local" else \
        [f"reward.judge.url={server.url}", "reward.judge.model=tiny"]
    parser = tmp_path / "parse.py"  # the untrained judge writes no number: score its replies by length
    parser.write_text("def length(text):\n    return float(len(text))\n")
    train(load_config(None, [f"trainer.output_dir={tmp_path}/run", *TINY, "reward.functions=[exact_match, judge]",
                             "reward.weights=[1.0, 0.5]", "reward.judge.max_tokens=4", *judge,
                             f"reward.judge.parser={parser}:length", "reward.judge.max_score=null"]))
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and rows[-1]["reward/judge/calls"] == 8  # 4 prompts x 2 samples, every step
    for r in rows:  # score = exact_match + 0.5 x judge, per sample, so also in the means
        assert r["critic/score/mean"] == pytest.approx(r["reward/exact_match/mean"] + 0.5 * r["reward/judge/mean"])
        assert r["reward/judge/failed"] == 0
