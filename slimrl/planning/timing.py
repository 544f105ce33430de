"""Step time from FLOPs and bytes per phase, divided by this machine's measured throughput, or for a CUDA plan made
for a GPU this machine does not have, by that GPU's datasheet rates (:func:`nominal`: the table's dense 16-bit
TFLOP/s and memory bandwidth, :mod:`slimrl.compat.gpus`).

Calibration (once per device and thread count, cached as JSON under ``SLIMRL_CACHE``, default ``~/.cache/slimrl``):
a ``[4096, 1024] x [1024, 1024]`` matmul (the shape of a projection over a batch of tokens) in the compute dtype
for about a second (FLOP/s), a sum over a 256 MiB tensor (memory read bandwidth, bytes/s) and 2000 tiny ops (the
fixed cost of an eager op); and, in a fresh process, the resident size after importing torch, transformers, PEFT,
TRL, datasets and slimrl with its patch applied (the runtime every training process carries before its first
tensor).

Model, per phase (``N`` = non-embedding parameters, ``T`` = prompt + completion tokens, ``L`` completion tokens):

* forward: ``2 N`` FLOPs per token + attention ``4 x layers x hidden x T/2`` per token (causal) + the head on the
  scored tokens ``2 x hidden x vocab``;
* backward: the gradient to the activations costs one forward, checkpointed layers recompute their forward once more
  (LoRA weight gradients are negligible);
* slimrl's offloaded checkpointing (CUDA): each offloaded layer input crosses the GPU's host link twice; pinned
  copies overlap the passes' compute, pageable ones do not (:func:`offload_seconds`);
* generation (HF ``generate``, and the engine), as ``generation_prefill`` and ``generation_decode``: prefill is a
  forward of the prompts; each of ``L`` decode steps reads every weight and the KV cache once (memory bound at small
  batches) or does ``2 N`` FLOPs per row, whichever is slower, plus its launches: eager ops (HF generate, the engine
  on a CPU or over a 4-bit base), or one CUDA graph replayed (the engine on CUDA); over a 4-bit base the engine's
  bitsandbytes layers dequantise every weight at every step (:func:`decode_seconds`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from slimrl.compat.gpus import Gpu, current_gpu, find_gpu
from slimrl.planning.settings import Settings

# Eager PyTorch ops one decoder layer runs per decode step with a LoRA adapter on its 7 projections (HF generate):
# 7 x (base matmul, A, B, scale, add) + norms, rotary, attention, cache update, residuals.
OPS_PER_LAYER_STEP = 70
GRAPH_REPLAY_SECONDS = 30e-6  # one decode step's CUDA graph replayed, and the sampler's host work around it
DEQUANT_BYTES_PER_PARAM = 4  # NF4 -> bf16 per step: the 16-bit weight written, then read by the GEMM


@dataclass(frozen=True)
class Throughput:
    flops_per_s: float
    bytes_per_s: float
    seconds_per_op: float = 0.0  # the fixed cost of one eager op (dispatch, allocation): decode steps are made of them
    runtime_bytes: int = 0  # resident size of a fresh process that imported torch, transformers, PEFT, TRL, slimrl


def _cache_file(device: str, dtype: torch.dtype):
    from slimrl.models.loader import cache_root

    return cache_root() / f"throughput-v4-{device}-{str(dtype).split('.')[-1]}-{torch.get_num_threads()}t.json"


# A CUDA plan for a GPU this machine does not have (``slimrl plan --device cuda --gpu NAME`` on a laptop) reads the
# GPU table: its dense 16-bit rate at the share large matmuls reach (about 60 %), its memory bandwidth, and a typical
# eager-op launch cost. Memory predictions do not read it; step times made with it say so.
MATMUL_SHARE = 0.6
LAUNCH_SECONDS = 8e-6
DEFAULT_GPU = "h100"  # the GPU a CUDA plan without --gpu and without CUDA is made for


def nominal(gpu: Gpu) -> Throughput:
    """The throughput :data:`MATMUL_SHARE` of ``gpu``'s datasheet rates give (the table's row)."""
    return Throughput(
        flops_per_s=MATMUL_SHARE * gpu.dense_tflops * 1e12,
        bytes_per_s=gpu.bandwidth_gbs * 1e9,
        seconds_per_op=LAUNCH_SECONDS,
        runtime_bytes=0,
    )


NOMINAL_CUDA = nominal(find_gpu(DEFAULT_GPU))


def calibrate(device: str, dtype: torch.dtype, seconds: float = 1.0, gpu: Gpu | None = None) -> Throughput:
    """Measured (or cached) throughput of ``device`` (see the module docstring); for a CUDA plan made for a GPU this
    machine does not have (``gpu``, or none named on a machine without CUDA), :func:`nominal` of that GPU (default
    :data:`DEFAULT_GPU`)."""
    if device == "cuda":
        here = current_gpu() if torch.cuda.is_available() else None
        if here is None or (gpu is not None and here.key != gpu.key):
            return nominal(gpu) if gpu is not None else NOMINAL_CUDA
    path = _cache_file(device, dtype)
    try:
        data = json.loads(path.read_text())
        return Throughput(**data)
    except (OSError, ValueError, KeyError):
        pass
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    m, n = (4096, 1024) if dev.type == "cpu" else (16384, 8192)
    a = torch.randn(m, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    a @ b  # warm-up
    sync()
    runs, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        runs += 1
        sync()
    flops = 2 * m * n * n * runs / (time.perf_counter() - t0)
    tiny = torch.ones(1, 64, device=dev)
    sync()
    t0 = time.perf_counter()
    for _ in range(2000):
        tiny = tiny + 1.0
    sync()
    per_op = (time.perf_counter() - t0) / 2000
    big = torch.ones(64 * 2**20, device=dev)  # 256 MiB of fp32
    big.sum()
    sync()
    t0 = time.perf_counter()
    for _ in range(4):
        big.sum()
    sync()
    bandwidth = 4 * big.numel() * 4 / (time.perf_counter() - t0)
    result = Throughput(flops, bandwidth, per_op, _runtime_bytes())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(result)))
        tmp.replace(path)
    except OSError:
        pass
    return result


def _runtime_bytes() -> int:
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('ignore'); import datasets, torch, transformers, peft, trl; "
        "from trl import GRPOConfig, GRPOTrainer; from slimrl import FastLanguageModel, PatchFastRL; "
        "PatchFastRL('grpo', FastLanguageModel); from slimrl.compat.memory import resident_bytes; "
        "print(resident_bytes())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


def forward_flops(
    tokens: int,
    context: int,
    scored: int,
    *,
    params: int,
    layers: int,
    hidden: int,
    vocab: int,
    pairs: float | None = None,
) -> float:
    """FLOPs of a forward over ``tokens`` tokens of sequences of ``context`` tokens, ``scored`` of them through the
    head; ``pairs``: the (query, key) pairs attention scores when not causal over each sequence (the shared-prefix
    layout), else ``tokens x context / 2``."""
    pairs = tokens * context / 2 if pairs is None else pairs
    return tokens * 2 * params + 4 * layers * hidden * pairs + scored * 2 * hidden * vocab


def decode_seconds(
    steps: int,
    rows: int,
    *,
    params: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context: int,
    layers: int,
    tp: Throughput,
    graphs: bool = False,
    dequantized: bool = False,
) -> float:
    """``steps`` decode steps of ``rows`` sequences: each reads the weights and the KV cache (average length
    ``context - steps/2``), or computes ``2 N`` FLOPs per row, whichever takes longer, plus the fixed cost of its
    kernel launches: eager, :data:`OPS_PER_LAYER_STEP` per layer; replayed as one CUDA graph (``graphs``: vLLM's
    default on CUDA), :data:`GRAPH_REPLAY_SECONDS`. ``dequantized``: a 4-bit base that bitsandbytes dequantises at
    every step (the engine serving the trainer's 4-bit modules), which writes and reads the 16-bit weights once more
    (:data:`DEQUANT_BYTES_PER_PARAM`)."""
    read = weight_bytes + rows * kv_bytes_per_token * max(context - steps // 2, 1)
    if dequantized:
        read += DEQUANT_BYTES_PER_PARAM * params
    fixed = GRAPH_REPLAY_SECONDS if graphs else OPS_PER_LAYER_STEP * layers * tp.seconds_per_op
    return steps * (max(read / tp.bytes_per_s, 2 * params * rows / tp.flops_per_s) + fixed)


def engine_graphs(s: Settings) -> bool:
    """Whether generation replays CUDA graphs: slimrl's engine on CUDA, except over a 4-bit base (the engine runs
    eager there: bitsandbytes' kernels are not captured, ``slimrl.generation.engine``); HF generate never does."""
    return s.fast_inference and s.device == "cuda" and not s.load_in_4bit


def no_grad_passes(s: Settings) -> int:
    """No-grad log-prob passes per step: the reference model's (always, or when beta > 0, as the workload says),
    none for the old policy (slimrl reuses the policy's log-probs when ``num_iterations`` is 1)."""
    return 1 if s.workload.keeps_reference(s.beta) else 0


def step_split(
    s: Settings,
    shape: dict[str, int],
    params: int,
    weight_bytes: int,
    kv_token: int,
    rows: int,
    prompt: int,
    completion: int,
    passes: int,
    every: int,
    tp: Throughput,
) -> dict[str, float]:
    layers, hidden, vocab = shape["layers"], shape["hidden"], shape["vocab"]
    context = prompt + completion
    tokens, pairs = layout_work(rows, s.num_generations, prompt, completion, s.shared_prefix)
    fwd = forward_flops(
        tokens, context, rows * completion, params=params, layers=layers, hidden=hidden, vocab=vocab, pairs=pairs
    )
    split: dict[str, float] = {}
    if s.workload.generates:
        prefill = forward_flops(rows * prompt, prompt, 0, params=params, layers=layers, hidden=hidden, vocab=vocab)
        split["generation_prefill"] = prefill / tp.flops_per_s
        split["generation_decode"] = decode_seconds(
            completion,
            rows,
            params=params,
            weight_bytes=weight_bytes,
            kv_bytes_per_token=kv_token,
            context=context,
            layers=layers,
            tp=tp,
            graphs=engine_graphs(s),
            dequantized=s.fast_inference and s.load_in_4bit and s.device == "cuda",
        )
    if passes:
        split["logprobs_no_grad"] = passes * fwd / tp.flops_per_s
    split["policy_forward"] = fwd / tp.flops_per_s
    recompute = (1.0 / every) if every else 0.0
    split["backward"] = (1.0 + recompute) * fwd / tp.flops_per_s
    if s.tiled_mlp and tokens > max(256, hidden):  # each tile's MLP forward once more (a gated MLP: 3 H I)
        split["backward"] += tokens * 2 * 3 * hidden * shape["intermediate"] * layers / tp.flops_per_s
    return split


# A pageable host copy is staged by the CUDA driver through a pinned bounce buffer and blocks the host: about half
# the pinned rate (to be replaced by bench/gpu_speed.py's page_lock measurement where a GPU is lent)
PAGEABLE_SHARE = 0.5


def offload_seconds(offloaded: int, pinned: int, link_bytes_per_s: float, overlap_seconds: float) -> float:
    """Seconds slimrl's offloaded checkpointing adds to a step (:mod:`slimrl.models.offload`): every offloaded layer
    input crosses the host link twice (to the host in the forward, back in the backward). The ``pinned`` bytes go
    on a side stream, hidden behind up to ``overlap_seconds`` of the passes' compute; the rest are pageable copies,
    synchronous, at :data:`PAGEABLE_SHARE` of the link. 0 without offload or a known link."""
    if offloaded <= 0 or link_bytes_per_s <= 0:
        return 0.0
    pinned = min(pinned, offloaded)
    overlapped = 2 * pinned / link_bytes_per_s
    synchronous = 2 * (offloaded - pinned) / (PAGEABLE_SHARE * link_bytes_per_s)
    return max(0.0, overlapped - overlap_seconds) + synchronous


def layout_work(rows: int, generations: int, prompt: int, completion: int, shared: bool) -> tuple[int, float]:
    """(tokens through the layers, (query, key) pairs attended per layer) of a pass over ``rows`` rows: TRL's layout
    causal over each row; the shared prefix (:func:`packed`) the prompt once per group, causal over itself, each
    completion over the prompt and itself."""
    if not shared:
        return rows * (prompt + completion), rows * (prompt + completion) ** 2 / 2
    seqs = packed(rows, generations, completion, True)[0]
    return seqs * prompt + rows * completion, seqs * prompt * prompt / 2 + rows * completion * (prompt + completion / 2)


def packed(rows: int, generations: int, completion: int, shared: bool) -> tuple[int, int]:
    """A log-prob pass over ``rows`` rows as the model sees it, each sequence starting with the prompt:
    (sequences, scored tokens per sequence). TRL's layout: ``rows`` sequences of prompt + completion; shared prefix:
    ``ceil(rows / G)`` packed rows of the prompt then ``min(rows, G)`` completions."""
    if not shared:
        return rows, completion
    return -(-rows // generations), min(rows, generations) * completion
