"""Head discovery, logit transform reading and the head-input capture."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from slimrl.compat.heads import capture_head_input, logit_transform, plain_linear_head
from tests.tiny import tiny_llama


def test_logit_transform_reads_scale_and_softcap():
    assert logit_transform(SimpleNamespace(model_type="llama")) == (1.0, None)
    assert logit_transform(SimpleNamespace(model_type="gemma2", final_logit_softcapping=30.0)) == (1.0, 30.0)
    assert logit_transform(SimpleNamespace(model_type="granite", logits_scaling=4.0)) == (0.25, None)
    assert logit_transform(SimpleNamespace(model_type="hyperclovax", logits_scaling=2.0)) == (2.0, None)
    assert logit_transform(SimpleNamespace(model_type="cohere", logit_scale=0.5)) == (0.5, None)


def test_capture_gives_final_hidden_and_skips_projection():
    model = tiny_llama().eval()
    ids = torch.randint(0, 49, (2, 9))
    with torch.no_grad():
        full = model(input_ids=ids).logits  # [2, 9, V]
        with capture_head_input(model.get_output_embeddings()) as box:
            out = model(input_ids=ids, logits_to_keep=4)
    assert out.logits.shape[1] == 0  # the head projected nothing
    hidden = box[-1]  # [2, 4, H]
    torch.testing.assert_close(hidden @ model.lm_head.weight.T, full[:, -4:], rtol=1e-5, atol=1e-5)
    # the hook is gone afterwards
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == full.shape


def test_plain_linear_head_refuses_wrapped_heads():
    model = tiny_llama()
    assert plain_linear_head(model) is model.lm_head
    model.lm_head = torch.nn.Sequential(model.lm_head)
    assert plain_linear_head(model) is None
