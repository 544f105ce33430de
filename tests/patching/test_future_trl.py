"""The "future TRL" harness: the kinds of change TRL releases make, simulated on the installed TRL (1.16 in
``make test``'s suite, 1.12 in its ``test-trl112-fast`` part), each trainer's tiny parity scenario run through them.

(a) an extra positional and (b) an extra keyword argument at every call site of every callable slimrl replaces
(tests/patching/future_trl.py: the callee takes it, every caller passes it); (c) a patch target renamed; (d) a
version newer than slimrl's tests (the self-check). The result must equal TRL alone — losses, first-step gradients
and the two-step update within ``slimrl verify``'s tolerance (1e-4 relative in fp32: the same run on the same
weights, so only summation order may differ) — with slimrl's one line, and no traceback. Also TRL 1.17's kept-set
kernel call (``support_ids``), TRL's removed and promoted names, and the recorded contracts.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest

from slimrl.patching import TRAINERS, PatchFastRL, trainer_and_config, trainer_available, unpatch
from slimrl.patching.machinery.contracts import HandedBackWarning
from tests.patching.future_trl import grown_calls, kernel_with_support

SCENARIOS = [n for n, spec in TRAINERS.items() if spec.about.scenario is not None]
# what a row says when everything was handed back: then slimrl's own path cannot have run, and TRL's probe neither
HANDED_BACK_ONLY = (
    "",
    "slimrl's log-prob path did not run",
    "no generated token was checked against the training model",
)


def _row(name: str):
    from slimrl.verify import compare, make_setup
    from slimrl.verify.scenarios import loss_types

    if not trainer_available(name):
        pytest.skip(f"the installed TRL has no {name}")
    loss_type = loss_types(name, trainer_and_config(name)[1])[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = compare(name, loss_type, make_setup())
    return row, [str(w.message) for w in caught if issubclass(w.category, HandedBackWarning)]


NOT_CALLED_IN_TRAINING = ("push_to_hub", "from_pretrained")


def _fixed_contracts(name: str) -> list[str]:
    """The guarded targets of ``name`` whose contract names its parameters (no ``*args``): a grown call to one of
    them must be handed back. (Reward's only one, ``training_step``, takes ``*args, **kwargs``: served.)"""
    from slimrl.patching.machinery.contracts import callable_of, shape_of
    from slimrl.patching.machinery.registry import patches

    out = []
    for p in patches(name):
        if p.guarded and p.applies() and p.target_exists() and p.attribute not in NOT_CALLED_IN_TRAINING:
            shape = shape_of(callable_of(getattr(p.resolve(), p.attribute), p.member)) or []
            if not any(kind == "VAR_POSITIONAL" for _, kind, *_ in shape):
                out.append(f"{p.target}.{p.attribute}")
    return out


def _assert_trl_alone(row) -> None:
    assert row.problem in HANDED_BACK_ONLY, row.problem
    assert not row.skipped, row.skipped
    for what, err in (("loss", row.loss_err), ("gradients", row.grad_err), ("update", row.update_err)):
        assert err <= row.tolerance, f"{row.trainer}: {what} relative error {err:.2e} > {row.tolerance:.0e}"


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("kind", ["positional", "keyword"])
def test_every_call_grown_by_an_argument_trains_as_trl_alone(kind, name, monkeypatch):
    with grown_calls(kind, monkeypatch) as grown:
        assert grown, "nothing to grow: the harness would prove nothing"
        row, lines = _row(name)
    _assert_trl_alone(row)
    assert lines or not _fixed_contracts(name), "no call was handed back to TRL (or no line said so)"
    assert all("back to TRL's original" in line and ("argument" in line or "support_ids" in line) for line in lines), (
        lines
    )
    assert len(lines) == len(set(lines)), "a line repeated: once per process and reason"


def test_without_the_hand_back_the_harness_fails(monkeypatch):
    """The harness can fail: with the registry's contract guard removed, a grown call reaches slimrl's
    replacement, which was not written for it."""
    import slimrl.patching.machinery.registry as registry

    monkeypatch.setattr(registry, "guard", lambda key, new, seen, member, later: new)
    with grown_calls("keyword", monkeypatch):
        row, _ = _row("grpo")
    assert row.problem not in HANDED_BACK_ONLY, row


@pytest.mark.parametrize("name", ["dpo", "kto", "sft", "rloo"])
def test_a_kernel_call_with_a_kept_set_trains_with_trls_numbers(name, monkeypatch):
    """TRL 1.17's fused forward passes ``support_ids``; slimrl hands those calls to TRL's kernel."""
    from slimrl.compat.trl_info import has_fused_head

    if not has_fused_head():
        pytest.skip("TRL < 1.15 has no fused head")
    with contextlib.ExitStack() as stack:
        if name in ("grpo", "rloo"):  # their log-prob method gets the sampler's kept set first, then the forward
            stack.enter_context(grown_calls("keyword", monkeypatch, only=("_get_per_token_logps_and_entropies",)))
        calls = stack.enter_context(kernel_with_support(monkeypatch))
        row, lines = _row(name)
    _assert_trl_alone(row)
    assert calls, "the kernel never received a kept set"
    assert any("support_ids=<Tensor" in line for line in lines), lines


def test_renormalised_reference_is_the_fp64_one():
    """The simulated 1.17 kernel's renormalisation is what an fp64 log-softmax over the kept set gives."""
    import torch

    from tests.patching.future_trl import renormalised

    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(6, 16, generator=g), torch.randn(50, 16, generator=g)
    targets = torch.randint(0, 50, (6,), generator=g)
    support = torch.stack([torch.cat([targets[i : i + 1], torch.randperm(50, generator=g)[:7]]) for i in range(6)])
    got = renormalised(hidden, weight, None, targets, 0.7, support)
    logits = (hidden.double() @ weight.double().T) / 0.7  # [6, 50]
    want = torch.stack([logits[i, targets[i]] - torch.logsumexp(logits[i, support[i].unique()], 0) for i in range(6)])
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-5)  # fp32 logits of norm ~10: ~1e-6 each


