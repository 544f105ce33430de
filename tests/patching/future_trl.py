"""A TRL 1.16 (or 1.12) made to look like a later release, for the "future TRL" harness (test_future_trl.py).

:func:`grown_calls` simulates a release whose methods grew an argument and whose callers pass it: every callable
slimrl replaces (the methods, module functions and the fused-head kernel's ``apply``; constructors too for a
keyword) gets, on TRL's side, a version that accepts one more argument and ignores it (the callee), and every call
that reaches it passes one (the callers): an extra positional argument after all the others (the call made fully
positional first, as a caller passing one more argument by position does), or an extra keyword. TRL alone's
numbers are therefore TRL's own; slimrl, installed over the grown callee, must hand those calls back.

:func:`kernel_with_support` simulates TRL 1.17's fused head: the fused forward passes the sampler's kept token
set (``support_ids``, here each row's 8 most likely tokens) to ``_ChunkedLogProbFunction.apply``, whose log-probs
are renormalised over it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types

import torch

EXTRA_KEYWORD = "slimrl_future_keyword"
EXTRA_POSITIONAL = "slimrl_future_positional"
SENTINEL = object()


def _targets(kind: str, only: tuple[str, ...] = ()):
    """(patch, owner, attribute, member) of every callable the installed TRL has that slimrl replaces (``only``:
    these attributes)."""
    from slimrl.patching import unpatch
    from slimrl.patching.machinery.registry import patches

    unpatch()
    seen = set()
    for p in patches():
        if not p.applies() or p.key in seen or not p.target_exists() or (only and p.attribute not in only):
            continue
        owner = p.resolve()
        value = getattr(owner, p.attribute)
        entry = not p.guarded
        if p.member:
            if value is None:
                continue
        elif not isinstance(value, types.FunctionType):
            continue  # dicts, classes, class methods: no call site to grow
        if entry and kind == "positional":
            continue  # a constructor's callers are the user's own lines, which pass keywords
        seen.add(p.key)
        yield p, owner, p.attribute, p.member


def _signature(fn, member: str | None) -> inspect.Signature:
    from slimrl.patching.machinery.contracts import callable_of

    return inspect.signature(callable_of(fn, member) if member else fn)


def _grow(sig: inspect.Signature, kind: str) -> inspect.Signature:
    params = list(sig.parameters.values())
    if kind == "keyword":
        tail = [p for p in params if p.kind is p.VAR_KEYWORD]
        return sig.replace(
            parameters=[p for p in params if p.kind is not p.VAR_KEYWORD]
            + [inspect.Parameter(EXTRA_KEYWORD, inspect.Parameter.KEYWORD_ONLY, default=None)]
            + tail
        )
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return sig  # *args takes it already
    cut = next((i for i, p in enumerate(params) if p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD)), len(params))
    extra = inspect.Parameter(EXTRA_POSITIONAL, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    return sig.replace(parameters=params[:cut] + [extra] + params[cut:])


def _callee(fn, sig: inspect.Signature, grown: inspect.Signature):
    """TRL's function after the release: takes the extra argument, ignores it."""

    @functools.wraps(fn)
    def grown_callee(*args, **kwargs):
        kwargs.pop(EXTRA_KEYWORD, None)
        if EXTRA_POSITIONAL in grown.parameters and EXTRA_POSITIONAL not in sig.parameters:
            bound = grown.bind(*args, **kwargs)
            bound.arguments.pop(EXTRA_POSITIONAL, None)
            return fn(*bound.args, **bound.kwargs)
        if EXTRA_POSITIONAL not in grown.parameters and args and args[-1] is SENTINEL:
            args = args[:-1]  # a *args callee: the sentinel rode at the end
        return fn(*args, **kwargs)

    grown_callee.__signature__ = grown
    # the later release's code lives in TRL's own file (a wrapper from elsewhere is the user's: slimrl stands aside)
    grown_callee.__code__ = grown_callee.__code__.replace(co_filename=fn.__code__.co_filename)
    return grown_callee


