"""The verdict (slimrl/planning/verdict.py): fits / uncertain — measure with slimrl compare / does not fit, from the
predicted allocated peak against the budget less the CUDA context, with the band measured on TRL's published runs; the
CUDA plan's runtime phase (the context) outside the predicted max_memory_allocated."""

from __future__ import annotations

import json

import pytest

from slimrl.compat.gpus import CUDA_CONTEXT_BYTES, find_gpu
from slimrl.planning import Settings, plan
from slimrl.planning.verdict import DOES_NOT_FIT, FAILS_ABOVE, FITS, FITS_BELOW, UNCERTAIN, fitting_bytes, verdict

GIB = 2**30


@pytest.mark.parametrize(
    ("share", "word"),
    [
        (0.30, FITS),
        (FITS_BELOW, FITS),
        (FITS_BELOW + 0.01, UNCERTAIN),
        (FAILS_ABOVE, UNCERTAIN),
        (FAILS_ABOVE + 0.01, DOES_NOT_FIT),
        (1.2, DOES_NOT_FIT),
    ],
)
def test_the_three_answers_on_cuda_are_shares_of_the_card_less_its_context(share, word):
    budget = 80 * GIB
    usable = budget - CUDA_CONTEXT_BYTES
    got = verdict(int(share * usable), budget, "cuda")
    assert got.word == word and got.fits is (word == FITS)
    assert "predicted max_memory_allocated" in got.line() and got.line().startswith(word)


def test_the_band_is_the_published_runs_edges():
    """The constants are the edges measured by bench/gpu_predict.py validate (0.651 and 0.915, see the module):
    an uncertain band that is empty or inverted would make the verdict a two-way guess again."""
    assert 0.5 < FITS_BELOW <= 0.651 and 0.915 <= FAILS_ABOVE < 1.0


def test_a_cpu_budget_is_plain():
    assert verdict(10 * GIB, 10 * GIB, "cpu").word == FITS
    assert verdict(10 * GIB + 1, 10 * GIB, "cpu").word == DOES_NOT_FIT
    assert fitting_bytes(10 * GIB, "cpu") == 10 * GIB
    assert fitting_bytes(10 * GIB, "cuda") == int(FITS_BELOW * (10 * GIB - CUDA_CONTEXT_BYTES))


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )


COMMON = dict(
    per_device_train_batch_size=2, num_generations=2, max_prompt_length=16, max_completion_length=240, lora_r=4
)


def test_a_cuda_plan_counts_the_context_outside_max_memory_allocated():
    from slimrl.planning.search import PERSISTENT, largest_phase

    p = plan(_config(), Settings(device="cuda", **COMMON), search=False)
    assert p.phases["runtime"] == CUDA_CONTEXT_BYTES > 0
    held = sum(p.phases.get(k, 0) for k in PERSISTENT)
    assert p.peak_bytes == held + p.phases[largest_phase(p.phases)] - CUDA_CONTEXT_BYTES


def test_searches_aim_at_fits_on_cuda():
    config = _config()
    alone = plan(config, Settings(device="cuda", **COMMON), search=False).peak_bytes
    budget = CUDA_CONTEXT_BYTES + int(alone / 0.8)  # the run at 80 % of usable memory: uncertain
    got = plan(config, Settings(device="cuda", **COMMON), budget=budget)
    assert got.verdict == UNCERTAIN and got.fits is False
    longest = got.max_completion_length_that_fits
    assert longest is not None and longest < COMMON["max_completion_length"]
    shorter = plan(
        config, Settings(device="cuda", **{**COMMON, "max_completion_length": longest}), budget=budget, search=False
    )
    assert shorter.verdict == FITS


def test_a_named_card_is_the_budget_and_a_small_one_is_a_verdict_not_an_error():
    t4 = find_gpu("t4")
    p = plan(_config(), Settings(gpu="t4", device="cuda", **COMMON), search=False)
    assert p.budget_bytes == t4.total_bytes and p.verdict == FITS
    from transformers import LlamaConfig

    big = LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=40,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
    )
    too_big = plan(big, Settings(gpu="t4", device="cuda", **COMMON))
    assert too_big.verdict == DOES_NOT_FIT and too_big.recommended is None


@pytest.mark.parametrize(("share", "word"), [(0.5, FITS), (0.8, UNCERTAIN), (1.0, DOES_NOT_FIT)])
def test_the_cli_prints_the_verdict(tmp_path, capsys, share, word):
    from slimrl.cli import plan as plan_cli

    _config().save_pretrained(tmp_path)
    argv = [
        "--model",
        str(tmp_path),
        "--device",
        "cuda",
        "--max_prompt_length",
        "16",
        "--max_completion_length",
        "240",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
        "--lora_r",
        "4",
        "--json",
    ]
    assert plan_cli.main(argv) == 0
    peak = json.loads(capsys.readouterr().out)["peak_bytes"]
    argv = [*argv[:-1], "--budget", str(CUDA_CONTEXT_BYTES + int(peak / share))]
    assert plan_cli.main(argv) == 0
    text = capsys.readouterr().out
    assert f"B: {word};" in text and "max_memory_allocated" in text
    assert plan_cli.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == word


def test_the_planner_holds_the_configs_its_memo_names():
    """Its memo is keyed by the config's id: a config freed while its entries live would let the next config made at
    the same address (often) read its weights and traces; the planner holds each config it has entries for."""
    import gc
    import weakref

    config = _config()
    held = weakref.ref(config)
    small = plan(config, Settings(device="cuda", **COMMON), search=False).phases["weights"]
    del config
    gc.collect()
    assert held() is not None
    from transformers import LlamaConfig

    wide = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    assert plan(wide, Settings(device="cuda", **COMMON), search=False).phases["weights"] > 3 * small
