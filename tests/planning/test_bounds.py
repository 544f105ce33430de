"""``slimrl plan`` bounds its work: a config deeper than any released decoder or heavier than the largest GPU is
one line before any meta model is built, a budget beyond any machine too, and the longest-completion searches
(the plan's and ``--compare``'s) stop at the model's context."""

from __future__ import annotations

import json

import pytest

from slimrl.cli import plan as plan_cli
from tests.planning.test_baseline import GIB, _config


@pytest.fixture
def no_trace(monkeypatch):
    from slimrl.planning import trace

    def boom(*a, **k):
        raise AssertionError("a meta model was built for a config the planner refuses")

    monkeypatch.setattr(trace, "meta_model", boom)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_a_config_deeper_than_any_decoder_is_one_line(tmp_path, capsys, no_trace):
    _config(layers=20_000).save_pretrained(tmp_path)
    assert plan_cli.main(["--model", str(tmp_path), "--compare", "--budget", "80GB"]) == 2
    assert "20000 layers is deeper than slimrl plans (at most 512" in _one_line(capsys)


@pytest.mark.parametrize(("four_bit", "expected"), [("false", "16-bit"), ("true", "NF4")])
def test_weights_past_the_largest_gpu_are_one_line(tmp_path, capsys, no_trace, four_bit, expected):
    """hidden 65536 x 100 layers: at least 2 * 65536 * (65536 + 131072) * 100 = 2.6e12 parameters."""
    _config(hidden=65536, layers=100).save_pretrained(tmp_path)
    assert plan_cli.main(["--model", str(tmp_path), "--load_in_4bit", four_bit]) == 2
    err = _one_line(capsys)
    assert "its weights alone need at least" in err and f"({expected})" in err and "h200" in err


def test_the_bound_is_a_lower_bound_of_what_the_meta_model_counts():
    """The estimate never exceeds the parameters transformers builds (else it could refuse a model that fits), and
    is within a factor of 4 of them (a bound that still catches configs no GPU holds)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slimrl.planning.bounds import weights_lower_bound

    configs = [
        _config(),
        _config(vocab=32768, hidden=256, layers=3, tie_word_embeddings=False),
        AutoConfig.for_model(
            "qwen2_moe",
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=4,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1024,
            shared_expert_intermediate_size=64,
        ),
    ]
    for config in configs:
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        assert params / 4 <= weights_lower_bound(config) <= params, (type(config).__name__, params)


def test_a_budget_beyond_any_machine_is_one_line(capsys):
    assert plan_cli.main(["--budget", "1000000000000GB", "--compare"]) == 2
    assert "--budget 1000000000000GB: beyond any single machine's memory" in _one_line(capsys)


def test_the_longest_completion_searches_stop_at_the_context(tmp_path, capsys):
    """A roomy budget: the plan's answer and every ``--compare`` side's are the context minus the prompt (64-token
    steps), never past it."""
    _config(vocab=8192, max_position_embeddings=1000).save_pretrained(tmp_path)
    assert (
        plan_cli.main(
            [
                "--model",
                str(tmp_path),
                "--device",
                "cuda",
                "--max_completion_length",
                "128",
                "--max_prompt_length",
                "40",
                "--lora_r",
                "4",
                "--per_device_train_batch_size",
                "2",
                "--num_generations",
                "2",
                "--budget",
                "80GB",
                "--compare",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    room = (1000 - 40) // 64 * 64
    assert data["max_completion_length_that_fits"] == room
    assert {side["longest_completion"] for side in data["compare"].values()} == {room}


@pytest.mark.slow  # minutes of searches on 2 cores: make test-full runs it
def test_compare_search_is_exact_under_a_tight_budget():
    """Where memory binds, each side's answer fits and one step more does not (the search brackets and bisects)."""
    from dataclasses import replace

    from slimrl.planning.compare import compare, trl_side
    from slimrl.planning.settings import Settings

    config = _config(vocab=32768, hidden=128)
    from slimrl.patching.table import PLANNED

    s = Settings(
        workload=PLANNED["grpo"],
        per_device_train_batch_size=2,
        num_generations=2,
        max_prompt_length=32,
        max_completion_length=512,
        lora_r=8,
        device="cuda",
        gradient_checkpointing="true",
    )
    from slimrl.compat.gpus import CUDA_CONTEXT_BYTES
    from slimrl.planning.verdict import FITS_BELOW, fitting_bytes

    budget = CUDA_CONTEXT_BYTES + int(GIB / 4 / FITS_BELOW)  # "fits" up to a quarter GiB allocated
    sides = compare(config, s, budget=budget)
    n = sides["trl"]["longest_completion"]
    assert n and n % 64 == 0
    gen = sides["trl"]["phases"]["generation"]
    tokens = s.max_prompt_length + s.max_completion_length

    def peak(c):
        return trl_side(
            config,
            replace(s, max_completion_length=c),
            "fused_head",
            gen * (32 + c) // tokens,
            sides["trl"]["phases"]["runtime"],
        )["peak_bytes"]

    assert peak(n) <= fitting_bytes(budget, "cuda") < peak(n + 64)
