"""Every device decision slimrl makes at load time, for every GPU of its table, presented through torch's CUDA API
(tests/fake_gpu.py): bf16 only where it is native, the default dtype, where the model loads."""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.gpus import GPUS, current_gpu, find_gpu
from tests.tiny import tiny_llama, tiny_tokenizer

KEYS = [g.key for g in GPUS]


@pytest.mark.parametrize("key", KEYS)
def test_bf16_is_native_only(fake_gpu, key):
    from slimrl import is_bfloat16_supported
    from slimrl.models.targets import _default_dtype

    gpu = fake_gpu(key).gpu
    assert current_gpu() == gpu
    assert torch.cuda.is_bf16_supported()  # torch counts emulation: True on every card, a T4 included
    assert is_bfloat16_supported() is (gpu.capability >= (8, 0))
    assert _default_dtype() == (torch.bfloat16 if gpu.capability >= (8, 0) else torch.float16)


def test_the_t4_and_v100_train_in_fp16(fake_gpu):
    from slimrl import is_bfloat16_supported

    for key in ("t4", "v100"):
        fake_gpu(key)
        assert not is_bfloat16_supported()
        assert find_gpu(key).dtype == torch.float16 and find_gpu(key).kv_cache_dtypes == ("auto",)


def test_names_and_errors():
    assert find_gpu("A100").key == "a100-40gb" and find_gpu("H100").capability == (9, 0)
    with pytest.raises(ValueError, match="--gpu 'k80'.*t4"):
        find_gpu("k80")


@pytest.mark.parametrize("key", ["t4", "a100-40gb", None])
def test_model_loads_on_its_gpu(fake_gpu, monkeypatch, tmp_path, key):
    """On CUDA the model is placed on the process's GPU as it loads (transformers' device_map; a notebook's
    ``inputs.to("cuda")`` works before training, host memory holds one shard at a time); on a CPU nothing is asked."""
    import slimrl.models.fast_language_model as flm

    path = tmp_path / "m"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    if key:
        fake_gpu(key)
    seen = {}

    def load(path, load_kwargs, vision):
        seen.update(load_kwargs)
        return tiny_llama(), tiny_tokenizer()

    monkeypatch.setattr(flm, "_load", load)
    flm.FastLanguageModel.from_pretrained(str(path))
    if key is None:
        assert "device_map" not in seen and seen["dtype"] == torch.float32
    else:
        assert seen["device_map"] == {"": 0} and seen["dtype"] == find_gpu(key).dtype
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    seen.clear()
    flm.FastLanguageModel.from_pretrained(str(path), device_map="cpu")  # the user's own wins
    assert seen["device_map"] == "cpu"
    if key:
        seen.clear()
        flm.FastLanguageModel.from_pretrained(str(path))
        assert seen["device_map"] == {"": 1}  # each rank on its own GPU


@pytest.mark.parametrize("key", KEYS)
def test_logprob_chunks_are_sized_for_the_gpu(fake_gpu, key):
    """slimrl's op on a GPU scores blocks of hundreds to thousands of rows (each block re-reads the head), at most a
    32nd of free memory per block; a CPU keeps 64 MiB blocks; 16 rows when memory is short."""
    from slimrl.ops.chunked_logprob import auto_chunk_rows

    gpu = fake_gpu(key)
    gpu.place(gpu.gpu.total_bytes // 3)  # a model and its optimizer state on the card
    vocab = 151_936  # Qwen's
    rows = auto_chunk_rows(10**6, vocab, torch.device("cuda", 0))
    assert rows * 4 * vocab <= max(gpu.free_bytes // 32, 16 * 4 * vocab)
    assert rows >= (800 if gpu.gpu.total_bytes >= 39 * 2**30 else 200), rows
    assert auto_chunk_rows(10**6, vocab, torch.device("cpu"), free=64 * 2**30) == 64 * 2**20 // (4 * vocab)
    gpu.place(gpu.free_bytes - 2**20)
    assert auto_chunk_rows(10**6, vocab, torch.device("cuda", 0)) == 16


def test_a_rerun_cell_reuses_the_engine_and_another_model_is_one_line(fake_gpu, tmp_path):
    """vLLM's memory pool allows one engine per process: the same model loaded again with the same settings gets
    the engine there; another model while that engine runs on a GPU is refused in one line."""
    from slimrl.models import engine_setup

    fake_gpu("a100-40gb")
    first, second, other = tiny_llama(), tiny_llama(), tiny_llama()
    engine = engine_setup.attach_engine(first, "/models/a", 512, 16, 0.6, 0, "auto")
    assert engine_setup.attach_engine(second, "/models/a", 512, 16, 0.6, 0, "auto") is engine
    assert second.vllm_engine is engine and engine.device == torch.device("cuda", 0)
    engine.llm = object()  # started
    with pytest.raises(ValueError, match="already runs vLLM's engine for '/models/a'") as err:
        engine_setup.attach_engine(other, "/models/b", 512, 16, 0.6, 0, "auto")
    assert "\n" not in str(err.value)
    engine.llm = None


def test_each_ranks_engine_is_on_its_own_gpu(fake_gpu, monkeypatch):
    from slimrl.generation.engine import SlimrlEngine

    fake_gpu("h100")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert SlimrlEngine("m", torch.bfloat16, 512, 16, 0.5).device == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert SlimrlEngine("m", torch.bfloat16, 512, 16, 0.5).device == torch.device("cuda", 0)
