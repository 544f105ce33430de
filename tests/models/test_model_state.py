"""slimrl's record on a model it loads: one typed record, carried to the PEFT model in one place, read by every
layer through one accessor (no loose ``slimrl_*`` attributes, no untyped dict)."""

from __future__ import annotations

from slimrl import FastLanguageModel
from slimrl.compat.model_state import ATTRIBUTE, ModelState, model_state
from tests.tiny import tiny_llama, tiny_tokenizer


def test_one_record_from_loading_to_the_adapter(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    model, tokenizer = FastLanguageModel.from_pretrained(
        str(tmp_path), max_seq_length=64, max_lora_rank=8, use_gradient_checkpointing=False
    )
    state = model_state(model)
    assert isinstance(state, ModelState) and state.model_path == str(tmp_path) and state.max_lora_rank == 8
    assert state.tokenizer is tokenizer and state.processor is None and state.checkpointing_default is False
    peft = FastLanguageModel.get_peft_model(model, r=4)
    assert model_state(peft) is state and peft.__dict__[ATTRIBUTE] is state and state.checkpointing is False
    assert peft.max_seq_length == 64
    assert not [name for name in (*vars(model), *vars(peft)) if name.startswith("slimrl_") and name != ATTRIBUTE]
    assert model_state(tiny_llama()) == ModelState()  # a model slimrl did not load: the empty record
