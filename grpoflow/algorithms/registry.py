"""The registries of the algorithm families (one `plugins.Registry` each), and signature-based dispatch.

Each family (advantage estimators, policy losses, KL estimators, loss aggregation modes)
has one registry. Callers look a function up by the name in the config and call it with
`call_with_available(fn, **everything_the_caller_has)`: a function declares the inputs it
needs through its own signature, so no caller ever branches on the name.

    @register_advantage("my_adv")
    def my_adv(scores, response_mask, group_ids, temperature: float = 1.0): ...

    fn = get_advantage("my_adv")
    missing = required_inputs(fn) - set(available)   # check once at start-up
    adv = call_with_available(fn, **available)

A registration may carry keyword metadata that callers check at start-up, e.g.
`@register_policy_loss("gspo", agg_modes=("seq-mean-token-mean",))`; read it with
`POLICY_LOSSES.meta("gspo")`. A user function can also live in its own file and be named as
`path/to/file.py:function` wherever a registered name is accepted (`Registry.resolve`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from grpoflow.plugins import Registry, fn_name as _fn_name, load_from_file  # noqa: F401 (re-exported)


ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
LOSS_AGGREGATIONS = Registry("loss aggregation mode")


KL_CONTROLLERS = Registry("KL controller")


def register_advantage(
    name: str, *, override: bool = False, **meta: Any
) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under `name`, with optional metadata.

    An estimator that also gives the critic's regression targets returns `(advantages, returns)`; the
    controller tells by the returned tuple, so no flag is needed.
    """
    return ADVANTAGE_ESTIMATORS.register(name, override=override, **meta)


def register_policy_loss(
    name: str, *, agg_modes: tuple[str, ...] | None = None, override: bool = False
) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss under `name`.

    Args:
        agg_modes: the loss aggregation modes the loss is defined for (e.g. GSPO's
            sequence-level ratio only makes sense with "seq-mean-token-mean"); None = any.
            Stored as `POLICY_LOSSES.meta(name)["agg_modes"]`.
    """
    if agg_modes is None:
        return POLICY_LOSSES.register(name, override=override)
    if isinstance(agg_modes, str) or not all(isinstance(m, str) for m in agg_modes):
        raise ValueError(
            f"agg_modes of policy loss {name!r} must be a tuple of mode names, got "
            f"{agg_modes!r}; write e.g. agg_modes=({agg_modes!r},)."
        )
    return POLICY_LOSSES.register(name, override=override, agg_modes=tuple(agg_modes))


def get_advantage(name: str) -> Callable:
    """The advantage estimator registered under `name`, or loaded from `file.py:function`."""
    return ADVANTAGE_ESTIMATORS.resolve(name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered under `name`, or loaded from `file.py:function`."""
    return POLICY_LOSSES.resolve(name)


def required_inputs(fn: Callable) -> set[str]:
    """Names of `fn`'s parameters that have no default (excluding *args / **kwargs).

    Callers check these against what they can provide at start-up, before any rollout.
    """
    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


def call_with_available(fn: Callable, **available: Any) -> Any:
    """Call `fn` with the keyword arguments from `available` that its signature names.

    If `fn` takes **kwargs it receives everything. A required parameter of `fn` missing
    from `available` raises TypeError naming the function, the missing and available inputs.
    """
    params = inspect.signature(fn).parameters.values()
    positional_only = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only:
        raise TypeError(
            f"{_fn_name(fn)} has positional-only parameters {positional_only}; "
            f"registered functions must accept their inputs by keyword."
        )
    missing = required_inputs(fn) - available.keys()
    if missing:
        raise TypeError(
            f"{_fn_name(fn)} needs input(s) {sorted(missing)} that the caller does not "
            f"provide; available inputs: {sorted(available)}."
        )
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn(**available)
    accepted = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return fn(**{k: v for k, v in available.items() if k in accepted})
