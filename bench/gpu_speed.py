"""The lease script: where a GRPO training pass's time goes on a lent GPU, each figure beside the planner's price.

    bash bench/gpu_setup.sh && python3 bench/gpu_speed.py --out "$OUT"   # the GPU machine: one call, <= 330 s
    python bench/gpu_speed.py --device cpu --tiny --out /tmp/speed        # the rehearsal (make test)

On the GPU machine the call carries ``.gpu-wheels`` (``make gpu-wheels``: slimrl's set, liger-kernel included).

The shape is the headline's (Qwen2.5-1.5B, bf16, LoRA r=64, 8 rows = one prompt's 8 completions, 256 + 4,096
tokens; ``--tiny``: the tiny shape, 4 rows of 8 + 24, fp32). ``$OUT/speed.json`` is rewritten after every section,
so a call cut short keeps what finished. Sections, in order of value:

* ``page_lock``: :func:`slimrl.compat.page_lock.probe` (registration, pinned allocation, early return of a
  non-blocking copy) and device -> host copy GB/s into pinned and into pageable memory;
* ``attention``: one layer's attention, forward and forward + backward: TRL's layout (every row its own prompt,
  padding mask), slimrl's shared-prefix attention (:mod:`slimrl.ops.prefix_attention`), causal ``sdpa`` with
  ``enable_gqa`` (flash where it serves) and with cuDNN's backend, each with the kernel that ran;
* ``mlp``: one layer's gated MLP with LoRA on gate/up/down, forward + backward: PEFT's layers untiled and tiled
  (:mod:`slimrl.models.tiled_mlp`), and slimrl's fused MLP (:mod:`slimrl.models.fused_lora`);
* ``norm_rope``: RMSNorm then rotary embedding, transformers' eager modules against Liger's kernels (where
  liger-kernel imports and the device is CUDA);
* ``head``: the sampled tokens' log-probs and entropy from the last hidden states, forward + backward: TRL's
  ``selective_log_softmax`` over full logits against slimrl's chunked op;
* ``toggles``: the whole training pass (forward, head, backward of a random-init model of the shape), slimrl's
  levers each off and on (offloaded checkpointing, tiled MLPs, the chunked head), seconds per phase;
* ``profile``: kernel (CPU: operator) time of one pass by category, and the device's idle share;
* ``trl``: TRL alone's pass at the same shape (plain checkpointing, full logits, TRL's own log-softmax).

Each timed figure is the median of ``--repeats`` after a warm-up (CUDA events on CUDA, ``perf_counter`` on a CPU),
with ``predicted``: FLOPs and bytes at the rates the planner uses for this device (:func:`slimrl.planning.timing.
nominal` of the GPU slimrl's table names; a CPU's calibrated rates). Nothing here is asserted: it records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import SHAPES  # noqa: E402 - the bench directory is not a package

SECTIONS = ("page_lock", "attention", "mlp", "norm_rope", "head", "toggles", "profile", "trl")
HEADLINE = dict(shape="qwen2.5-1.5b", rows=8, generations=8, prompt=256, completion=4096, lora_r=64)
TINY = dict(shape="tiny", rows=4, generations=4, prompt=8, completion=24, lora_r=4)


class Clock:
    """Median seconds of ``repeats`` calls after one warm-up, on ``device``'s own clock."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn) -> float:
        fn()
        self.sync()
        times = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def rates(device: torch.device, dtype: torch.dtype) -> tuple[float, float, float | None, str]:
    """(FLOP/s, memory bytes/s, host link bytes/s, what they are) the planner prices this device at."""
    from slimrl.compat.gpus import current_gpu
    from slimrl.planning.timing import calibrate, nominal

    if device.type == "cuda":
        gpu = current_gpu()
        if gpu is not None:
            tp = nominal(gpu)
            return tp.flops_per_s, tp.bytes_per_s, gpu.host_link_gbs * 1e9, f"nominal({gpu.key})"
    tp = calibrate(device.type, dtype, seconds=0.3)
    return tp.flops_per_s, tp.bytes_per_s, None, f"calibrated {device.type}"


def timed(seconds: float, predicted: float) -> dict:
    return {"s": round(seconds, 6), "predicted_s": round(predicted, 6), "ratio": round(seconds / predicted, 3)}


