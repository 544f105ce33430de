"""slimrl's log-prob op vs TRL's fused head kernel, per GRPO pass, at a model's head shape.

    python bench/gpu_logprob.py --shape qwen2.5-1.5b --generations 8 --length 4096   # on the GPU machine
    python bench/gpu_logprob.py --device cpu --tiny                                  # smoke test

Both take the completion positions' last hidden states ``[N, H]`` (N = generations x length: TRL scores only the
valid positions on Triton devices, slimrl always) and the head ``[V, H]`` (frozen, as under LoRA) and return the
sampled tokens' log-probs:

* ``policy (grad)``: forward with entropy (TRL's GRPO loss reads it) and backward to the hidden states;
* ``old/ref (no grad)``: forward only. TRL computes the entropy there too; slimrl does not (nothing reads it), so
  the row ``slimrl as used`` is what a slimrl step runs, ``slimrl same outputs`` the like-for-like kernel figure.

TRL's kernel is ``trl.kernels.ChunkedLogProbFunction`` (Triton on CUDA, torch tiles elsewhere), with the chunk
size TRL's trainers pass. Figures: median seconds of ``--repeats`` runs after one warm-up, and the peak memory
above the inputs (CUDA: ``max_memory_allocated``). The last column is the decision the issue asks for: where
slimrl's op is slower than TRL's kernel on a pass, that pass should go to TRL's kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_grpo import RESULT_TAG, SHAPES  # noqa: E402 - the bench directory is not a package


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn, device, repeats: int) -> tuple[float, float]:
    """(median seconds, peak bytes above what was allocated before) of ``fn()``."""
    import torch

    fn()  # warm-up (Triton compiles here)
    times, peak = [], 0.0
    for _ in range(repeats):
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if device.type == "cuda":
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
    return statistics.median(times), peak


def run(args: argparse.Namespace) -> dict:
    import torch
    from trl.kernels import ChunkedLogProbFunction

    from slimrl.ops.chunked_logprob import chunked_logprob_outputs

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = SHAPES[args.shape]
    n, hidden_size, vocab = args.generations * args.length, shape["hidden_size"], shape["vocab_size"]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, hidden_size, generator=g).to(device, dtype)  # [N, H]
    weight = (torch.randn(vocab, hidden_size, generator=g) * 0.02).to(device, dtype)  # [V, H], frozen
    targets = torch.randint(0, vocab, (n,), generator=g).to(device)  # [N]
    trl_chunk = 32768  # TRL's trainers' chunk size (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE)

    def trl(outputs, grad):
        h = hidden.detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            logps, *_ = ChunkedLogProbFunction.apply(h, weight, None, targets, 1.0, trl_chunk, None, 1.0, outputs)
        if grad:
            logps.sum().backward()

    def slim(outputs, grad):
        h = hidden.detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            logps, *_ = chunked_logprob_outputs(h, weight, targets, outputs=outputs, num_chunks=args.num_chunks)
        if grad:
            logps.sum().backward()

    rows = {}
    for name, grad, cases in [
        ("policy (grad)", True, [("trl", trl, ("entropy",)), ("slimrl", slim, ("entropy",))]),
        (
            "old/ref (no grad)",
            False,
            [("trl", trl, ("entropy",)), ("slimrl same outputs", slim, ("entropy",)), ("slimrl as used", slim, ())],
        ),
    ]:
        rows[name] = {
            label: measure(lambda f=fn, o=outs, gr=grad: f(o, gr), device, args.repeats) for label, fn, outs in cases
        }
    return {
        "shape": args.shape,
        "rows_n": n,
        "hidden": hidden_size,
        "vocab": vocab,
        "dtype": str(dtype),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "passes": rows,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--length", type=int, default=None, help="completion tokens (4096; 64 with --tiny)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--num-chunks", type=int, default=-1, help="slimrl's unsloth_num_chunks (-1: automatic)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.shape = "tiny"
    if args.length is None:
        args.length = 64 if args.shape == "tiny" else 4096
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here; use --device cpu (with --tiny for a smoke test)")
    res = run(args)
    print(
        f"log-prob op per pass, {res['shape']} head [{res['vocab']}, {res['hidden']}], N={res['rows_n']} rows, "
        f"{res['dtype']}, {res['device']}"
    )
    for name, cases in res["passes"].items():
        t_trl, m_trl = cases["trl"]
        for label, (t, m) in cases.items():
            line = f"  {name:18} {label:20} {t * 1e3:9.2f} ms  peak +{m / 2**20:8.1f} MiB"
            if label != "trl":
                choice = "keep slimrl's op" if t <= t_trl else "hand this pass to TRL's kernel"
                line += f"  time {t / t_trl:.2f}x TRL -> {choice}"
            print(line)
    print(RESULT_TAG + json.dumps(res))
    return res


if __name__ == "__main__":
    main()
