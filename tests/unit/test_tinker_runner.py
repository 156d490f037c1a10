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


def test_clients_take_turns_and_a_dropped_clients_jobs_never_run():
    """Round-robin over clients: b's one job runs after a's first, not after all four of a's; c's queued jobs are
    dropped (its session ended) and never run."""
    import threading

    from grpoflow.tinker_server.futures import Runner

    async def main() -> list[str]:
        futures = Futures(asyncio.get_running_loop())
        runner = Runner(futures)
        order: list[str] = []
        release = threading.Event()

        def job(tag):
            def run(payloads):
                order.append(tag)
                return [Outcome()]
            return run

        runner.submit(Job(futures.new(), lambda _: [Outcome()] if release.wait(10) else [], client="hold"))
        await asyncio.sleep(0.05)                      # the runner is busy: everything below queues
        last = ""
        for client, count in (("a", 4), ("c", 3), ("b", 1)):
            for i in range(count):
                last = futures.new(client)
                runner.submit(Job(last, job(f"{client}{i}"), client=client))
        assert runner.drop("c") == 3
        release.set()
        for _ in range(100):
            if len(order) == 5:
                break
            await asyncio.sleep(0.02)
        return order
    assert asyncio.run(main()) == ["a0", "b0", "a1", "a2", "a3"]


def test_a_refused_seq_id_passes_through_the_gate_in_order():
    from grpoflow.tinker_server.futures import SeqGate

    released = []
    gate = SeqGate(lambda job: released.append(job.request_id))
    gate.offer(3, Job("three", lambda _: []))
    gate.skip(2)                 # refused before it was queued (a 404, a bad body)
    assert released == []        # 1 has not come yet
    gate.offer(1, Job("one", lambda _: []))
    assert released == ["one", "three"] and gate.next_seq == 4
    gate.skip(3)                 # a duplicate refusal changes nothing
    gate.offer(4, Job("four", lambda _: []))
    assert released == ["one", "three", "four"]


def test_results_are_kept_for_their_ttl_then_dropped():
    import time

    async def main():
        futures = Futures(asyncio.get_running_loop(), ttl_s=60.0)
        pending, done = futures.new("a"), futures.new("a")
        futures.resolve(done, Outcome(body=b"{}"))
        assert futures.expire(now=time.monotonic() + 30) == 0 and futures.known(done)
        assert futures.expire(now=time.monotonic() + 61) == 1 and not futures.known(done)
        assert futures.known(pending)    # work not finished yet is never expired
    asyncio.run(main())
