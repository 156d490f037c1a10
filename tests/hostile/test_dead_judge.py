"""Issue 36, finding 4 (judges): a run must not train on nothing because its judge is dead, a dead judge must not
cost minutes per step, and the judge's API key goes only where the user named it for (never OPENAI_API_KEY by
default)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")

from grpoflow.config import load_config  # noqa: E402
from grpoflow.controller.judging import JudgeFailure, Judging  # noqa: E402


class Judge:
    """An OpenAI-compatible /v1/chat/completions that answers every request with `status` (200: `reply`, or what
    a callable `reply` returns; a score of 7 by default); records each request's Authorization header."""

    def __init__(self, status: int, reply="7") -> None:
        self.status, self.keys, self.reply = status, [], reply
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                judge.keys.append(self.headers.get("Authorization"))
                ok = {"id": "c", "object": "chat.completion", "created": 0, "model": "judge",
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": judge.text()}}]}
                body = json.dumps(ok if judge.status == 200 else {"error": {"message": "the model is not loaded"}})
                self.send_response(judge.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def text(self) -> str:
        return self.reply() if callable(self.reply) else self.reply

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def judging(url: str, *extra: str) -> Judging:
    cfg = load_config(None, ["reward.function=judge", f"reward.judge.url={url}", "reward.judge.retries=1",
                             "reward.judge.max_concurrency=4", "reward.judge.timeout_s=5", *extra])
    return Judging(cfg.reward, None)


def test_a_dead_judge_stops_the_run_with_its_error_after_one_wave_of_calls(caplog):
    judge = Judge(503)
    try:
        with caplog.at_level(logging.WARNING, logger="grpoflow.judge"):
            with pytest.raises(JudgeFailure, match=r"every one of this step's 40 judgements failed: the judge at "
                                                   rf"{judge.url} failed: .*503.*the run stops"):
                judging(judge.url).rows(["p"] * 40, ["c"] * 40, [{} for _ in range(40)])
    finally:
        judge.close()
    # the circuit opened after max_concurrency=4 calls failed both attempts: not 40 x 2 requests
    assert len(judge.keys) <= 4 * 2 + 4, len(judge.keys)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings and judge.url in warnings[0] and "reward.judge.url" in warnings[0]


def test_the_judge_gets_a_key_only_from_the_variable_named_for_it(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-judge")
    judge = Judge(200)
    try:
        rows, _ = judging(judge.url).rows(["p"], ["c"], [{}])
        assert rows[0]["judge_score"] == 0.7
        judging(judge.url, "reward.judge.api_key_env=MY_JUDGE_KEY").rows(["p"], ["c"], [{}])
    finally:
        judge.close()
    assert judge.keys == ["Bearer EMPTY", "Bearer sk-judge"]


# Issue 53, finding 5: a 0-100 judge under the default max_score 10 answered `85` every time: every reply
# unparsable, scored reward.error_score, no warning, rc 0.
def test_a_step_whose_judge_replies_all_fail_to_parse_stops_the_run():
    judge = Judge(200, "85")
    try:
        with pytest.raises(JudgeFailure, match=r"every one of this step's 6 judge replies was unparsable: "
                                               r"reward.judge.parser='number' finds no number in \[0, "
                                               r"reward.judge.max_score=10\] in e.g. '85'; set "
                                               r"reward.judge.max_score to the judge's scale"):
            judging(judge.url).rows(["p"] * 6, ["c"] * 6, [{} for _ in range(6)])
    finally:
        judge.close()


def test_the_first_unparsable_reply_warns_with_the_reply_and_max_score(caplog):
    replies = iter(["7", "85", "3", "91"] * 3)
    lock = threading.Lock()

    def next_reply():
        with lock:
            return next(replies)

    judge = Judge(200, next_reply)
    try:
        with caplog.at_level(logging.WARNING, logger="grpoflow.judge"):
            run = judging(judge.url)
            rows, metrics = run.rows(["p"] * 4, ["c"] * 4, [{} for _ in range(4)])
            run.rows(["p"] * 4, ["c"] * 4, [{} for _ in range(4)])
    finally:
        judge.close()
    assert metrics["reward/judge/unparsable"] == 2.0
    warnings = [r.getMessage() for r in caplog.records if "unparsable" in r.getMessage()]
    assert len(warnings) == 1, warnings  # the first only
    assert ("reward.judge.max_score=10" in warnings[0] and ("'85'" in warnings[0] or "'91'" in warnings[0]))
