"""The engine samples from the model the loss scores, for every decoder family the notebooks train, in 16-bit and
4-bit (vLLM's CPU build, bitsandbytes' CPU back end; ``make test-vllm``; a subset in ``make test``).

* Prompt log-probs of the engine equal the training model's, with an adapter on, per family and precision. A Qwen2
  model has q/k/v biases: the 4-bit shared path once added them twice (the training model's ``Linear4bit`` adds its
  bias, and vLLM's layer added the same bias again: 0.13 nats per token off).
* A family the shared loader cannot map (Phi-3's LongRoPE tables) loads its own copy with one line and generates.
* ``model.fast_generate`` before any trainer exists starts the engine on the training model's weights; the trainer
  built afterwards uses that engine, and two GRPO steps keep the importance ratio at 1 with nothing masked.
* A seeded ``vllm_sampling_params`` samples a group of distinct completions (and the same ones again).

Tolerances: both sides compute in fp32 from the same weights (the 4-bit ones dequantised by the same bitsandbytes
kernel); vLLM's CPU kernels and its attention sum in other orders than PyTorch's: ~6e-7 per log-prob measured on
every family here. 1e-4 leaves two orders of magnitude for other CPUs and is 1,000x below the double-bias error.
The importance ratio within 1 +- 0.02 is the issue's bar (the ratio of sequence probabilities over 8 tokens).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from slimrl.compat.model_state import model_state
from slimrl.generation import vllm_status
from tests.tiny import FAMILIES, PHI3_LONGROPE, save_tiny_family
from tests.vllm.test_engine import _engine_logps, _model_logps

pytestmark = [
    pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}"),
    pytest.mark.skipif(pytest.importorskip("bitsandbytes") is None, reason="needs bitsandbytes"),
]

ATOL = 1e-4
FAST = {("qwen2", True), ("qwen2", False), ("gemma3_text", True)}  # in make test; the rest in make test-full
TEXT = "hello world 12+7=19, the answer is 19."


def _load(directory: str, four_bit: bool, seed: int = 3407):
    from slimrl import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained(
        directory,
        max_seq_length=128,
        dtype=torch.float32,
        load_in_4bit=four_bit,
        fast_inference=True,
        max_lora_rank=8,
        gpu_memory_utilization="auto",
        random_state=seed,
    )
    return model, tok


def _peft(model):
    from slimrl import FastLanguageModel

    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
    torch.manual_seed(0)
    with torch.no_grad():  # PEFT starts lora_B at zero: give the adapter an effect
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


CASES = [
    pytest.param(
        family,
        four_bit,
        id=f"{family}-{'4bit' if four_bit else '16bit'}",
        marks=() if (family, four_bit) in FAST else pytest.mark.slow,
    )
    for family in FAMILIES
    for four_bit in (False, True)
]


@pytest.mark.parametrize(("family", "four_bit"), CASES)
def test_the_engine_scores_as_the_training_model(tmp_path, family, four_bit):
    model, tok = _load(save_tiny_family(family, tmp_path), four_bit)
    if family == "qwen2":
        assert all(m.bias.abs().min() > 0 for n, m in model.named_modules() if n.endswith(("q_proj", "k_proj")))
    model = _peft(model)
    engine = model.vllm_engine
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    ours, ref = _engine_logps(engine, ids, engine.load_adapter(model)), _model_logps(model, ids)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    assert engine.shared_bytes > 0 or not four_bit, "the 4-bit engine holds its own copy"


def test_a_family_the_loader_cannot_map_loads_its_own_copy_and_generates(tmp_path, capfd):
    """Phi-3 with LongRoPE: vLLM's rotary tables of another shape. The failed shared build registered its attention
    layers and a rotary embedding on the meta device; the default loader must not meet either."""
    from vllm import SamplingParams

    model, tok = _load(save_tiny_family("phi3", tmp_path, **PHI3_LONGROPE), four_bit=False)
    model = _peft(model)
    engine = model.vllm_engine
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    request = engine.load_adapter(model)
    assert capfd.readouterr().out.count("slimrl: the engine loads its own copy of the weights") == 1
    # its own copy of the same checkpoint: the same numbers (max_seq_length <= the original context: short factors)
    torch.testing.assert_close(_engine_logps(engine, ids, request), _model_logps(model, ids), atol=ATOL, rtol=0)
    out = engine.generate_ids([ids], SamplingParams(max_tokens=6, temperature=1.0, seed=0))[0]
    assert len(out.outputs[0].token_ids) > 0


def _separating_reward(seen: list):
    def distinct_text(completions, **kwargs):
        """A reward that differs between different completions (so a group of distinct ones has reward_std > 0)."""
        seen.extend(completions)
        return [float(sum(map(ord, c)) % 11) for c in completions]

    return distinct_text


@pytest.fixture(scope="module")
def generate_first_run(tmp_path_factory):
    """Tiny 4-bit Qwen2 (biased) with ``fast_inference``: ``fast_generate`` first, then a GRPO trainer with a seeded
    ``vllm_sampling_params`` (as every Unsloth GRPO notebook sets it), two steps."""
    from datasets import Dataset
    from vllm import SamplingParams

    from slimrl import FastLanguageModel, PatchFastRL, unpatch

    PatchFastRL("grpo", FastLanguageModel)
    try:
        from trl import GRPOConfig, GRPOTrainer

        model, tok = _load(save_tiny_family("qwen2", tmp_path_factory.mktemp("qwen2")), four_bit=True)
        model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
        engine = model.vllm_engine
        before = model.fast_generate(["hello"], sampling_params=SamplingParams(max_tokens=4, temperature=1.0))
        llm = engine.llm
        seen: list = []
        cfg = GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("grpo")),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            max_steps=2,
            learning_rate=1e-3,
            beta=0.0,
            temperature=1.0,
            seed=3407,
            report_to="none",
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            logging_steps=1,
            vllm_sampling_params=SamplingParams(seed=3407, temperature=1.0),
        )
        prompts = Dataset.from_dict({"prompt": [f"what is {i}+{i}?" for i in range(16)]})
        trainer = GRPOTrainer(
            model=model, args=cfg, train_dataset=prompts, processing_class=tok, reward_funcs=[_separating_reward(seen)]
        )
        trainer.train()
        yield trainer, model, before, llm, seen
    finally:
        unpatch()


def test_generate_before_train_runs_on_the_training_weights_and_the_trainer_reuses_it(generate_first_run):
    from slimrl.generation.engine import _engine_model
    from slimrl.generation.shared_loader import is_4bit

    trainer, model, before, llm, _ = generate_first_run
    assert len(before[0].outputs[0].token_ids) > 0
    engine = model.vllm_engine
    assert engine.llm is llm, "the trainer started another engine"
    assert engine.timings["syncs"] == 2
    # the engine's decoder layers are the training model's 4-bit modules (no 16-bit copy of them)
    vllm_model = engine.llm.collective_rpc(_engine_model)[0]
    run_by_engine = [
        m for layer in vllm_model.modules() for m in getattr(getattr(layer, "quant_method", None), "modules", [])
    ]
    assert run_by_engine and all(is_4bit(m.weight) for m in run_by_engine)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for row in logs:
        assert abs(row["sampling/importance_sampling_ratio/mean"] - 1) <= 0.02, row
        assert all(v == 0 for k, v in row.items() if k.startswith("sampling/is_masked")), row


def test_a_seeded_sampling_params_samples_a_group_of_distinct_completions(generate_first_run):
    trainer, _, _, _, seen = generate_first_run
    groups = [seen[i : i + 4] for i in range(0, len(seen), 4)]
    assert len(groups) == 4  # 2 steps x 8 completions
    assert all(len(set(g)) == 4 for g in groups), groups
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(row["reward_std"] > 0 and row["frac_reward_zero_std"] < 1 for row in logs), logs


def test_the_same_seed_samples_the_same_group_again(generate_first_run):
    from vllm import SamplingParams

    from slimrl.generation.trl_backend import SlimrlVLLMGeneration

    _, model, _, _, _ = generate_first_run
    generation = SlimrlVLLMGeneration(
        model.vllm_engine, model, None, max_completion_length=8, sampling_params=SamplingParams(seed=11)
    )
    prompt = model_state(model).tokenizer("what is 3+4?", add_special_tokens=False)["input_ids"]
    first = generation.generate([prompt] * 4 + [prompt[:-1]] * 4, None, 4)[1]
    again = generation.generate([prompt] * 4 + [prompt[:-1]] * 4, None, 4)[1]
    assert first == again
    assert len({tuple(c) for c in first[:4]}) == 4 and len({tuple(c) for c in first[4:]}) == 4


def test_a_batch_of_identical_groups_is_named_once(generate_first_run, monkeypatch):
    """Sampling that can draw only one completion (top_k=1) gives every group reward_std 0: one line says so."""
    from vllm import SamplingParams

    from slimrl.generation.trl_backend import SlimrlVLLMGeneration

    _, model, _, _, _ = generate_first_run
    monkeypatch.setattr(SlimrlVLLMGeneration, "said_identical", False)
    prompt = model_state(model).tokenizer("what is 3+4?", add_special_tokens=False)["input_ids"]
    spread = SlimrlVLLMGeneration(
        model.vllm_engine, model, None, max_completion_length=8, sampling_params=SamplingParams(seed=5)
    )
    greedy = SlimrlVLLMGeneration(
        model.vllm_engine, model, None, max_completion_length=8, sampling_params=SamplingParams(top_k=1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spread.generate([prompt] * 4, None, 4)  # distinct draws: nothing said
    with pytest.warns(UserWarning, match="completions in this generation batch were identical") as said:
        greedy.generate([prompt] * 4 + [prompt[:-1]] * 4, None, 4)
        greedy.generate([prompt] * 4, None, 4)
    assert len([w for w in said if "identical" in str(w.message)]) == 1


def test_a_checkpoint_saved_in_4bit_starts_the_engine_on_its_own_4bit_weights(tmp_path):
    """A saved bitsandbytes model (``quantization_config`` in config.json, as ``unsloth/*-bnb-4bit`` names are):
    vLLM (>= 0.28) has no bitsandbytes method and refused the start ("Unknown quantization method"); the engine is
    built on the trainer's 4-bit modules instead, and scores as the trainer does."""
    import json

    model, tok = _load(save_tiny_family("qwen2", tmp_path / "src"), four_bit=True)
    del model.vllm_engine  # the first engine is not needed: only its checkpoint
    model.save_pretrained(tmp_path / "bnb")
    tok.save_pretrained(tmp_path / "bnb")
    assert (
        json.loads((tmp_path / "bnb" / "config.json").read_text())["quantization_config"]["quant_method"]
        == "bitsandbytes"
    )
    model, tok = _load(str(tmp_path / "bnb"), four_bit=False)  # as written in notebooks: the checkpoint says 4-bit
    model = _peft(model)
    engine = model.vllm_engine
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(
        _engine_logps(engine, ids, engine.load_adapter(model)), _model_logps(model, ids), atol=ATOL, rtol=0
    )
    assert engine.shared_bytes > 0, "the engine holds its own copy"


def test_vllms_own_sleep_and_load_weights_leave_the_shared_weights_alone(tmp_path, capsys):
    """``model.vllm_engine.llm`` is vLLM's ``LLM``: its ``sleep(level=2)`` would discard the weights vLLM allocated
    (the packed q/k/v the trainer's projections are views of) and ``load_weights`` would write into the trainer's
    tensors (and stops on vLLM's CPU build: no ``weight_loader``). The first releases the KV cache only, with one
    line; the second is refused in one line before anything is written."""
    from slimrl.generation.engine import _engine_model

    model, tok = _load(save_tiny_family("qwen2", tmp_path), four_bit=False)
    model = _peft(model)
    engine = model.vllm_engine
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    request = engine.load_adapter(model)
    before = _engine_logps(engine, ids, request)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    capsys.readouterr()
    engine.llm.sleep(level=2)
    assert capsys.readouterr().out.count("released the engine's KV cache") <= 1
    engine.llm.wake_up()
    vllm_model = engine.llm.collective_rpc(_engine_model)[0]
    name, tensor = next((n, p) for n, p in vllm_model.named_parameters() if "qkv_proj" in n)
    with pytest.raises(RuntimeError, match="load_weights would write into them"):
        vllm_model.load_weights([(name, torch.zeros_like(tensor))])
    assert all(torch.equal(p.detach(), weights[n]) for n, p in model.named_parameters() if "lora_" not in n)
    torch.testing.assert_close(_engine_logps(engine, ids, request), before, atol=ATOL, rtol=0)


def test_shared_parameters_keep_vllms_classes_and_attributes():
    """What the shared loader puts in place of a vLLM parameter is of the same class, with the same attributes
    (``weight_loader`` and the rest), and holds the training model's tensor itself."""
    from vllm.model_executor.parameter import ModelWeightParameter

    from slimrl.generation.shared_loader import _like

    def loader(*a):
        return None

    old = ModelWeightParameter(data=torch.empty(4, 2, device="meta"), input_dim=1, output_dim=0, weight_loader=loader)
    tensor = torch.randn(4, 2)
    new = _like(old, tensor)
    assert type(new) is ModelWeightParameter and new.weight_loader is loader and new.input_dim == 1
    assert new.data_ptr() == tensor.data_ptr() and not new.requires_grad
    plain = torch.nn.Parameter(torch.empty(3, device="meta"), requires_grad=False)
    plain.weight_loader = loader
    assert type(_like(plain, torch.zeros(3))) is torch.nn.Parameter and _like(plain, torch.zeros(3)).weight_loader
