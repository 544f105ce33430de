"""slimrl's extra fields on TRL's configs: real dataclass fields while patched (help, flags, to_dict), validated
before TRL's own checks, gone again after unpatch."""

from __future__ import annotations

import dataclasses
import json
import warnings
from types import SimpleNamespace

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching.every_trainer.config_fields import EXTRA_FIELDS, ONLINE_FIELDS
from slimrl.patching.machinery.registry import patches

CPU = dict(report_to="none", use_cpu=True, bf16=False)


def _config_classes() -> list[type]:
    """Every config class whose fields slimrl extends on this TRL."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in patches():
            if p.attribute == "__dataclass_fields__" and p.applies():
                out.append(p.resolve())
    return out


def _own_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("help", "").startswith("slimrl:")}


def test_every_patched_config_has_its_fields_in_help_flags_and_to_dict(patched, tmp_path):
    from trl import TrlParser

    classes = _config_classes()
    assert {c.__name__ for c in classes} >= {
        "GRPOConfig",
        "RLOOConfig",
        "DPOConfig",
        "KTOConfig",
        "SFTConfig",
        "ORPOConfig",
        "CPOConfig",
        "RewardConfig",
        "OnlineDPOConfig",
    }
    for cls in classes:
        own = _own_fields(cls)
        if not own:
            continue  # Reward, PRM, PPO: no field acts there (refused below)
        parser = TrlParser((cls,))
        help_text = parser.format_help()
        argv = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]
        values = {
            "unsloth_num_chunks": 3,
            "unsloth_logit_chunk_multiplier": 2,
            "max_seq_length": 256,
            "unsloth_grpo_mini_batch": None,
            "slimrl_reuse_old_logps": False,
            "slimrl_length_groups": False,
            "slimrl_shared_prefix": False,
            "slimrl_token_budget": 4096,
            "slimrl_oom_recovery": False,
            "slimrl_auto_fit": True,
            "slimrl_memory_budget": "12GB",
            "slimrl_longest_first": True,
            "slimrl_health": False,
            "slimrl_health_window": 7,
            "slimrl_health_min_groups": 8,
            "slimrl_health_zero_std": 0.5,
            "slimrl_health_truncated": 0.25,
            "slimrl_health_entropy_drop": 0.2,
            "slimrl_health_kl_max": 3.0,
            "slimrl_health_clip_max": 0.75,
            "slimrl_health_reward_z": 3.0,
            "slimrl_health_mismatch_kl": 0.02,
            "slimrl_health_mismatch_masked": 0.3,
            "slimrl_health_mismatch_ratio": 0.5,
            "slimrl_truncated_sampling_fix": True,
        }
        for name in own:
            assert f"--{name}" in help_text, (cls.__name__, name)
            if values[name] is not None:
                argv += [f"--{name}", str(values[name])]
        (cfg,) = parser.parse_args_into_dataclasses(argv)
        saved = json.loads(cfg.to_json_string())
        for name in own:
            if values[name] is not None:
                assert getattr(cfg, name) == values[name] and saved[name] == values[name], (cls.__name__, name)
        if "steps_per_generation" not in _own_fields(cls) | {f.name for f in dataclasses.fields(cls)}:
            copy = dataclasses.replace(cfg)  # GRPO/RLOO configs reject their own replace() (TRL's post-init)
            assert copy.unsloth_logit_chunk_multiplier == 2, cls.__name__
        default = cls(output_dir=str(tmp_path), **CPU)
        assert default.unsloth_num_chunks == -1


def test_fields_follow_what_acts_on_each_trainer(patched):
    from slimrl.compat.trl_info import has_fused_head
    from slimrl.patching import trainer_and_config

    chunking = {"unsloth_num_chunks", "unsloth_logit_chunk_multiplier"}
    expected = {
        "grpo": set(EXTRA_FIELDS),
        "rloo": set(ONLINE_FIELDS),
        "orpo": chunking,
        "cpo": chunking,
        "online_dpo": chunking,
        "reward": set(),
        "dpo": chunking if has_fused_head() else set(),
        "kto": chunking if has_fused_head() else set(),
        "sft": chunking if has_fused_head() else set(),
    }
    from slimrl.patching import trainer_available

    if trainer_available("bco"):
        expected.update(bco=chunking, xpo=chunking, prm=set(), ppo=set())
    for name, fields in expected.items():
        assert _own_fields(trainer_and_config(name)[1]) == fields, name


def test_a_field_that_would_do_nothing_is_refused_unless_default(patched, tmp_path):
    """Accepted-and-ignored would be a silent no-op: the default (what Unsloth scripts pass) is dropped, any other
    value is refused with the reason."""
    from slimrl.patching import trainer_and_config

    reward_config = trainer_and_config("reward")[1]
    cfg = reward_config(output_dir=str(tmp_path), unsloth_num_chunks=-1, unsloth_grpo_mini_batch=None, **CPU)
    assert not hasattr(cfg, "unsloth_num_chunks")
    with pytest.raises(
        ValueError,
        match=r"RewardConfig\(unsloth_num_chunks=4\) has no effect with trl .*: "
        r"this trainer has no vocabulary-sized log-prob pass that slimrl chunks; "
        r"remove it",
    ):
        reward_config(output_dir=str(tmp_path), unsloth_num_chunks=4, **CPU)
    from trl import DPOConfig

    with pytest.raises(
        ValueError,
        match=r"DPOConfig\(unsloth_grpo_mini_batch=2\) has no effect .*no no-grad .*"
        r"\(it acts on GRPO, RLOO\)",
    ):
        DPOConfig(output_dir=str(tmp_path), unsloth_grpo_mini_batch=2, **CPU)


def test_max_seq_length_is_max_length_where_the_config_has_it(patched, tmp_path):
    """SFTConfig(max_seq_length=N) is TRL's old spelling of max_length (and Unsloth's on every config): renamed with
    the legacy warning, never swallowed."""
    from trl import DPOConfig, SFTConfig

    for cls in (SFTConfig, DPOConfig):
        with pytest.warns(
            FutureWarning,
            match=rf"{cls.__name__}\(max_seq_length=...\) is deprecated; use "
            r"max_length=...",
        ):
            cfg = cls(output_dir=str(tmp_path), max_seq_length=77, **CPU)
        assert cfg.max_length == 77


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("unsloth_num_chunks", 0, "unsloth_num_chunks=0 is invalid: use -1"),
        ("unsloth_logit_chunk_multiplier", 0, "unsloth_logit_chunk_multiplier=0 is invalid: use an int >= 1 or None"),
        ("max_seq_length", -5, "max_seq_length=-5 is invalid: use an int >= 1 or None"),
    ],
)
def test_bad_values_are_named(patched, tmp_path, name, value, message):
    from trl import GRPOConfig

    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), **CPU, **{name: value})


def test_unpatch_removes_the_fields(tmp_path):
    from trl import GRPOConfig

    PatchFastRL("grpo")
    unpatch()
    assert "unsloth_num_chunks" not in {f.name for f in dataclasses.fields(GRPOConfig)}
    with pytest.raises(TypeError):
        GRPOConfig(output_dir=str(tmp_path), unsloth_num_chunks=2, **CPU)


def test_max_seq_length_defaults_to_the_model_and_never_exceeds_it(patched, tmp_path):
    from trl import GRPOConfig

    from slimrl.patching.every_trainer.validation import check_sequence_budget

    model = SimpleNamespace(max_seq_length=128)
    cfg = GRPOConfig(
        output_dir=str(tmp_path), max_completion_length=16, per_device_train_batch_size=2, num_generations=2, **CPU
    )
    check_sequence_budget(model, cfg)
    assert cfg.max_seq_length == 128
    too_big = GRPOConfig(
        output_dir=str(tmp_path),
        max_seq_length=256,
        max_completion_length=16,
        per_device_train_batch_size=2,
        num_generations=2,
        **CPU,
    )
    with pytest.raises(
        ValueError,
        match=r"max_seq_length=256 in the config is above the model's "
        r"max_seq_length=128 \(FastLanguageModel.from_pretrained\): lower it",
    ):
        check_sequence_budget(model, too_big)
    small = GRPOConfig(
        output_dir=str(tmp_path),
        max_seq_length=16,
        max_completion_length=16,
        per_device_train_batch_size=2,
        num_generations=2,
        **CPU,
    )
    with pytest.raises(ValueError, match=r"leaves no room for the prompt within the config's max_seq_length=16"):
        check_sequence_budget(model, small)


def test_readme_field_table_is_current():
    """The README's table of fields is :func:`slimrl.patching.doc_tables.field_table` (paste it from there)."""
    from pathlib import Path

    from slimrl.patching.doc_tables import field_table

    readme = (Path(__file__).resolve().parents[2] / "docs" / "train.md").read_text()
    assert field_table() in readme, (
        "docs/train.md's field table is stale: paste slimrl.patching.doc_tables.field_table()"
    )


