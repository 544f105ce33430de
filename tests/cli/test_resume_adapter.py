"""``slimrl train --resume``: the checkpoint's adapter is held against the model's before any step
(slimrl/cli/resume.py): missing, extra or reshaped LoRA tensors are one line naming the checkpoint and what
differs; an intact adapter passes."""

from __future__ import annotations

import pytest
import torch

from slimrl.cli.resume import check_resume_matches
from slimrl.errors import InputError
from tests.patching.parity import tiny_model

RECORD = {"algorithm": "grpo", "lora_r": 4}


def _checkpoint(tmp_path, model, keep=None, reshape: str | None = None):
    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "checkpoint-2"
    model.save_pretrained(ckpt)
    tensors = load_file(ckpt / "adapter_model.safetensors")
    if keep is not None:
        tensors = dict(list(sorted(tensors.items()))[:keep])
    if reshape is not None:
        name = next(k for k in sorted(tensors) if reshape in k)
        tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
    save_file(tensors, ckpt / "adapter_model.safetensors")
    return ckpt


def test_an_intact_adapter_resumes(tmp_path):
    model = tiny_model(lora=True)
    check_resume_matches(_checkpoint(tmp_path, model), RECORD, model)


def test_half_the_lora_tensors_missing_is_one_line(tmp_path):
    model = tiny_model(lora=True)
    total = sum(1 for n, _ in model.named_parameters() if "lora_" in n)
    ckpt = _checkpoint(tmp_path, model, keep=total // 2)
    with pytest.raises(
        InputError,
        match=rf"--resume {ckpt}: its adapter does not fit this model \({total - total // 2}"
        rf" of the model's {total} LoRA tensors missing",
    ):
        check_resume_matches(ckpt, RECORD, model)


def test_lora_tensors_of_another_shape_are_one_line_not_peft_traceback(tmp_path):
    model = tiny_model(lora=True)
    ckpt = _checkpoint(tmp_path, model, reshape="lora_B")
    with pytest.raises(InputError, match=r"1 of another shape, e\.g\. .*lora_B.*: \[\d+, 4\] there"):
        check_resume_matches(ckpt, RECORD, model)


def test_an_adapter_for_other_modules_is_named(tmp_path):
    """Another run's adapter (other target modules, same rank): named by the options check first."""
    ckpt = _checkpoint(tmp_path, tiny_model(lora=True, targets=("q_proj", "v_proj", "up_proj")))
    with pytest.raises(InputError, match="LoRA target modules"):
        check_resume_matches(ckpt, RECORD, tiny_model(lora=True))