def kernel_of(fn, device: torch.device) -> str:
    """The name of the kernel (CPU: operator) that took the most time in one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        fn()
        Clock(device, 0).sync()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: -getattr(e, key, 0))
    return events[0].key[:120] if events else "?"


# --- sections -------------------------------------------------------------------------------------------------


def page_lock(ctx: dict) -> dict:
    device, clock, size = ctx["device"], ctx["clock"], ctx["copy_bytes"]
    out: dict = {"bytes": size}
    src = torch.empty(size, dtype=torch.uint8, device=device)
    if device.type == "cuda":
        from dataclasses import asdict

        from slimrl.compat.page_lock import probe

        lock = probe(device)
        out["probe"] = {**asdict(lock), "overlaps": lock.overlaps}
        try:
            pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            s = clock.time(lambda: pinned.copy_(src, non_blocking=True))
            out["pinned"] = {**timed(s, size / ctx["link"]), "gbs": round(size / s / 1e9, 2)}
        except RuntimeError as err:
            out["pinned"] = {"refused": str(err)[:200]}
    else:
        out["probe"] = {"skipped": "no CUDA device: page-locking is a CUDA matter"}
    pageable = torch.empty(size, dtype=torch.uint8)
    s = clock.time(lambda: pageable.copy_(src))
    link = ctx["link"] or ctx["bandwidth"]
    from slimrl.planning.timing import PAGEABLE_SHARE

    share = PAGEABLE_SHARE if ctx["link"] else 1.0
    out["pageable"] = {**timed(s, size / (share * link)), "gbs": round(size / s / 1e9, 2)}
    return out


def _qkv(ctx: dict, rows: int, tokens: int, grad: bool):
    c, dtype, device = ctx["config"], ctx["dtype"], ctx["device"]
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    dim = c.hidden_size // heads

    def make(h):
        return torch.randn(rows, h, tokens, dim, device=device, dtype=dtype, requires_grad=grad)

    return make(heads), make(kv), make(kv)


def _attention_flops(ctx: dict, rows: int, tokens: int) -> float:
    c = ctx["config"]
    return 2 * 2 * rows * c.num_attention_heads * tokens * tokens * (c.hidden_size // c.num_attention_heads) / 2


def attention(ctx: dict) -> dict:
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from slimrl.ops.prefix_attention import PackedLayout, shared_prefix_attention

    device, clock, flops_s = ctx["device"], ctx["clock"], ctx["flops"]
    rows, gens, prompt, completion = ctx["rows"], ctx["generations"], ctx["prompt"], ctx["completion"]
    tokens = prompt + completion
    groups = ctx["config"].num_attention_heads // ctx["config"].num_key_value_heads
    out: dict = {}

    def run(name, fn, flops):
        for grad in (False, True):
            q, k, v = fn["inputs"](grad)

            def call(q=q, k=k, v=v, grad=grad):
                o = fn["call"](q, k, v)
                if grad:
                    o.float().sum().backward()

            try:
                s = clock.time(call)
            except RuntimeError as err:  # a backend that does not serve this shape or device
                out[name] = {"skipped": str(err).splitlines()[0][:200]}
                return
            key = "forward_backward" if grad else "forward"
            out.setdefault(name, {})[key] = timed(s, flops * (3.5 if grad else 1.0) / flops_s)
        inputs = fn["inputs"](False)
        out[name]["kernel"] = kernel_of(lambda: fn["call"](*inputs), device)

    mask = torch.ones(rows, 1, tokens, tokens, dtype=torch.bool, device=device).tril()  # [B, 1, T, T]
    trl = {
        "inputs": lambda grad: _qkv(ctx, rows, tokens, grad),
        "call": lambda q, k, v: sdpa(
            q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask
        ),  # transformers' sdpa with a padding mask: K/V repeated, a boolean mask
    }
    run("trl_layout", trl, _attention_flops(ctx, rows, tokens))
    packed = rows // gens
    layout = PackedLayout.build([prompt] * packed, [[completion] * gens] * packed, device)
    width = prompt + gens * completion
    prefix = {
        "inputs": lambda grad: _qkv(ctx, packed, width, grad),
        "call": lambda q, k, v: shared_prefix_attention(q, k, v, layout),
    }
    run("slimrl_prefix", prefix, _attention_flops(ctx, packed, prompt) + _attention_flops(ctx, rows, completion) * 3)
    causal = {
        "inputs": lambda grad: _qkv(ctx, rows, tokens, grad),
        "call": lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True),
    }
    run("causal_gqa", causal, _attention_flops(ctx, rows, tokens))
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn_call(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), is_causal=True)

        run("cudnn", {"inputs": causal["inputs"], "call": cudnn_call}, _attention_flops(ctx, rows, tokens))
    else:
        out["cudnn"] = {"skipped": "cuDNN attention is a CUDA backend"}
    return out


def _lora_model(ctx: dict, layers: int = 1):
    """A random-init causal LM of the shape with ``layers`` decoder layers (default one), LoRA on every projection
    (PEFT)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = ctx["config"].__class__(**{**ctx["config"].to_dict(), "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=ctx["dtype"]).to(ctx["device"])
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=ctx["lora_r"], lora_alpha=ctx["lora_r"], target_modules=targets, init_lora_weights=False)
    return get_peft_model(model, lora)


def mlp(ctx: dict) -> dict:
    from slimrl.models.fused_lora import fuse_lora, unfuse_lora
    from slimrl.models.tiled_mlp import tile_mlp, untile_mlp

    device, clock, c = ctx["device"], ctx["clock"], ctx["config"]
    model = _lora_model(ctx)
    block = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp"))
    tokens = ctx["rows"] * (ctx["prompt"] + ctx["completion"])
    x = torch.randn(1, tokens, c.hidden_size, device=device, dtype=ctx["dtype"], requires_grad=True)
    flops = 3 * 2 * tokens * c.hidden_size * c.intermediate_size  # gate, up, down

    def step():
        block(x).float().sum().backward()

    out = {"peft_untiled": timed(clock.time(step), 3 * flops / ctx["flops"])}
    tile_mlp(model)
    out["tiled"] = timed(clock.time(step), 3 * flops / ctx["flops"])  # outside a checkpoint: no extra forward
    untile_mlp(model)
    fuse_lora(model)  # get_peft_model's default: slimrl's fused LoRA projections and MLP
    out["fused"] = timed(clock.time(step), 3 * flops / ctx["flops"])
    unfuse_lora(model)
    return out


def norm_rope(ctx: dict) -> dict:
    device, clock, c, dtype = ctx["device"], ctx["clock"], ctx["config"], ctx["dtype"]
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

    rows, tokens = ctx["rows"], ctx["prompt"] + ctx["completion"]
    heads, dim = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps).to(device, dtype)
    rope = LlamaRotaryEmbedding(c).to(device)
    x = torch.randn(rows, tokens, c.hidden_size, device=device, dtype=dtype, requires_grad=True)
    q = torch.randn(rows, heads, tokens, dim, device=device, dtype=dtype, requires_grad=True)
    pos = torch.arange(tokens, device=device)[None].expand(rows, -1)
    cos, sin = rope(x, pos)
    ideal = (2 * x.numel() + 2 * 2 * q.numel()) * x.element_size()  # read + write once each (a fused kernel)

    def eager():
        y = norm(x)
        qr, kr = apply_rotary_pos_emb(q, q, cos, sin)
        (y.float().sum() + qr.float().sum() + kr.float().sum()).backward()

    out = {"transformers": timed(clock.time(eager), 3 * ideal / ctx["bandwidth"])}
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as err:
        out["liger"] = {"skipped": f"liger-kernel does not import here ({err})"}
        return out
    if device.type != "cuda":
        out["liger"] = {"skipped": "Liger's kernels are Triton kernels for CUDA"}
        return out
    lnorm = LigerRMSNorm(c.hidden_size, eps=c.rms_norm_eps).to(device, dtype)

    def liger():
        y = lnorm(x)
        qr, kr = liger_rotary_pos_emb(q, q, cos, sin)
        (y.float().sum() + qr.float().sum() + kr.float().sum()).backward()

    out["liger"] = timed(clock.time(liger), 3 * ideal / ctx["bandwidth"])
    return out


