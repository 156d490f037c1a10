"""The tinker server's runner: a bad-input error from anywhere in grpoflow reaches the client as a user error,
anything else as a server error (whose traceback goes to the log)."""

import asyncio

from grpoflow.errors import UserError, UserFileNotFoundError
from grpoflow.tinker_server.futures import Futures, Job, Outcome, Runner


def outcome_of(run) -> Outcome:
    async def main() -> Outcome:
        futures = Futures(asyncio.get_running_loop())
        runner = Runner(futures)
        request_id = futures.new()
        runner.submit(Job(request_id, run))
        outcome = await futures.wait(request_id, timeout=10.0)
        assert outcome is not None
        return outcome
    return asyncio.run(main())


def raises(error: Exception):
    def run(payloads):
        raise error
    return run


def test_a_grpoflow_user_error_is_the_clients_fault():
    # raised by code outside the server (a model folder check, a config value) it is still the user's to fix
    outcome = outcome_of(raises(UserFileNotFoundError("no model at /x: give a folder with config.json")))
    assert (outcome.category, outcome.error) == ("user", "no model at /x: give a folder with config.json")
    assert outcome_of(raises(UserError("bad seq_id"))).category == "user"


def test_a_bug_is_a_server_error_that_names_its_type():
    outcome = outcome_of(raises(KeyError("weights")))
    assert outcome.category == "server" and outcome.error == "KeyError: 'weights'"


def test_a_job_that_returns_gets_its_outcome():
    assert outcome_of(lambda payloads: [Outcome(body=b"{}")]).body == b"{}"