def test_every_field_is_declared_once_with_its_check_and_reason():
    from slimrl.patching.every_trainer.config_fields import FIELDS, validate_extra

    assert len({f.name for f in FIELDS}) == len(FIELDS)
    for field in FIELDS:
        assert validate_extra(field.name, field.default) == field.default or field.default is None
        assert field.no_effect and field.help and field.acts_on in ("log-probs", "online", "grpo")
        with pytest.raises(ValueError, match=f"{field.name}=.* is invalid"):
            validate_extra(field.name, object())


def test_every_read_goes_through_the_typed_fields():
    """One record of slimrl's fields (``fields_of``): the declared default where a config lacks a field, each value
    through its field's check; the health checks' standalone defaults are the fields' defaults (stated once)."""
    import dataclasses
    from types import SimpleNamespace

    from slimrl.health.checks import LIMITS, Thresholds
    from slimrl.patching.every_trainer.extra_fields import FIELDS, fields_of
    from slimrl.patching.online.health import thresholds_of

    bare = fields_of(SimpleNamespace())
    assert {f.name: getattr(bare, f.name) for f in FIELDS} == {f.name: f.default for f in FIELDS}
    assert fields_of(SimpleNamespace(unsloth_num_chunks=None)).unsloth_num_chunks == -1
    with pytest.raises(ValueError, match="unsloth_num_chunks=0 is invalid"):
        fields_of(SimpleNamespace(unsloth_num_chunks=0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        bare.slimrl_health = False
    assert {n: getattr(Thresholds(), n) for n in LIMITS} == {n: getattr(bare, f"slimrl_health_{n}") for n in LIMITS}
    args = SimpleNamespace(
        slimrl_health_window=9,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        num_generations=2,
        logging_steps=1,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
    )
    assert thresholds_of(args).window == 9


def test_no_config_field_is_read_by_its_name_outside_the_fields_module():
    import re
    from pathlib import Path

    import slimrl

    pattern = re.compile(r"getattr\([^,()]*args[^,()]*, f?\"(unsloth|slimrl)_")
    root = Path(slimrl.__file__).parent
    found = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        if p.name != "extra_fields.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found