def test_a_renamed_target_leaves_the_trainer_to_trl_alone(monkeypatch):
    """(c) TRL renamed a method slimrl replaces (its callers call the new name): the trainer is left unpatched
    with one line, and trains as TRL alone."""
    from trl import GRPOTrainer

    method = GRPOTrainer.__dict__["_get_per_token_logps_and_entropies"]
    monkeypatch.delattr(GRPOTrainer, "_get_per_token_logps_and_entropies")
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_renamed", method, raising=False)
    monkeypatch.setattr(
        GRPOTrainer,
        "__getattr__",
        lambda self, name: (
            self._get_per_token_logps_renamed
            if name == "_get_per_token_logps_and_entropies"
            else object.__getattribute__(self, name)
        ),
        raising=False,
    )
    with pytest.warns(UserWarning, match=r"_get_per_token_logps_and_entropies\): they run as TRL alone"):
        PatchFastRL("grpo")
    unpatch()
    row, _ = _row("grpo")
    _assert_trl_alone(row)


def test_handed_back_line_once_per_process_and_reason():
    import torch
    import trl.trainer.utils as utils

    from slimrl.compat.trl_info import has_fused_head
    from slimrl.patching.machinery import contracts

    if not has_fused_head() or utils._ChunkedLogProbFunction is None:
        pytest.skip("TRL < 1.15 has no fused-head kernel")
    PatchFastRL("dpo")
    contracts._NOTED.clear()
    h, w, t = torch.randn(3, 4), torch.randn(7, 4), torch.randint(0, 7, (3,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with pytest.raises(TypeError):  # TRL 1.16's own kernel refuses an eleventh argument
                utils._ChunkedLogProbFunction.apply(h, w, None, t, 1.0, 64, None, 1.0, ("log_probs",), None, 5)
    lines = [str(w.message) for w in caught if issubclass(w.category, HandedBackWarning)]
    assert (
        len(lines) == 1
        and "trl.trainer.utils._ChunkedLogProbFunction" in lines[0]
        and "positional argument 11" in lines[0]
    ), lines


def test_installed_trl_signatures_are_recorded():
    """contracts.json holds the installed (tested) release's signature of every method slimrl replaces, and
    fingerprints.json the code of every one it re-computes: a new TRL release is added with
    ``python -m slimrl.patching --record-contracts`` in its environment."""
    from slimrl.compat.trl_info import TESTED_TRL, trl_version
    from slimrl.patching.machinery.contracts import signature_changes
    from slimrl.patching.machinery.fingerprints import code_changes, recorded
    from slimrl.patching.machinery.registry import patches

    if str(trl_version()) not in TESTED_TRL:
        pytest.skip("not a tested release")
    assert signature_changes(patches()) == {}
    assert code_changes(patches()) == {}
    assert any(str(trl_version()) in e["releases"] for entries in recorded().values() for e in entries)


# (d) a version newer than slimrl's tests: the self-check


@pytest.fixture
def trl_119(monkeypatch, tmp_path):
    from packaging.version import Version

    import slimrl.compat.trl_info as info
    from slimrl.patching.every_trainer import preflight as self_check

    monkeypatch.setattr(info, "trl_version", lambda: Version("1.19.0"))
    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path))
    monkeypatch.delenv("SLIMRL_SELF_CHECK", raising=False)  # tests/conftest.py turns it off for the others
    monkeypatch.setattr(self_check, "_PROCESS", {})
    monkeypatch.setattr("slimrl.patching._STOOD_DOWN", {})
    return self_check


