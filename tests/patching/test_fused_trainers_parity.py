"""DPO, KTO and SFT on TRL's fused LM head (TRL >= 1.15): patched vs unpatched loss, gradients and metrics.

Every loss type the installed config documents is run, on a full fine-tune of a tiny Llama (the head's weight
gradient is checked too, tied to the embeddings) and, for DPO, through a LoRA adapter (reference = adapter off).
See tests/patching/fused_parity.py for the method and the tolerance.
"""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.trl_info import config_choices, trl_version
from tests.patching.fused_parity import assert_parity
from tests.tiny import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.skipif(trl_version().release < (1, 15), reason="TRL < 1.15 has no fused LM head")

COMMON = dict(per_device_train_batch_size=4, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
              gradient_checkpointing=False, max_steps=1, seed=3)

PAIRS = [
    {"prompt": "1+2=", "chosen": "3.", "rejected": "12 or 4."},
    {"prompt": "what is 3+4?", "chosen": "7", "rejected": "34"},
    {"prompt": "5+6=", "chosen": "11, easy.", "rejected": "56"},
    {"prompt": "7+8=", "chosen": "15", "rejected": "it is 78?"},
]


def _dpo_loss_types() -> list[str]:
    from trl import DPOConfig

    return config_choices(DPOConfig)


def dpo_trainer(tmp_path, lora: bool = False, **cfg):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model = tiny_llama(seed=0)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False, task_type="CAUSAL_LM"))
    ref = None if lora else tiny_llama(seed=0)  # TRL 1.16 would load the reference from the model's path
    args = DPOConfig(output_dir=str(tmp_path), **{**COMMON, **cfg})
    return DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(PAIRS),
                      processing_class=tiny_tokenizer())


@pytest.mark.parametrize("loss_type", _dpo_loss_types())
def test_dpo_parity_every_loss_type(tmp_path, loss_type):
    extra = {"robust": {"label_smoothing": 0.1}, "exo_pair": {"label_smoothing": 1e-3}}.get(loss_type, {})
    metrics = assert_parity(dpo_trainer(tmp_path, loss_type=[loss_type], **extra), "dpo")
    assert metrics, "TRL logged no metrics"


def test_dpo_parity_lora_wpo_weighting_and_ld_alpha(tmp_path):
    """LoRA (reference = adapter disabled), WPO weights (``log_sum_sq_probs``) and LD-DPO's length split."""
    assert_parity(dpo_trainer(tmp_path, lora=True, use_weighting=True, ld_alpha=0.5), "dpo")


def test_dpo_parity_combined_losses(tmp_path):
    assert_parity(dpo_trainer(tmp_path, loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5]), "dpo")


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_kto_parity_every_loss_type(tmp_path, loss_type):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    rows = [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"} for r in PAIRS
            for k in ("chosen", "rejected")]
    args = KTOConfig(output_dir=str(tmp_path), loss_type=loss_type, **COMMON)
    trainer = KTOTrainer(model=tiny_llama(seed=0), ref_model=tiny_llama(seed=0), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer())
    assert_parity(trainer, "kto")


def _sft_loss_types() -> list[str]:
    from trl import SFTConfig

    return [t for t in config_choices(SFTConfig) if t != "chunked_nll"]  # chunked_nll: TRL's own non-fused path


@pytest.mark.parametrize("loss_type", _sft_loss_types())
@pytest.mark.parametrize("completion_only", [True, False])
def test_sft_parity_every_loss_type(tmp_path, loss_type, completion_only):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in PAIRS]
    args = SFTConfig(output_dir=str(tmp_path), loss_type=loss_type, completion_only_loss=completion_only, **COMMON)
    trainer = SFTTrainer(model=tiny_llama(seed=0), args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tiny_tokenizer())
    assert_parity(trainer, "sft")


def run_rloo(tmp_path, beta: float, lora: bool):
    """Two RLOO steps (SGD, so updates are proportional to gradients); returns completions seen, updates, losses."""
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    model = tiny_llama(seed=0)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                 init_lora_weights=False, task_type="CAUSAL_LM"))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen: list[list[str]] = []

    def reward_digits(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    args = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=12, max_steps=2, num_iterations=2, learning_rate=0.5, optim="sgd",
                      lr_scheduler_type="constant", beta=beta, temperature=0.9, report_to="none", use_cpu=True,
                      bf16=False, save_strategy="no", logging_steps=1, seed=7, gradient_checkpointing=False)
    ds = Dataset.from_list([{"prompt": p["prompt"]} for p in PAIRS])
    kwargs = {} if lora else {"ref_model": tiny_llama(seed=0)} if "ref_model" in _rloo_params() else {}
    trainer = RLOOTrainer(model=model, args=args, reward_funcs=[reward_digits], train_dataset=ds,
                          processing_class=tiny_tokenizer(), **kwargs)
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return seen, deltas, losses


def _rloo_params() -> set[str]:
    import inspect

    from trl import RLOOTrainer

    return set(inspect.signature(RLOOTrainer.__init__).parameters)


@pytest.mark.parametrize(("beta", "lora"), [(0.05, True), (0.0, False)])
def test_rloo_parity_two_steps(tmp_path, beta, lora):
    """Generation, old log-probs (num_iterations=2), reference KL and the update, TRL alone vs patched."""
    from slimrl import PatchFastRL, unpatch
    from slimrl.patching.fused_head import SlimrlChunkedLogProbFunction
    from tests.patching.fused_parity import rel

    unpatch()
    ref_seen, ref_deltas, ref_losses = run_rloo(tmp_path / "trl", beta, lora)
    calls = SlimrlChunkedLogProbFunction.calls
    PatchFastRL("rloo")
    try:
        seen, deltas, losses = run_rloo(tmp_path / "slim", beta, lora)
    finally:
        unpatch()
    assert SlimrlChunkedLogProbFunction.calls > calls, "slimrl's kernel was not called"
    assert seen == ref_seen, "patched run sampled different completions"
    assert any(d.abs().max() > 0 for d in ref_deltas.values()), "no update happened: the test would be vacuous"
    for name, ref in ref_deltas.items():
        assert rel(deltas[name], ref) <= 1e-4, f"{name}: relative error {rel(deltas[name], ref):.2e}"
    assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-6)
