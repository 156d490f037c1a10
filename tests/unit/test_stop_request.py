"""The stop request behind preemption: what each signal does, and that the previous handlers come back."""

import os
import signal
import threading

import pytest

from grpoflow.controller.preemption import stop_on_signals


def test_sigterm_and_a_first_sigint_only_request_a_stop_a_second_sigint_interrupts():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with stop_on_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)   # the process lives on: the handler only records it
        assert stop.requested and stop.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)   # a repeated SIGTERM changes nothing
        assert stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_first_sigint_requests_a_stop():
    with stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal_name == "SIGINT"


def test_outside_the_main_thread_nothing_is_installed():
    seen = {}

    def run():
        with stop_on_signals() as stop:
            seen["handler"] = signal.getsignal(signal.SIGTERM)
            seen["requested"] = stop.requested

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "requested": False}