def test_a_newer_trl_runs_the_self_check_once_and_caches_it(trl_119, monkeypatch, capfd):
    """The real check (a child process running the DPO row), once per version set: a second process reads the
    cache (simulated by forgetting this process's verdicts)."""
    from slimrl.patching.machinery.registry import is_installed, patches

    runs = []
    real = trl_119.run_rows
    monkeypatch.setattr(trl_119, "run_rows", lambda names: runs.append(names) or real(names))
    PatchFastRL("dpo")
    assert runs == [["dpo"]]
    assert "checking dpo against TRL alone" in capfd.readouterr().err
    verdict = trl_119.cached()[trl_119.version_set()]["dpo"]
    assert verdict["passed"], verdict
    assert all(is_installed(p) for p in patches("dpo") if p.applies() and p.target_exists())
    unpatch()
    monkeypatch.setattr(trl_119, "_PROCESS", {})
    PatchFastRL("dpo")
    assert runs == [["dpo"]], "the cached verdict was not used"


def test_a_failing_row_stands_its_trainer_down(trl_119, monkeypatch):
    from slimrl.patching.machinery.registry import is_installed, patches

    def rows(names):
        return {n: {"passed": n != "kto", "row": f"{n} default 3e-2 ... FAIL", "seconds": 1.0} for n in names}

    monkeypatch.setattr(trl_119, "run_rows", rows)
    with pytest.warns(
        UserWarning,
        match=r"self-check on trl 1.19.0: kto default 3e-2 \.\.\. FAIL -- not patched, "
        r"it runs as TRL alone \(stood down: trl.trainer.kto_trainer:KTOTrainer",
    ):
        PatchFastRL()
    assert not any(is_installed(p) for p in patches("kto"))  # shared patches too: DPO's kernel swap is KTO's
    assert all(
        is_installed(p)
        for p in patches("orpo")  # its own; the processor patch is shared with KTO
        if p.applies() and p.target_exists() and p.algorithms == ("orpo",)
    )


def test_the_self_check_can_be_turned_off(trl_119, monkeypatch):
    monkeypatch.setenv("SLIMRL_SELF_CHECK", "0")
    monkeypatch.setattr(trl_119, "_SKIP_NOTED", [])
    monkeypatch.setattr(trl_119, "run_rows", lambda names: pytest.fail("the check ran"))
    with pytest.warns(UserWarning, match=r"the self-check is off \(SLIMRL_SELF_CHECK=0\): every patch goes in"):
        PatchFastRL("dpo")


