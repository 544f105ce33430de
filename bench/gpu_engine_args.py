"""The engine arguments slimrl would give vLLM for the Unsloth notebooks' configurations, on the GPU this runs on
(the GPU runner's command A): the card's real free memory, slimrl's start-up check before any weight loads and, where
vLLM is installed, vLLM's own ``request_memory`` on the same numbers. Prints ``BENCH_RESULT {json}``.

    python bench/gpu_engine_args.py            # on a GPU machine
    python bench/gpu_engine_args.py --device cpu --gpu t4   # the same on a GPU of slimrl's table, presented nowhere

The configurations are the originals of ``../shared/real_scripts*/unsloth_*.py`` that ask for ``fast_inference``
(tests/vllm/test_gpu_start.py reads them from the scripts and checks every GPU of the table).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NOTEBOOKS = {  # name: (model shape, load_in_4bit, gpu_memory_utilization, max_seq_length, max_lora_rank)
    "Qwen3_4B_GRPO": ("qwen3-4b", False, 0.9, 2048, 32),
    "Llama3.1_8B_GRPO": ("llama-3.1-8b", True, 0.9, 1024, 32),
    "Qwen3_8B_FP8_GRPO": ("qwen3-8b", False, 0.5, 2048, 32),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--gpu", default=None, help="a GPU of slimrl's table instead of the one here")
    args = ap.parse_args(argv)
    import torch
    from gpu_shapes import SHAPES
    from transformers import AutoConfig

    from slimrl.compat.engine_memory import fix_for
    from slimrl.compat.gpus import current_gpu, find_gpu
    from slimrl.models.engine_setup import start_on_gpu

    gpu = find_gpu(args.gpu) if args.gpu else current_gpu()
    if gpu is None:
        raise SystemExit("no CUDA device here: pass --gpu NAME")
    free = torch.cuda.mem_get_info()[0] if args.gpu is None else None
    try:
        from vllm.v1.worker.utils import request_memory
    except ImportError:
        request_memory = None
    rows = {}
    for name, (shape, four_bit, share, seq, rank) in NOTEBOOKS.items():
        config = AutoConfig.for_model(**SHAPES[shape])
        start, problem, weights = start_on_gpu(gpu, config, share, seq, four_bit, rank, free)
        row = {**start.to_json(), "base_weight_bytes_on_gpu": weights, "slimrl": problem or "starts"}
        if problem:
            row["fix"] = fix_for(start)
        if request_memory is not None:
            from types import SimpleNamespace

            snapshot = SimpleNamespace(
                total_memory=start.total_bytes, free_memory=start.free_bytes_at_start, device_="cuda:0"
            )
            try:
                request_memory(
                    snapshot,
                    SimpleNamespace(gpu_memory_utilization=start.gpu_memory_utilization),
                    start.external_weight_bytes,
                )
                row["vllm"] = "starts"
            except ValueError as err:
                row["vllm"] = str(err).splitlines()[0]
        rows[name] = row
        print(f"{name:20} slimrl: {row['slimrl'][:60]:60} vLLM: {row.get('vllm', 'not installed')[:40]}", flush=True)
    print("BENCH_RESULT " + json.dumps({"gpu": gpu.name, "notebooks": rows}), flush=True)
    agree = all(("vllm" not in r) or (r["vllm"] == "starts") == (r["slimrl"] == "starts") for r in rows.values())
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
