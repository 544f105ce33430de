"""GPU answers without a GPU: TRL alone (and TRL + Liger) simulated on the meta device (``slimrl.planning.baseline``),
validated against TRL's published GPU measurements, and slimrl's own prediction (``slimrl.plan``) beside it.

    python bench/gpu_predict.py validate     # TRL v1.15.0's published table (gemma-3-1b, 79 GiB): 20 figures
    python bench/gpu_predict.py predict      # docs/BENCHMARKS.md's "GPU, predicted" rows

``validate`` reproduces the release's "Fused LM head: up to 6.9x longer sequences" table: the peak at 8,192 tokens
and the longest trainable length (multiples of 1,024 whose simulated allocated peak stays under
``slimrl.planning.verdict.LIKELY`` of the 79 GiB less the CUDA context) of DPO, KTO (batch
size 2), GRPO and RLOO (scoring: the policy's log-prob pass and its backward, no generation) and SFT (``nll``),
with TRL 1.14.2's head (full logits) and 1.15.0's (the fused head). What is assumed of TRL's runs (not published
with the table): full fine-tuning, bf16 weights, AdamW's state already allocated (a later step), gradient
checkpointing on, SDPA, batch size 1 (KTO 2), TRL's default reference model where the trainer keeps one.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

GIB = 2**30
# gemma-3-1b (google/gemma-3-1b-it config.json); TRL's runs went past its 32k positions
GEMMA3_1B = dict(
    model_type="gemma3_text",
    hidden_size=1152,
    intermediate_size=6912,
    num_hidden_layers=26,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    vocab_size=262144,
    sliding_window=512,
    max_position_embeddings=131072,
    query_pre_attn_scalar=256,
    rope_theta=1e6,
    final_logit_softcapping=None,
    tie_word_embeddings=True,
)
# TRL v1.15.0 release notes: trainer -> (rows, {release: (max trainable length, peak GiB at 8,192 tokens)})
PUBLISHED = {
    "dpo": (1, {"1.14.2": (10240, 48.97), "1.15.0": (59392, 12.00)}),
    "kto": (2, {"1.14.2": (9216, 64.91), "1.15.0": (63488, 11.98)}),
    "grpo": (1, {"1.14.2": (28672, 24.15), "1.15.0": (114688, 10.30)}),
    "rloo": (1, {"1.14.2": (23552, 29.28), "1.15.0": (100352, 14.02)}),
    "sft": (1, {"1.14.2": (20480, 30.33), "1.15.0": (107520, 8.87)}),
}
CAPACITY = 79 * GIB
# The published DPO and KTO runs held a bf16 reference, not TRL's float32 default (model_init_kwargs set the dtype):
# DPO - SFT at 1.15 is 3.13 GiB, less than a float32 copy of gemma-3-1b alone (3.72); RLOO - GRPO is exactly 3.72
REFERENCE_DTYPES = {"dpo": torch.bfloat16, "kto": torch.bfloat16}


def gemma3_1b():
    from transformers import AutoConfig

    fields = dict(GEMMA3_1B)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config._attn_implementation = "sdpa"
    return config


def longest(peak_at, capacity: int, step: int = 1024, top: int = 262144) -> int:
    """Largest multiple of ``step`` (<= ``top``) whose ``peak_at(tokens)`` fits ``capacity`` (0: none fits)."""
    lo, hi = 0, top // step + 1  # lo fits (0 trivially), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak_at(mid * step) <= capacity else (lo, mid)
    return lo * step


def validate() -> list[dict]:
    """Each published run simulated: its peak at 8,192 tokens, its longest length where the simulated allocated peak
    stays under the verdict's likely share of the card less the CUDA context (``LIKELY``), the same without any
    allocator margin, and the shares of usable memory at the published length (it trained) and 1,024 tokens more (it
    ran out): the edges of ``slimrl.planning.verdict``'s band."""
    import functools

    from slimrl.compat.gpus import CUDA_CONTEXT_BYTES
    from slimrl.patching.table import PLANNED
    from slimrl.planning.baseline import family_of, simulate
    from slimrl.planning.phases import REFERENCE_DTYPE
    from slimrl.planning.verdict import LIKELY

    config, usable = gemma3_1b(), CAPACITY - CUDA_CONTEXT_BYTES
    rows = []
    for trainer, (batch, releases) in PUBLISHED.items():
        for release, (length, peak) in releases.items():
            family = family_of(release)

            @functools.cache
            def peak_at(tokens: int, trainer=trainer, batch=batch, family=family) -> int:
                return simulate(
                    config,
                    PLANNED[trainer],
                    tokens,
                    family,
                    rows=batch,
                    reference_dtype=REFERENCE_DTYPES.get(trainer, REFERENCE_DTYPE),
                ).peak_bytes

            sim_peak = peak_at(8192) / GIB
            sim_len = longest(peak_at, int(LIKELY * usable))
            rows.append(
                {
                    "trainer": trainer,
                    "trl": release,
                    "published_peak_gib": peak,
                    "simulated_peak_gib": round(sim_peak, 2),
                    "peak_error": round(sim_peak / peak - 1, 3),
                    "published_length": length,
                    "simulated_length": sim_len,
                    "length_error": round(sim_len / length - 1, 3),
                    "length_error_no_margin": round(longest(peak_at, usable) / length - 1, 3),
                    "share_trained": round(peak_at(length) / usable, 3),
                    "share_ran_out": round(peak_at(length + 1024) / usable, 3),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| trainer | TRL | peak at 8,192 (GiB): published | simulated | error | longest length: published | "
        "simulated | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['trainer']} | {r['trl']} | {r['published_peak_gib']:.2f} | {r['simulated_peak_gib']:.2f} | "
            f"{100 * r['peak_error']:+.1f} % | {r['published_length']:,} | {r['simulated_length']:,} | "
            f"{100 * r['length_error']:+.1f} % |"
        )
    within = sum(abs(r[k]) <= 0.10 for r in rows for k in ("peak_error", "length_error"))
    bare = sum(abs(r[k]) <= 0.10 for r in rows for k in ("peak_error", "length_error_no_margin"))
    worst = max(abs(r[k]) for r in rows for k in ("peak_error", "length_error"))
    out.append(
        f"\n{within} of {2 * len(rows)} figures within ±10 %; the largest error {100 * worst:.1f} % "
        f"(lengths at the verdict's likely share of usable memory; with no allocator margin: {bare} of "
        f"{2 * len(rows)})"
    )
    trained, ran_out = max(r["share_trained"] for r in rows), min(r["share_ran_out"] for r in rows)
    out.append(
        f"band of slimrl.planning.verdict: every published run that ran out did so above {ran_out:.3f} of "
        f"usable memory, every one that trained stayed under {trained:.3f}"
    )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("validate", "predict"))
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args()
    if a.what == "validate":
        rows = validate()
        print(table(rows))
    else:
        from gpu_predicted import predict  # same directory

        rows = predict()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
