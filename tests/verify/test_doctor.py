"""``slimrl doctor``: one screen or JSON; exit 1 when something asked for cannot work or a patch target is gone."""

from __future__ import annotations

import json

import torch

from slimrl.cli import doctor


def test_report_and_json(capsys):
    code = doctor.main([])
    text = capsys.readouterr().out
    assert "versions   python" in text and "trl " in text and "patches    " in text and "with a missing target" in text
    assert code == 0, text
    assert doctor.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["patches"]["missing"] == [] and data["versions"]["trl"] and "cpu_cores" in data["device"]


def test_a_feature_that_cannot_work_here_is_a_problem(capsys, monkeypatch):
    from slimrl.verify import doctor as facts

    versions = dict.fromkeys(facts.PACKAGES)
    monkeypatch.setattr(facts, "_version", lambda name: {"trl": "1.16.0", "torch": "2.13.0"}.get(name))
    code = doctor.main(
        ["--load_in_4bit", "--fast_inference"] + ([] if torch.cuda.is_available() else ["--device", "cuda"])
    )
    out = capsys.readouterr().out
    assert (
        code == 1 and "PROBLEM: load_in_4bit needs bitsandbytes" in out and "PROBLEM: fast_inference needs vLLM" in out
    ), (out, versions)


def test_a_missing_patch_target_is_a_problem(capsys, monkeypatch):
    from trl import GRPOTrainer

    monkeypatch.delattr(GRPOTrainer, "_get_per_token_logps_and_entropies")
    assert doctor.main([]) == 1
    assert (
        "PROBLEM: patch target trl.trainer.grpo_trainer:GRPOTrainer._get_per_token_logps_and_entropies is "
        "missing" in capsys.readouterr().out
    )


def test_model_says_whether_it_takes_the_shared_prefix_layout(tmp_path, capsys):
    """A tested family: on (a sliding window named); soft-capping or an untested family: off, with the reason; a
    model that is not there: a problem. (The attention implementation is chosen at load time, not in config.json.)"""
    from transformers import Gemma2Config, GPT2Config, LlamaConfig, MistralConfig

    small = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    cases = {
        "llama": (LlamaConfig(**small), "shared prefix: on for"),
        "mistral": (MistralConfig(**small, sliding_window=96), "sliding window (96 tokens)"),
        "gemma2": (Gemma2Config(**small, attn_logit_softcapping=50.0), "off for"),
        "gpt2": (GPT2Config(n_layer=2, n_embd=64, n_head=4), "model type 'gpt2' is not tested"),
    }
    for name, (config, expected) in cases.items():
        config.save_pretrained(tmp_path / name)
        assert doctor.main(["--model", str(tmp_path / name)]) == 0, name
        out = capsys.readouterr().out
        assert expected in out, (name, out)
    assert doctor.main(["--model", str(tmp_path / "absent")]) == 1
    assert "PROBLEM: --model" in capsys.readouterr().out


def test_a_vllm_outside_the_tested_range_is_named(capsys, monkeypatch):
    from slimrl.verify import doctor as facts

    found = {"trl": "1.16.0", "torch": "2.13.0", "vllm": "0.35.1"}
    monkeypatch.setattr(facts, "_version", lambda name: found.get(name))
    doctor.main([])
    out = capsys.readouterr().out
    assert "vllm 0.35.1 is outside the releases slimrl's engine is tested with (>=0.32,<0.33)" in out
    found["vllm"] = "0.32.0"
    doctor.main([])
    assert "outside the releases slimrl's engine" not in capsys.readouterr().out
