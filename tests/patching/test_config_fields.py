"""slimrl's extra fields on TRL's configs: real dataclass fields while patched (help, flags, to_dict), validated
before TRL's own checks, gone again after unpatch."""

from __future__ import annotations

import dataclasses
import json
import warnings
from types import SimpleNamespace

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching.config_fields import EXTRA_FIELDS
from slimrl.patching.registry import patches

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


@pytest.fixture
def patched():
    PatchFastRL()
    yield
    unpatch()


def test_every_patched_config_has_the_fields_in_help_flags_and_to_dict(patched, tmp_path):
    from trl import TrlParser

    classes = _config_classes()
    assert {c.__name__ for c in classes} >= {"GRPOConfig", "RLOOConfig", "DPOConfig", "KTOConfig", "SFTConfig",
                                               "ORPOConfig", "CPOConfig"}
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(EXTRA_FIELDS) <= names, cls.__name__
        parser = TrlParser((cls,))
        help_text = parser.format_help()
        assert "--unsloth_num_chunks" in help_text and "--max_seq_length" in help_text, cls.__name__
        (cfg,) = parser.parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--unsloth_num_chunks", "3", "--unsloth_logit_chunk_multiplier", "2",
             "--max_seq_length", "256", "--use_cpu", "true", "--bf16", "false"])
        assert (cfg.unsloth_num_chunks, cfg.unsloth_logit_chunk_multiplier, cfg.max_seq_length) == (3, 2, 256)
        saved = json.loads(cfg.to_json_string())
        assert saved["unsloth_num_chunks"] == 3 and saved["max_seq_length"] == 256, cls.__name__
        if "steps_per_generation" not in names:  # GRPO/RLOO configs reject their own replace() (TRL's post-init)
            copy = dataclasses.replace(cfg)
            assert copy.unsloth_logit_chunk_multiplier == 2, cls.__name__
        default = cls(output_dir=str(tmp_path), **CPU)
        assert default.unsloth_num_chunks == -1 and default.max_seq_length is None


@pytest.mark.parametrize(("name", "value", "message"), [
    ("unsloth_num_chunks", 0, "unsloth_num_chunks=0 is invalid: use -1"),
    ("unsloth_logit_chunk_multiplier", 0, "unsloth_logit_chunk_multiplier=0 is invalid: use an int >= 1 or None"),
    ("max_seq_length", -5, "max_seq_length=-5 is invalid: use an int >= 1 or None"),
])
def test_bad_values_are_named(patched, tmp_path, name, value, message):
    from trl import DPOConfig

    with pytest.raises(ValueError, match=message):
        DPOConfig(output_dir=str(tmp_path), **CPU, **{name: value})


def test_unpatch_removes_the_fields(tmp_path):
    from trl import DPOConfig

    PatchFastRL("dpo")
    unpatch()
    assert "unsloth_num_chunks" not in {f.name for f in dataclasses.fields(DPOConfig)}
    with pytest.raises(TypeError):
        DPOConfig(output_dir=str(tmp_path), unsloth_num_chunks=2, **CPU)


def test_max_seq_length_defaults_to_the_model_and_never_exceeds_it(patched, tmp_path):
    from trl import GRPOConfig

    from slimrl.patching.validation import check_sequence_budget

    model = SimpleNamespace(max_seq_length=128)
    cfg = GRPOConfig(output_dir=str(tmp_path), max_completion_length=16, per_device_train_batch_size=2,
                     num_generations=2, **CPU)
    check_sequence_budget(model, cfg)
    assert cfg.max_seq_length == 128
    too_big = GRPOConfig(output_dir=str(tmp_path), max_seq_length=256, max_completion_length=16,
                         per_device_train_batch_size=2, num_generations=2, **CPU)
    with pytest.raises(ValueError, match=r"max_seq_length=256 in the config is above the model's "
                                         r"max_seq_length=128 \(FastLanguageModel.from_pretrained\): lower it"):
        check_sequence_budget(model, too_big)
    small = GRPOConfig(output_dir=str(tmp_path), max_seq_length=16, max_completion_length=16,
                       per_device_train_batch_size=2, num_generations=2, **CPU)
    with pytest.raises(ValueError, match=r"leaves no room for the prompt within the config's max_seq_length=16"):
        check_sequence_budget(model, small)
