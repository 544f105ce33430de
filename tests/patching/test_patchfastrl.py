"""PatchFastRL / unpatch: in place, idempotent, reversible, clear errors."""

from __future__ import annotations

import warnings

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching import TRAINERS, TrainerNotAvailableError, describe, trainer_available
from slimrl.patching.registry import is_installed, patches

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


def test_unpatched_trainer_warns():
    name = next((n for n in TRAINERS if trainer_available(n) and not any(p.applies() for p in patches(n))), None)
    if name is None:
        pytest.skip("every trainer of this TRL has patches")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PatchFastRL(name)
    assert any("runs as plain TRL" in str(w.message) for w in caught)


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
    shared = [p for p in patches("dpo") if "sft" in p.algorithms and p.applies()]
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
