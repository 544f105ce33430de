"""PatchFastRL / unpatch: in place, idempotent, reversible, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching import TRAINERS, TrainerNotAvailableError, describe, trainer_available
from slimrl.patching.machinery.registry import is_installed, patches

CPU = {"output_dir": "/tmp/slimrl-test", "use_cpu": True, "bf16": False}


def _snapshot(cls) -> dict:
    return dict(vars(cls))


def test_patch_in_place_reaches_names_imported_before():
    from trl import GRPOConfig, GRPOTrainer  # imported before the patch

    original = GRPOTrainer._get_per_token_logps_and_entropies
    PatchFastRL("GRPO")
    try:
        assert GRPOTrainer._get_per_token_logps_and_entropies is not original
        assert GRPOTrainer._get_per_token_logps_and_entropies.__name__ == "slimrl_get_per_token_logps_and_entropies"
        from trl import GRPOTrainer as GRPOTrainerAfter  # imported after: the same, patched class

        assert GRPOTrainerAfter is GRPOTrainer
        assert GRPOConfig(**CPU, unsloth_num_chunks=4).unsloth_num_chunks == 4
    finally:
        unpatch()
    assert GRPOTrainer._get_per_token_logps_and_entropies is original


def test_idempotent_and_exact_restore():
    from trl import GRPOConfig, GRPOTrainer

    unpatch()
    before_t, before_c = _snapshot(GRPOTrainer), _snapshot(GRPOConfig)
    PatchFastRL("grpo")
    patched = _snapshot(GRPOTrainer)
    PatchFastRL("grpo")  # second call changes nothing
    assert _snapshot(GRPOTrainer) == patched
    unpatch("grpo")
    unpatch("grpo")  # second call is a no-op
    assert _snapshot(GRPOTrainer) == before_t
    assert _snapshot(GRPOConfig) == before_c
    with pytest.raises(TypeError, match="unsloth_num_chunks"):
        GRPOConfig(**CPU, unsloth_num_chunks=4)  # TRL's own config again


def test_patch_all_and_list():
    PatchFastRL()
    try:
        rows = describe()
        assert rows and all(r["installed"] == "yes" for r in rows if r["algorithm"] == "grpo")
        for row in rows:
            assert {"algorithm", "target", "attribute", "replacement", "trl"} <= set(row)
    finally:
        unpatch()
    assert all(r["installed"] == "no" for r in describe())


def test_unknown_algorithm_lists_valid_names():
    with pytest.raises(ValueError) as err:
        PatchFastRL("ppo2")
    for name in TRAINERS:
        assert name in str(err.value)


def test_missing_trainer_names_release():
    missing = [n for n in ("ppo", "bco", "xpo", "prm") if not trainer_available(n)]
    if not missing:
        pytest.skip("this TRL still ships PPO/BCO/XPO/PRM")
    with pytest.raises(TrainerNotAvailableError, match=r"trl==1\.12\.0"):
        PatchFastRL(missing[0])


def test_every_applying_patch_has_its_target():
    """On the installed TRL (this test runs in every TRL environment), every patch declared for it resolves: a
    renamed TRL method fails here, not silently at a user's run."""
    applying = [p for p in patches() if p.applies()]
    assert len(applying) > 20
    missing = [f"{p.target}.{p.attribute}" for p in applying if not p.optional and not p.target_exists()]
    assert not missing, missing


def test_install_refuses_a_missing_target_naming_the_release():
    from slimrl.compat.trl_info import trl_version
    from slimrl.patching.machinery.registry import Patch, PatchTargetMissingError, install

    gone = Patch("grpo", "trl.trainer.grpo_trainer:GRPOTrainer", "_no_such_method_in_trl", lambda self: None)
    with pytest.raises(
        PatchTargetMissingError,
        match=rf"_no_such_method_in_trl is not an attribute .* installed "
        rf"trl {trl_version()}",
    ):
        install(gone)
    no_module = Patch("grpo", "trl.no_such_module:X", "y", lambda self: None)
    with pytest.raises(PatchTargetMissingError, match=r"trl.no_such_module:X does not exist"):
        install(no_module)
    optional = Patch("grpo", "trl.trainer.grpo_trainer", "_absent_name", lambda o: o, wrap=True, optional=True)
    assert install(optional) is False