def test_doctor_shows_the_cached_verdicts(trl_119, monkeypatch):
    from slimrl.verify.doctor import format_report, report

    monkeypatch.setattr(
        trl_119, "run_rows", lambda names: {n: {"passed": True, "row": f"{n} ok", "seconds": 1.0} for n in names}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PatchFastRL("sft")
        text = format_report(report())
    assert "self-check" in text and "sft: passed" in text, text


# moved and removed names


def test_a_trainer_trl_removed_is_one_line_naming_the_release(monkeypatch):
    from slimrl.patching import TrainerNotAvailableError
    from slimrl.patching.machinery.registry import is_installed, patches
    from slimrl.patching.table import TrainerSpec

    real = TrainerSpec.available
    monkeypatch.setattr(TrainerSpec, "available", lambda self: self.name != "orpo" and real(self))
    with pytest.raises(
        TrainerNotAvailableError,
        match=r"ORPOTrainer is not in the installed trl .*: TRL removed "
        r"it after 1.16.0 .*; use DPOTrainer .* 'trl==1.16.0'",
    ):
        PatchFastRL("orpo")
    with pytest.warns(UserWarning, match=r"ORPOTrainer is not in .* the other trainers are patched"):
        PatchFastRL()
    assert all(is_installed(p) for p in patches("cpo") if p.applies() and p.target_exists())


def test_async_grpo_imports_from_either_place_while_patched(monkeypatch):
    import importlib
    import sys

    import trl

    from slimrl.patching.every_trainer import moved_names

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module("trl.experimental.async_grpo")
    except ImportError as err:  # TRL 1.12's needs aiohttp, which only its vllm extra brings
        pytest.skip(f"this TRL's AsyncGRPO does not import here: {err}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PatchFastRL("grpo")
        from trl import AsyncGRPOTrainer  # TRL 1.18's spelling, on a TRL that has it under trl.experimental

        cls = importlib.import_module("trl.experimental.async_grpo").AsyncGRPOTrainer
    assert AsyncGRPOTrainer is cls
    unpatch()
    # TRL 2.0: the old module and trl.experimental gone, the names stable in trl
    monkeypatch.setattr(trl, "AsyncGRPOTrainer", cls, raising=False)
    monkeypatch.setattr(trl, "AsyncGRPOConfig", object, raising=False)
    monkeypatch.setattr(moved_names, "_exists", lambda module: not module.startswith("trl.experimental"))
    for module in [m for m in sys.modules if m == "trl.experimental" or m.startswith("trl.experimental.")]:
        monkeypatch.delitem(sys.modules, module)
    PatchFastRL("grpo")
    finder = moved_names._STATE["finder"]
    monkeypatch.setattr(sys, "meta_path", [finder, *[f for f in sys.meta_path if f is not finder]])
    with pytest.warns(FutureWarning, match="trl.experimental.async_grpo is gone from the installed TRL"):
        old = importlib.import_module("trl.experimental.async_grpo")
    assert old.AsyncGRPOTrainer is cls
    unpatch()
    assert "trl.experimental.async_grpo" not in sys.modules


def test_the_truncation_fix_stands_aside_where_trl_carries_the_kept_set(monkeypatch):
    """``slimrl_truncated_sampling_fix`` replays TRL 1.17's correction on older TRL; where the TRL in use already
    passes the sampler's kept set, TRL corrects itself and the field changes nothing."""
    from types import SimpleNamespace

    import torch

    from slimrl.patching.machinery import contracts
    from slimrl.patching.online.truncated_sampling import apply_support_fix

    monkeypatch.setattr(contracts, "LATER_SEEN", {"support_ids"})
    trainer = SimpleNamespace(args=SimpleNamespace(slimrl_truncated_sampling_fix=True, top_p=0.8))
    logps = torch.tensor([[-1.0, -2.0]])
    output = {"sampling_per_token_logps": logps}
    with pytest.warns(UserWarning, match="corrects truncated sampling itself"):
        apply_support_fix(trainer, output)
    assert output["sampling_per_token_logps"] is logps


@pytest.fixture
def self_check_on(monkeypatch, tmp_path):
    """The self-check as a user has it (on, a cache of its own), on the installed (tested) TRL's version."""
    from slimrl.patching.every_trainer import preflight as self_check

    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path))
    monkeypatch.delenv("SLIMRL_SELF_CHECK", raising=False)
    monkeypatch.setattr(self_check, "_PROCESS", {})
    monkeypatch.setattr("slimrl.patching._STOOD_DOWN", {})
    return self_check


