"""The self-check follows the code that runs (round 7 of the reliability issue): a fork that reports a tested version
but edits a helper the replaced code calls, or a trainer's ``__init__``; a ``.pyc`` that differs from its ``.py``; a
wrapper a user installed before ``PatchFastRL``; a helper rebound after it. Each is either the self-check's reason
(its row runs, TRL alone where it fails) or one line with TRL's own code running."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
import warnings
from pathlib import Path

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching.machinery import contracts, reach
from slimrl.patching.machinery.fingerprints import fingerprint

MODULE = """
def helper(x):
    return x * {factor}


class Trainer:
    def replaced(self, x):
        return helper(x) + self.other(x)

    def other(self, x):
        return x
"""


@pytest.fixture
def fake_trl(tmp_path, monkeypatch):
    """A folder that counts as TRL's package, and a function importing a module written there."""
    root = tmp_path / "fake_trl"
    root.mkdir()
    real = reach.package_dir

    monkeypatch.setattr(reach, "package_dir", lambda name: str(root) + "/" if name == "trl" else real(name))
    monkeypatch.syspath_prepend(str(root))

    def load(name: str, text: str) -> types.ModuleType:
        (root / f"{name}.py").write_text(text)
        importlib.invalidate_caches()
        sys.modules.pop(name, None)
        return importlib.import_module(name)

    yield root, load
    for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", "") and str(root) in m.__file__]:
        sys.modules.pop(name)


def test_an_edited_helper_changes_the_fingerprint_of_the_method_that_calls_it(fake_trl):
    _, load = fake_trl
    one = load("fork_one", MODULE.format(factor="2.0"))
    two = load("fork_two", MODULE.format(factor="0.5"))  # only the helper differs
    assert inspect.getsource(one.Trainer.replaced) == inspect.getsource(two.Trainer.replaced)
    same = load("fork_three", MODULE.format(factor="2.0"))
    assert fingerprint(one.Trainer.replaced, one.Trainer) != fingerprint(two.Trainer.replaced, two.Trainer)
    assert fingerprint(one.Trainer.replaced, one.Trainer) != fingerprint(one.Trainer.replaced)  # self.other counts
    assert fingerprint(same.Trainer.replaced, same.Trainer) is not None


def test_code_that_differs_from_its_source_has_no_fingerprint(fake_trl):
    """An edit of the .py after the import, and a .pyc whose code is not its .py's (same size and time, so Python
    loads it): the code Python runs is what counts, and it matches no recorded source."""
    root, load = fake_trl
    module = load("fork_edited", MODULE.format(factor="2.0"))
    assert fingerprint(module.Trainer.replaced, module.Trainer) is not None
    (root / "fork_edited.py").write_text(MODULE.format(factor="3.0"))  # source changed under the running code
    assert not reach.runs_its_source(module.helper)
    assert fingerprint(module.Trainer.replaced, module.Trainer) is None

    source = root / "fork_planted.py"
    source.write_text(MODULE.format(factor="2.0"))
    stat = source.stat()
    code = compile(MODULE.format(factor="5.0"), str(source), "exec")  # what the cache holds instead
    cache = Path(importlib.util.cache_from_source(str(source)))
    cache.parent.mkdir(exist_ok=True)
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    cache.write_bytes(_code_to_timestamp_pyc(code, int(stat.st_mtime), stat.st_size))
    sys.modules.pop("fork_planted", None)
    planted = importlib.import_module("fork_planted")
    assert planted.helper(1.0) == 5.0  # Python runs the cache's code
    assert not reach.runs_its_source(planted.helper)
    assert fingerprint(planted.Trainer.replaced, planted.Trainer) is None


def _fork(real, body):
    """``body`` standing for a fork's edit of ``real``: its code in TRL's own file, as a fork's is."""
    body.__code__ = body.__code__.replace(co_filename=real.__code__.co_filename)
    return body


