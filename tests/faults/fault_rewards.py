"""Reward functions for the fault runs, loaded by path (`reward.function=<this file>:<name>`)."""

import math
import os
import time
from pathlib import Path

from grpoflow.rewards.functions import exact_match


def slow_exact_match(prompt, completion, **row):
    """exact_match after GRPOFLOW_FAULTS_REWARD_SLEEP seconds: a step long enough to signal or kill inside it.
    The sleep changes no result, so runs with and without it are comparable. With GRPOFLOW_FAULTS_BUSY_DIR,
    a file named after the process id marks that this process is inside a call."""
    busy = os.environ.get("GRPOFLOW_FAULTS_BUSY_DIR")
    marker = Path(busy) / str(os.getpid()) if busy else None
    if marker:
        marker.touch()
    time.sleep(float(os.environ.get("GRPOFLOW_FAULTS_REWARD_SLEEP", "0")))
    if marker:
        marker.unlink()
    return exact_match(prompt, completion, **row)


def not_finite(prompt, completion, **row):
    """NaN or inf: a reward that cannot be a score."""
    return math.nan if len(completion) % 2 else math.inf


def huge(prompt, completion, **row):
    """Finite but near float32's limit (3.4e38), varying within a group: without std-normalised advantages
    the policy loss overflows to inf."""
    return 1e38 * len(completion)


def slow_length(prompt, completion, **row):
    """The completion's length after GRPOFLOW_FAULTS_REWARD_SLEEP seconds: a reward that varies within a group
    (a real update on a barely trained model), slowed so a Ray node can be removed inside a step."""
    time.sleep(float(os.environ.get("GRPOFLOW_FAULTS_REWARD_SLEEP", "0")))
    return float(len(completion))
