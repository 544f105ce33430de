"""The fast_inference engine on the real SmolLM2-135M (vLLM's CPU build here; ``make test-vllm``).

What must hold although sampled completions differ between engines:
(a) for a fixed prompt + completion the engine's per-token log-probs equal the training model's, with the adapter,
    before and after an optimizer step (that proves the adapter sync), and the tokens it samples carry the
    training model's log-probs;
(b) standby releases the KV cache and generation after it is still right;
(c) base weights the engine keeps in the same layout exist once.

Tolerance: both sides are float32, over a 49,152-word vocabulary; vLLM's CPU kernels (oneDNN GEMMs, its own
attention) sum in other orders than PyTorch's, which moves a log-prob by ~1e-5..1e-4; 2e-3 (0.2 % in probability)
leaves room for that and is 50x below what the adapter changes (asserted, so the comparison is not vacuous).
"""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")

ATOL = 2e-3


@pytest.fixture(scope="module")
def lora_model():
    from slimrl import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained(
        "SmolLM2-135M-Instruct",
        max_seq_length=256,
        dtype=torch.float32,
        fast_inference=True,
        max_lora_rank=16,
        gpu_memory_utilization="auto",
    )
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
    torch.manual_seed(0)
    with torch.no_grad():  # PEFT starts lora_B at zero: give the adapter an effect to sync
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.vllm_engine.max_num_seqs = 8
    return model, tok


def _ids(tok) -> list[int]:
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is 17+25?"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    return list(chat) + tok("17 + 25 = 42. The answer is 42.", add_special_tokens=False)["input_ids"]


def _engine_logps(engine, ids: list[int], lora_request) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 from the engine (prompt log-probs), [T-1]."""
    from vllm import SamplingParams

    out = engine.generate_ids(
        [ids], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0), lora_request=lora_request
    )[0]
    return torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))], dtype=torch.float64)


def _model_logps(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()  # [T-1, V]
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_engine_logprobs_equal_training_model_before_and_after_a_step(lora_model):
    model, tok = lora_model
    engine = model.vllm_engine
    ids = _ids(tok)
    first = engine.load_adapter(model)
    ours, ref = _engine_logps(engine, ids, first), _model_logps(model, ids)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    with model.disable_adapter():
        base = _model_logps(model, ids)
    assert (base - ref).abs().max() > 50 * ATOL, "the adapter changes nothing: the comparison would be vacuous"

    # One optimizer step on the adapter, then a sync: the engine follows (new id), the old adapter is gone.
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    (-_model_logps_grad(model, ids).mean()).backward()
    opt.step()
    opt.zero_grad()
    after_ref = _model_logps(model, ids)
    assert (after_ref - ref).abs().max() > 50 * ATOL, "the step changed nothing"
    stale = _engine_logps(engine, ids, first)
    torch.testing.assert_close(stale, ours, atol=ATOL, rtol=0)  # not yet synced: still the old adapter
    second = engine.load_adapter(model)
    assert second.lora_int_id == first.lora_int_id + 1
    torch.testing.assert_close(_engine_logps(engine, ids, second), after_ref, atol=ATOL, rtol=0)


def _model_logps_grad(model, ids: list[int]) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_sampled_tokens_carry_the_training_models_logprobs(lora_model):
    from vllm import SamplingParams

    model, tok = lora_model
    engine = model.vllm_engine
    engine.load_adapter(model)
    prompt = _ids(tok)[:-12]
    # No min_tokens here: it masks EOS, and processed log-probs are then those of the renormalized distribution.
    out = engine.generate_ids([prompt] * 4, SamplingParams(max_tokens=12, temperature=1.0, logprobs=0))
    for o in out:
        c = o.outputs[0]
        sampled = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)], dtype=torch.float64)
        ref = _model_logps(model, prompt + list(c.token_ids))[len(prompt) - 1 :]
        torch.testing.assert_close(sampled, ref, atol=ATOL, rtol=0)


def test_standby_releases_the_kv_cache_and_generation_stays_right(lora_model):
    from vllm import SamplingParams

    from slimrl.compat.memory import resident_bytes

    model, tok = lora_model
    engine = model.vllm_engine
    req = engine.load_adapter(model)
    ids = _ids(tok)
    engine.generate_ids([ids[:20]] * 8, SamplingParams(max_tokens=200, min_tokens=200, temperature=1.0))
    before = resident_bytes()
    released = engine.standby()
    drop = before - resident_bytes()
    touched = 8 * 220 * 2 * 30 * 3 * 64 * 4  # tokens x K,V x layers x kv heads x head dim x fp32 = ~81 MB
    assert released >= touched and drop >= 0.5 * touched, (released, drop)
    assert engine.asleep and engine.phase_peaks["generation"] > 0
    # Woken for the next generation: pages come back as zeros and no stale prefix is reused.
    torch.testing.assert_close(_engine_logps(engine, ids, req), _model_logps(model, ids), atol=ATOL, rtol=0)
    assert not engine.asleep and engine.phase_peaks["training"] > 0


def test_base_weights_shared_where_the_engine_keeps_them(lora_model):
    model, _ = lora_model
    engine = model.vllm_engine
    embed = model.get_input_embeddings().weight
    assert engine.shared_bytes >= embed.numel() * embed.element_size()  # 113 MB on CPU: embeddings = tied head
    vllm_embed = engine.llm.collective_rpc(lambda w: w.model_runner.model.model.embed_tokens.base_layer.weight)[0]
    assert embed.data_ptr() == vllm_embed.data_ptr()
    assert model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()  # tied head follows


def test_the_engine_listens_on_loopback_only(lora_model):
    """In-process engine: no server; the sockets vLLM's process group opens listen on 127.0.0.1 only."""
    import psutil

    model, _ = lora_model
    assert model.vllm_engine.llm is not None
    listening = [c for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert all(c.laddr.ip in ("127.0.0.1", "::1") for c in listening), listening


def test_the_engine_answers_as_vllms_llm(lora_model, capsys):
    """What Unsloth's notebooks call on ``model.vllm_engine`` (vLLM's ``LLM`` there): sleep before other training,
    wake_up, generate on text / token ids, chat, reset_prefix_cache, get_tokenizer, llm_engine."""
    from vllm import SamplingParams

    model, tok = lora_model
    engine = model.vllm_engine
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    first = engine.generate(["What is 2+3?"], greedy)[0].outputs[0].text
    engine.sleep()
    assert engine.asleep and "its weights are the training model's own" in capsys.readouterr().out
    assert engine.wake_up() is True and not engine.asleep
    engine.sleep(level=2)
    assert engine.generate("What is 2+3?", greedy)[0].outputs[0].text == first  # woken by the generation
    ids = tok("What is 2+3?")["input_ids"]
    assert engine.generate(ids, greedy)[0].outputs[0].text == first
    chat = engine.chat([{"role": "user", "content": "What is 2+3?"}], greedy)
    assert len(chat) == 1 and chat[0].outputs[0].token_ids
    assert engine.reset_prefix_cache() in (True, False) and engine.get_tokenizer() is not None
    assert engine.llm_engine is engine.llm.llm_engine