def test_a_fork_of_a_helper_or_of_init_is_the_self_checks_reason(monkeypatch):
    """Under the tested version's number: a fork of a helper ``_compute_loss`` calls, or of ``GRPOTrainer.__init__``
    (not replaced by slimrl, but what sets up the state its methods read)."""
    from trl import GRPOTrainer

    from slimrl.patching.every_trainer import preflight as self_check
    from slimrl.patching.machinery.registry import patches

    unpatch()
    assert self_check.why_check(["grpo"], patches) is None
    real = GRPOTrainer.get_high_entropy_mask
    monkeypatch.setattr(GRPOTrainer, "get_high_entropy_mask", _fork(real, lambda self, *a, **k: real(self, *a, **k)))
    reason = self_check.why_check(["grpo"], patches)
    assert reason and "GRPOTrainer._compute_loss has code none of slimrl's tested TRL releases had" in reason
    monkeypatch.undo()
    init = GRPOTrainer.__init__
    monkeypatch.setattr(GRPOTrainer, "__init__", _fork(init, lambda self, *a, **k: init(self, *a, **k)))
    reason = self_check.why_check(["grpo"], patches)
    assert reason and "GRPOTrainer.__init__ has code none" in reason


def test_a_wrapper_installed_before_patchfastrl_is_kept_with_one_line(monkeypatch):
    import functools

    from trl import GRPOTrainer

    from slimrl.patching.machinery.registry import is_installed, patches

    unpatch()
    real = GRPOTrainer._compute_loss
    calls = []

    @functools.wraps(real)
    def logged(self, *args, **kwargs):  # a user's wrapper: functools.wraps copies TRL's names, not its code
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", logged)
    try:
        with pytest.warns(
            UserWarning,
            match=r"slimrl leaves grpo unpatched: your code replaced .*"
            r"GRPOTrainer\._compute_loss \(.*test_followed_code\.py:\d+\)",
        ) as seen:
            PatchFastRL("grpo")
        assert len([w for w in seen if "slimrl leaves" in str(w.message)]) == 1
        assert GRPOTrainer._compute_loss is logged
        assert not any(is_installed(p) for p in patches("grpo"))
    finally:
        unpatch()


def test_a_helper_rebound_after_patchfastrl_hands_the_call_to_trls_code(monkeypatch):
    """A stand-in of a TRL method that calls a module global of TRL's GRPO module: after the global is rebound, the
    guard hands calls to TRL's code (which follows the new helper), with one line."""
    import trl.trainer.grpo_trainer as grpo_module

    def trls(x):
        return nanmin(x)  # noqa: F821 - TRL's module global, resolved in TRL's namespace below

    original = types.FunctionType(trls.__code__.replace(co_filename=grpo_module.__file__), vars(grpo_module), "trls")

    def slimrls(x):
        return "slimrl's path"

    guarded = contracts.guard("trl.trainer.grpo_trainer:Stand.in", slimrls, original, None, ())
    import torch

    values = torch.tensor([3.0, 1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert guarded(values) == "slimrl's path"
    monkeypatch.setattr(grpo_module, "nanmin", lambda x: "the user's helper")
    with pytest.warns(
        contracts.HandedBackWarning,
        match=r"trl\.trainer\.grpo_trainer\.nanmin rebound after "
        r"PatchFastRL",
    ) as seen:
        assert guarded(values) == "the user's helper"  # TRL alone's answer
        assert guarded(values) == "the user's helper"
    assert len(seen) == 1 and "\n" not in str(seen[0].message)


def test_the_installed_compute_loss_watches_its_helpers(monkeypatch):
    """The real guard of GRPO's ``_compute_loss`` sees a rebinding of ``nanmin`` (which TRL's method calls)."""
    import trl.trainer.grpo_trainer as grpo_module
    from trl import GRPOTrainer

    PatchFastRL("grpo")
    try:
        monkeypatch.setattr(grpo_module, "nanmin", lambda x: x.min())
        with pytest.warns(contracts.HandedBackWarning, match=r"nanmin rebound after PatchFastRL"):
            with pytest.raises(Exception):  # noqa: B017 - TRL's own method, called on no trainer, fails its own way
                GRPOTrainer._compute_loss(types.SimpleNamespace(), None, {})
    finally:
        unpatch()
