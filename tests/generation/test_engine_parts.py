"""Engine pieces that need no vLLM: KV-cache sizing, host page release, base-weight sharing with a packed layout."""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.vllm_info import kv_bytes_per_token
from slimrl.generation import memory
from slimrl.generation.weights import adapter_tensors, share_base_weights
from tests.tiny import tiny_llama

CPU = torch.device("cpu")
GIB = 2**30


def test_kv_bytes_per_token_from_the_config():
    cfg = tiny_llama().config  # 2 layers, 2 KV heads, head_dim 32 / 4 = 8
    assert kv_bytes_per_token(cfg, torch.float32) == 2 * 2 * 2 * 8 * 4
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 2 * 2 * 2 * 8 * 2


def test_auto_sizes_from_what_training_leaves(monkeypatch):
    monkeypatch.setattr(memory, "free_bytes_as_vllm_measures", lambda device: 10 * GIB)
    # room = (10 GiB - 3 x 1 GiB trainable) x 0.75 = 5.25 GiB; the batch would fill 2 GiB -> 2 GiB
    assert memory.kv_cache_bytes("auto", CPU, per_token=2**20, max_tokens=2048, trainable_bytes=GIB) == 2 * GIB
    # a batch wanting 8 GiB gets the room
    assert memory.kv_cache_bytes("auto", CPU, 2**20, 8192, GIB) == int(7 * GIB * 0.75)
    with pytest.raises(MemoryError, match="gpu_memory_utilization=.auto.: too little memory left"):
        memory.kv_cache_bytes("auto", CPU, 2**20, 8192, 4 * GIB)


def test_fraction_means_share_of_the_host_on_cpu_and_is_vllms_on_cuda(monkeypatch):
    monkeypatch.setattr(memory, "total_bytes", lambda device: 16 * GIB)
    assert memory.kv_cache_bytes(0.25, CPU, 2**20, 8192, 0) == 4 * GIB
    assert memory.kv_cache_bytes(0.25, CPU, 2**20, 1024, 0) == GIB  # never more than the batch can use
    assert memory.kv_cache_bytes(0.5, torch.device("cuda"), 2**20, 1024, 0) is None
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be a float in \(0, 1\) or 'auto', got 1.5"):
        memory.kv_cache_bytes(1.5, CPU, 2**20, 1024, 0)


def test_release_host_pages_returns_memory_and_leaves_zeros():
    kv = torch.ones(64 * 2**20 // 4)  # 64 MiB, every page touched
    from slimrl.compat.memory import resident_bytes

    before = resident_bytes()
    released = memory.release_host_pages([kv, kv[10:]])  # the second view shares the storage: counted once
    drop = before - resident_bytes()
    assert 63 * 2**20 <= released <= 64 * 2**20 and drop >= 48 * 2**20, (released, drop)
    inner = kv[1024:-1024]  # whole pages inside the storage read back as zeros
    assert float(inner.abs().sum()) == 0.0
    kv.fill_(2.0)  # and the tensor is still usable
    assert float(kv[5]) == 2.0


class _PackedEngine(torch.nn.Module):
    """vLLM's layout for a Llama: q/k/v and gate/up packed, LoRA wrappers' ``base_layer`` in the names."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, hf):
        super().__init__()
        sd = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in hf.state_dict().items()}
        self.params = {}
        for name, tensor in sd.items():
            if any(p in name for p in ("k_proj", "v_proj", "up_proj", "lora_")):
                continue
            if "q_proj" in name:
                layer = name.rsplit(".q_proj", 1)[0]
                tensor = torch.cat([sd[f"{layer}.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
                name = f"{layer}.qkv_proj.base_layer.weight"
            elif "gate_proj" in name:
                layer = name.rsplit(".gate_proj", 1)[0]
                tensor = torch.cat([sd[f"{layer}.{p}.weight"] for p in ("gate_proj", "up_proj")])
                name = f"{layer}.gate_up_proj.base_layer.weight"
            self.params[name] = torch.nn.Parameter(tensor.clone(), requires_grad=False)

    def named_parameters(self, *args, **kwargs):
        return iter(self.params.items())


def test_every_frozen_base_weight_becomes_a_view_of_the_engines(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    engine = _PackedEngine(model)
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    assert share_base_weights(model, engine) == frozen  # every frozen parameter, packed ones sliced
    q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    k = model.base_model.model.model.layers[0].self_attn.k_proj.weight
    qkv = engine.params["model.layers.0.self_attn.qkv_proj.base_layer.weight"]
    assert q.data_ptr() == qkv.data_ptr() and k.data_ptr() == qkv[q.shape[0] :].data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)
    # A weight that differs is never shared.
    engine2 = _PackedEngine(model)
    with torch.no_grad():
        engine2.params["model.norm.weight"].add_(1.0)
    model2 = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"]))
    assert share_base_weights(model2, engine2) < sum(
        p.numel() * p.element_size() for p in model2.parameters() if not p.requires_grad
    )
    assert model2.base_model.model.model.norm.weight.data_ptr() != engine2.params["model.norm.weight"].data_ptr()


def test_adapter_tensors_are_copies_with_peft_file_names():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    tensors, config = adapter_tensors(model, torch.float32)
    assert set(tensors) == {
        f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{ab}.weight" for i in range(2) for ab in "AB"
    }
    a = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
    copy = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert torch.equal(copy, a) and copy.data_ptr() != a.data_ptr()  # vLLM scales in place: never hand over a
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["target_modules"] == ["q_proj"]