def _edited_logps(monkeypatch):
    """A fork's edit of GRPO's log-prob method under the same TRL version (the code differs, the signature not)."""
    from trl import GRPOTrainer

    real = GRPOTrainer._get_per_token_logps_and_entropies

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs,
    ):
        logps, entropies, aux = real(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size,
            compute_entropy,
            compute_aux_loss,
            **kwargs,
        )
        return logps * 0.5, entropies, aux  # what the fork changed

    import inspect

    _get_per_token_logps_and_entropies.__signature__ = inspect.signature(real)
    # a fork's code lives in TRL's own file (a wrapper from elsewhere is the user's, which slimrl leaves in place)
    code = _get_per_token_logps_and_entropies.__code__
    _get_per_token_logps_and_entropies.__code__ = code.replace(co_filename=real.__code__.co_filename)
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", _get_per_token_logps_and_entropies)
    return _get_per_token_logps_and_entropies


def test_a_changed_method_under_a_tested_version_runs_the_check_and_stays_trl(self_check_on, monkeypatch):
    """A TRL whose version slimrl knows but whose re-computed method is not a tested release's code: the parity row
    runs before GRPO is patched; its failure leaves GRPO to TRL alone (the fork's own method)."""
    from trl import GRPOTrainer

    from slimrl.compat.trl_info import trl_version
    from slimrl.patching.machinery.fingerprints import recorded
    from slimrl.patching.machinery.registry import is_installed, patches

    assert str(trl_version()) in {r for entries in recorded().values() for e in entries for r in e["releases"]}
    edited = _edited_logps(monkeypatch)
    reason = self_check_on.why_check(["grpo"], patches)
    assert reason and "has code none of slimrl's tested TRL releases had" in reason
    runs = []
    monkeypatch.setattr(
        self_check_on,
        "run_rows",
        lambda names: (
            runs.append(names)
            or {n: {"passed": False, "row": f"{n} dapo update 1.0e+00 ... FAIL", "seconds": 1.0} for n in names}
        ),
    )
    with pytest.warns(UserWarning, match=r"grpo dapo update .* FAIL -- not patched, it runs as TRL alone"):
        PatchFastRL("grpo")
    assert runs == [["grpo"]]
    assert GRPOTrainer._get_per_token_logps_and_entropies is edited
    assert not any(is_installed(p) for p in patches("grpo") if p.attribute == "_get_per_token_logps_and_entropies")


def test_the_tested_code_runs_no_check_and_the_cache_follows_the_code(self_check_on, monkeypatch):
    from slimrl.patching.machinery.registry import patches

    assert self_check_on.why_check(["grpo"], patches) is None  # the installed TRL is a tested one, code and all
    before = self_check_on.version_set()
    _edited_logps(monkeypatch)
    assert self_check_on.version_set() != before  # a verdict cached on other code is never this code's


def test_a_changed_pass_through_signature_runs_no_self_check(self_check_on, monkeypatch):
    """transformers gives ``Trainer.push_to_hub`` a new keyword: slimrl's wrap of it hands every argument to the
    original as it came (a pass-through, no contract), so it is no reason for the self-check, and the new keyword
    reaches transformers' method."""
    from transformers import Trainer
    from trl import GRPOTrainer

    from slimrl.patching.machinery.registry import patches

    seen = []

    def push_to_hub(
        self, commit_message="End of training", blocking=True, token=None, revision=None, new_option=None, **kwargs
    ):
        seen.append(new_option)

    monkeypatch.setattr(Trainer, "push_to_hub", push_to_hub)
    assert self_check_on.why_check(["grpo"], patches) is None
    runs = []
    monkeypatch.setattr(self_check_on, "run_rows", lambda names: runs.append(names) or {})
    PatchFastRL("grpo")
    assert runs == []
    import types

    trainer = types.SimpleNamespace(args=types.SimpleNamespace())
    GRPOTrainer.push_to_hub(trainer, new_option="kept")
    assert seen == ["kept"]


def test_contracts_guard_only_the_replacements_that_compute():
    """Every wrap that only forwards its arguments is a pass-through: contracts.json records the methods slimrl
    re-implements (log-prob methods, the kernel, the losses, generation) and nothing else."""
    from slimrl.patching.machinery.contracts import recorded
    from slimrl.patching.machinery.registry import patches

    keys = set(recorded())
    assert len(keys) <= 25
    for p in patches():
        if p.passthrough:
            assert not p.guarded and f"{p.target}.{p.attribute}" not in keys, p