def head(ctx: dict) -> dict:
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    from slimrl.ops.chunked_logprob import chunked_logprobs

    device, clock, c, dtype = ctx["device"], ctx["clock"], ctx["config"], ctx["dtype"]
    n = ctx["rows"] * ctx["completion"]
    hidden = torch.randn(n, c.hidden_size, device=device, dtype=dtype, requires_grad=True)
    weight = torch.randn(c.vocab_size, c.hidden_size, device=device, dtype=dtype) * c.hidden_size**-0.5
    targets = torch.randint(0, c.vocab_size, (n,), device=device)
    predicted = 3 * 2 * n * c.hidden_size * c.vocab_size / ctx["flops"]

    def trl():
        logits = (hidden @ weight.T).float()  # [N, V]
        (selective_log_softmax(logits, targets).sum() + entropy_from_logits(logits).sum()).backward()

    def slimrl():
        logps, entropy = chunked_logprobs(hidden, weight, targets, with_entropy=True)
        (logps.sum() + entropy.sum()).backward()

    return {"trl": timed(clock.time(trl), predicted), "slimrl_chunked": timed(clock.time(slimrl), predicted)}


def _pass(ctx: dict, model, *, offload: bool, tiled: bool, chunked: bool, phases: dict | None = None):
    """One training pass: forward over the rows under checkpointing, the sampled tokens' log-probs, backward."""
    from trl.trainer.utils import selective_log_softmax

    from slimrl.compat.heads import capture_head_input
    from slimrl.models.checkpointing import enable_checkpointing, uninstall_policy
    from slimrl.models.tiled_mlp import is_tiled, tile_mlp, untile_mlp
    from slimrl.ops.chunked_logprob import chunked_logprobs

    base = model.get_base_model()
    uninstall_policy(base)
    enable_checkpointing(model, "slimrl" if offload else True)
    if tiled and not is_tiled(model):
        tile_mlp(model)
    elif not tiled and is_tiled(model):
        untile_mlp(model)
    model.train()
    ids, completion = ctx["ids"], ctx["completion"]
    lm_head = base.get_output_embeddings()
    marks: list = []
    splits: list[tuple[float, float]] = []

    def mark():
        if ctx["device"].type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append(event)
        else:
            marks.append(time.perf_counter())

    def run():
        marks.clear()
        mark()
        with torch.autocast(ctx["device"].type, dtype=ctx["dtype"], enabled=ctx["dtype"] != torch.float32):
            if chunked:
                with capture_head_input(lm_head) as captured:
                    model(input_ids=ids, logits_to_keep=completion + 1, use_cache=False)
                hidden = captured[-1]  # [B, C + 1, H]: the head's input (the head itself projects nothing)
                h = hidden[:, :-1].reshape(-1, hidden.size(-1))  # [B * C, H]: position t predicts token t + 1
                logps, _ = chunked_logprobs(h, lm_head.weight, ids[:, -completion:].reshape(-1))
            else:
                logits = model(input_ids=ids, logits_to_keep=completion + 1, use_cache=False).logits
                logps = selective_log_softmax(logits[:, :-1].float(), ids[:, -completion:])  # [B, C]
            mark()
            loss = -logps.float().mean()
        loss.backward()
        mark()
        if ctx["device"].type == "cuda":
            marks[-1].synchronize()
            splits.append(tuple(marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(2)))
        else:
            splits.append(tuple(marks[i + 1] - marks[i] for i in range(2)))

    seconds = ctx["clock"].time(run)
    if phases is not None:
        phases.update(
            forward_s=round(statistics.median(f for f, _ in splits[1:]), 6),
            backward_s=round(statistics.median(b for _, b in splits[1:]), 6),
        )  # the warm-up's split left out
    return seconds