def test_bad_num_chunks_is_rejected_before_work():
    from trl import GRPOConfig

    PatchFastRL("grpo")
    try:
        with pytest.raises(ValueError, match="unsloth_num_chunks=0 is invalid"):
            GRPOConfig(**CPU, unsloth_num_chunks=0)
        assert GRPOConfig(**CPU).unsloth_num_chunks == -1
    finally:
        unpatch()


def test_shared_patch_stays_until_last_user_is_unpatched():
    shared = [p for p in patches("dpo") if "sft" in p.algorithms and p.applies() and p.target_exists()]
    if not shared:
        pytest.skip("no patch shared by DPO and SFT on this TRL")
    PatchFastRL("dpo")
    PatchFastRL("sft")
    try:
        unpatch("dpo")
        assert all(is_installed(p) for p in shared), "SFT still needs the shared kernel patch"
    finally:
        unpatch("sft")
    assert not any(is_installed(p) for p in shared)


def test_readme_trainer_table_is_generated_from_the_specs():
    """The README's trainer table is :func:`slimrl.patching.doc_tables.readme_table` (regenerate it from there)."""
    from slimrl.patching.doc_tables import readme_table

    readme = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text()
    assert readme_table() in readme, (
        "docs/compatibility.md's trainer table is stale: paste slimrl.patching.doc_tables.readme_table()"
    )


def test_every_spec_names_real_trl_objects():
    """Each row of the trainers table that the installed TRL has resolves to its trainer and config classes, and
    its dataset layouts are non-empty where the trainer reads a dataset layout slimrl checks."""
    from slimrl.patching.table import TRAINERS

    for name, spec in TRAINERS.items():
        if not spec.available():
            continue
        trainer, config = spec.classes()
        assert trainer.__name__ == spec.trainer_class_name and config.__name__.endswith("Config"), name
    root = Path(__file__).resolve().parents[2]
    for spec in TRAINERS.values():  # the README names each parity test: it must exist
        for path in re.findall(r"`(tests/[\w/]+\.py)`", spec.about.parity_test):
            assert (root / path).is_file(), (spec.name, path)


def test_a_trainer_whose_methods_are_gone_is_refused_whole(monkeypatch):
    """A TRL newer than slimrl's tests renamed a method: that trainer is left to TRL alone with one line naming it
    (nothing of it installed, nothing stopped); PatchFastRL() patches the others and says which it refused."""
    from trl import GRPOTrainer

    monkeypatch.delattr(GRPOTrainer, "_get_per_token_logps_and_entropies")
    with pytest.warns(
        UserWarning,
        match=r"GRPOTrainer: trl.trainer.grpo_trainer:GRPOTrainer."
        r"_get_per_token_logps_and_entropies\): they run as TRL alone",
    ):
        PatchFastRL("grpo")
    assert not any(is_installed(p) for p in patches("grpo"))
    with pytest.warns(UserWarning, match=r"cannot patch these trainers .* the other trainers are patched"):
        PatchFastRL()
    assert not any(is_installed(p) for p in patches("grpo") if len(p.algorithms) == 1)  # shared ones stay for RLOO
    assert all(is_installed(p) for p in patches("sft") if p.applies() and p.target_exists())


def test_newer_trl_than_tested_warns_naming_verify():
    from packaging.version import Version

    from slimrl.compat.trl_info import check_trl_supported

    with pytest.warns(
        UserWarning,
        match=r"trl 1.17.0 is newer than the releases slimrl is tested with .* each "
        r"trainer's tiny parity row runs before its patches go in",
    ):
        assert not check_trl_supported(Version("1.17.0"))