def _caller(installed, sig: inspect.Signature, kind: str):
    """What TRL's callers now do: pass one more argument to whatever is installed."""

    def grown_caller(*args, **kwargs):
        if kind == "keyword":
            return installed(*args, **{**kwargs, EXTRA_KEYWORD: 1})
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return installed(*args, **kwargs)
        if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
            return installed(*args, SENTINEL, **kwargs)  # *args: one more at the end
        bound.apply_defaults()
        positional = [
            bound.arguments[n]
            for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        rest = {n: v for n, v in bound.arguments.items() if sig.parameters[n].kind is inspect.Parameter.KEYWORD_ONLY}
        var = next((bound.arguments.get(n, {}) for n, p in sig.parameters.items() if p.kind is p.VAR_KEYWORD), {})
        return installed(*positional, SENTINEL, **rest, **var)

    return grown_caller


def _as_member(cls, member: str, fn):
    return type(cls.__name__, (), {member: staticmethod(fn), "forward": getattr(cls, "forward", None)})


@contextlib.contextmanager
def grown_calls(kind: str, monkeypatch, only: tuple[str, ...] = ()):
    """The installed TRL as a later release whose every replaced callable (``only``: these attributes) takes one
    more argument and whose callers pass it (module docstring); ``kind``: "positional" or "keyword". Yields the keys
    of the grown targets."""
    import slimrl.patching as patching
    from slimrl.patching.machinery import contracts

    grown = {}
    for p, owner, attribute, member in list(_targets(kind, only)):
        value = getattr(owner, attribute)
        fn = getattr(value, member) if member else value
        if hasattr(fn, "__ungrown_signature__"):  # inherited from a class grown already (XPO from Online DPO)
            grown[p.key] = (owner, attribute, member, fn.__ungrown_signature__)
            continue
        sig = _signature(value, member)
        callee = _callee(fn, sig, _grow(sig, kind))
        callee.__ungrown_signature__ = sig
        monkeypatch.setattr(owner, attribute, _as_member(value, member, callee) if member else callee)
        grown[p.key] = (owner, attribute, member, sig)
    real_install = patching.install

    def install_then_grow_callers(p):
        done = real_install(p)
        if done and p.key in grown:
            owner, attribute, member, sig = grown[p.key]
            installed = getattr(owner, attribute)
            fn = getattr(installed, member) if member else installed
            caller = _caller(fn, sig, kind)
            setattr(
                owner,
                attribute,
                type(installed.__name__, (installed,), {member: staticmethod(caller)}) if member else caller,
            )
        return done

    monkeypatch.setattr(patching, "install", install_then_grow_callers)
    contracts._NOTED.clear()
    try:
        yield [f"{t}.{a}" for t, a in grown]
    finally:
        patching.unpatch()
        contracts.LATER_SEEN.clear()  # what this simulated TRL passed is not the installed TRL's


def renormalised(hidden, weight, bias, targets, temperature, support_ids):
    """TRL 1.17's log-probs (as its release describes): log-softmax over each row's kept set. ``[N]``"""
    logits = hidden.float() @ weight.float().T  # [N, V]
    if bias is not None:
        logits = logits + bias.float()
    logits = logits / temperature
    kept = torch.full_like(logits, float("-inf")).scatter(1, support_ids, 0.0)  # [N, V]: 0 on the kept set
    logp = torch.log_softmax(logits + kept, dim=-1)  # [N, V]
    return logp.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)  # [N]


@contextlib.contextmanager
def kernel_with_support(monkeypatch, k: int = 8):
    """TRL 1.17's kernel and fused forward (module docstring) on the installed TRL 1.15+, for both sides: TRL alone
    and slimrl installed over it. Yields the list of kept-set shapes the kernel received."""
    import trl.trainer.utils as utils

    import slimrl.patching as patching

    trl_kernel = utils._ChunkedLogProbFunction
    calls = []

    def release_117_apply(
        hidden,
        weight,
        bias,
        targets,
        temperature,
        chunk_size,
        softcap=None,
        logit_scale=1.0,
        outputs=("log_probs",),
        support_ids=None,
    ):
        out = list(
            trl_kernel.apply(hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale, outputs)
        )
        if support_ids is not None:
            calls.append(tuple(support_ids.shape))
            out[0] = renormalised(hidden, weight, bias, targets, temperature, support_ids)
        return tuple(out)

    def passing_support(apply):
        """The fused forward's call of 1.17: TRL 1.16's nine arguments, then the kept set."""

        def fused_forward_call(*args):
            if len(args) != 9:
                return apply(*args)  # the kept set is there already (a call handed back to TRL)
            with torch.no_grad():  # the sampled token is in the kept set, as with a real sampler
                top = (args[0].float() @ args[1].float().T).topk(k - 1, dim=-1).indices  # [N, k - 1]
                kept = torch.cat([args[3].clamp(min=0).unsqueeze(1), top], dim=1)  # [N, k]
            return apply(*args, kept)

        return fused_forward_call

    def kernel(apply, base=()):
        return type("ChunkedLogProbFunction", base, {"apply": staticmethod(apply), "forward": trl_kernel.forward})

    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", kernel(passing_support(release_117_apply)))
    real_install = patching.install

    def install_then_pass_support(p):
        done = real_install(p)
        if done and p.attribute == "_ChunkedLogProbFunction":
            installed = utils._ChunkedLogProbFunction
            utils._ChunkedLogProbFunction = kernel(passing_support(installed.apply), (installed,))
        return done

    monkeypatch.setattr(patching, "install", install_then_pass_support)
    from slimrl.patching.machinery import contracts

    contracts._NOTED.clear()
    try:
        yield calls
    finally:
        patching.unpatch()
        contracts.LATER_SEEN.clear()  # what this simulated TRL passed is not the installed TRL's