def _pass_flops(ctx: dict, model) -> float:
    trainable = sum(p.numel() for p in model.parameters())
    tokens = ctx["ids"].numel()
    return 2 * trainable * tokens * 4  # forward, recompute, backward (2x)


def toggles(ctx: dict) -> dict:
    model = ctx["model"]
    predicted = _pass_flops(ctx, model) / ctx["flops"]
    default = dict(offload=ctx["device"].type == "cuda", tiled=False, chunked=True)
    out: dict = {}
    for name, change in (
        ("slimrl_default", {}),
        ("offload_toggled", {"offload": not default["offload"]}),
        ("tiled_on", {"tiled": True}),
        ("chunked_head_off", {"chunked": False}),
    ):
        phases: dict = {}
        try:
            s = _pass(ctx, model, **{**default, **change}, phases=phases)
        except Exception as err:  # noqa: BLE001 - out of memory at this shape: recorded, the next toggle runs
            out[name] = {"error": f"{type(err).__name__}: {err}"[:300], "settings": {**default, **change}}
            continue
        out[name] = {**timed(s, predicted), **phases, "settings": {**default, **change}}
    return out


CATEGORIES = (
    ("gemm", ("gemm", "matmul", "cutlass", "xmma", "mm", "linear", "addmm", "bmm")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("copy", ("memcpy", "copy", "to_copy")),
    ("elementwise", ("elementwise", "vectorized", "reduce", "norm", "mul", "add", "silu", "softmax", "cat", "exp")),
)


def profile(ctx: dict) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    device = ctx["device"]
    cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    default = dict(offload=cuda, tiled=False, chunked=True)
    _pass(ctx, ctx["model"], **default)  # warm
    t0 = time.perf_counter()
    with torch_profile(activities=[activity]) as prof:
        _pass(ctx, ctx["model"], **default)
    wall = time.perf_counter() - t0
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    by: dict[str, float] = {name: 0.0 for name, _ in CATEGORIES} | {"other": 0.0}
    for event in prof.key_averages():
        spent = getattr(event, key, 0) / 1e6
        name = event.key.lower()
        if cuda and getattr(event, "device_type", None) is not None and "cuda" not in str(event.device_type).lower():
            continue
        category = next((c for c, words in CATEGORIES if any(w in name for w in words)), "other")
        by[category] += spent
    busy = sum(by.values())
    share = max(0.0, 1 - busy / wall) if cuda else None  # a CPU's "busy" counts nested operators: no idle share
    return {
        "seconds_by_category": {k: round(v, 6) for k, v in by.items()},
        "wall_s": round(wall, 6),
        "idle_share": share,
    }


def trl(ctx: dict) -> dict:
    phases: dict = {}
    s = _pass(ctx, ctx["model"], offload=False, tiled=False, chunked=False, phases=phases)
    return {**timed(s, _pass_flops(ctx, ctx["model"]) / ctx["flops"]), **phases}


# --- driver ---------------------------------------------------------------------------------------------------


def context(device: torch.device, tiny: bool, repeats: int) -> dict:
    from transformers import AutoConfig

    shape = TINY if tiny else HEADLINE
    values = dict(SHAPES[shape["shape"]])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    flops, bandwidth, link, source = rates(device, dtype)
    ctx = dict(shape, device=device, dtype=dtype, config=config, clock=Clock(device, repeats))
    ctx.update(flops=flops, bandwidth=bandwidth, link=link, rates=source)
    ctx["copy_bytes"] = (8 << 20) if tiny else (512 << 20)
    torch.manual_seed(0)
    ctx["ids"] = torch.randint(0, config.vocab_size, (ctx["rows"], ctx["prompt"] + ctx["completion"]), device=device)
    return ctx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--budget-s", type=float, default=300.0, help="no section starts after this many seconds")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    ctx = context(device, args.tiny, args.repeats)
    report: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": {k: ctx[k] for k in ("shape", "rows", "generations", "prompt", "completion", "lora_r")},
        "dtype": str(ctx["dtype"]),
        "rates": {"flops_per_s": ctx["flops"], "bytes_per_s": ctx["bandwidth"], "link_bytes_per_s": ctx["link"]},
        "rates_from": ctx["rates"],
    }
    started = time.perf_counter()
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        if t0 - started > args.budget_s:
            report[name] = {"skipped": f"the call's {args.budget_s:.0f} s were spent"}
            (out / "speed.json").write_text(json.dumps(report, indent=1, default=str))
            continue
        if name in ("toggles", "profile", "trl") and "model" not in ctx:
            ctx["model"] = _lora_model(ctx, layers=ctx["config"].num_hidden_layers)
        try:
            result = globals()[name](ctx)
        except Exception as err:  # noqa: BLE001 - one section's failure is recorded, the next runs
            result = {"error": f"{type(err).__name__}: {err}"[:500]}
        result["section_s"] = round(time.perf_counter() - t0, 3)
        report[name] = result
        (out / "speed.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"{name}: {json.dumps(result, default=str)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
