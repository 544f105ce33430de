"""What ``slimrl verify``'s rows run with: the model config, tokenizer, device, dtype and quantization."""

from __future__ import annotations

import torch

from slimrl.errors import InputError
from slimrl.verify.scenarios import Setup


def make_setup(
    model: str | None = None, full: bool = False, device: str = "cpu", quantized: str | None = None
) -> Setup:
    """The model config, tokenizer, device, dtype and quantization the rows run with (see :func:`verify`)."""
    from slimrl.verify.tiny import char_tokenizer, default_config, shrink

    if device not in ("cpu", "cuda"):
        raise InputError(f"--device {device}: use cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); use --device cpu"
        )
    if quantized is not None:
        _check_bitsandbytes(quantized, device)
    if full and model is None:
        model = "SmolLM2-135M-Instruct"
    if model is None:
        config, tokenizer = default_config(), char_tokenizer()
    else:
        from transformers import AutoConfig, AutoTokenizer

        from slimrl.models.loader import resolve_model_path

        try:
            path = resolve_model_path(model)
        except (FileNotFoundError, ValueError) as err:
            raise InputError(str(err).splitlines()[0]) from None
        try:
            if path.is_file():  # a .gguf: its metadata holds the config and the tokenizer
                config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
                tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            else:
                config = AutoConfig.from_pretrained(str(path))
                tokenizer = AutoTokenizer.from_pretrained(str(path))
        except Exception as err:  # noqa: BLE001 - transformers' and gguf's own errors, in one line
            first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
            raise InputError(
                f"--model {model}: its config or tokenizer cannot be read ({type(err).__name__}: "
                f"{first[:200]}); pass a model directory with a valid config.json"
            ) from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if not full:
            config = shrink(config)
    dtype = torch.float32
    if device == "cuda":  # the card's 16-bit dtype: bf16 where it is native, fp16 on a T4 or V100
        from slimrl.compat.gpus import current_gpu

        dtype = current_gpu().dtype
    return Setup(config=config, tokenizer=tokenizer, device=device, dtype=dtype, quantized=quantized)


def _check_bitsandbytes(quantized: str, device: str) -> None:
    """``--load_in_4bit`` / ``--load_in_8bit`` can run on ``device``: bitsandbytes importable, >= 0.50 on a CPU."""
    from slimrl.compat.quant import BNB_CPU_MIN

    flag = f"--load_in_{quantized}"
    try:
        import bitsandbytes
    except ImportError:
        raise InputError(f"{flag}: bitsandbytes is not installed; pip install 'slimrl[quant]'") from None
    from packaging.version import Version

    if device == "cpu" and Version(bitsandbytes.__version__) < Version(BNB_CPU_MIN):
        raise InputError(
            f"{flag}: bitsandbytes {bitsandbytes.__version__} has no CPU backend; pip install "
            f"'bitsandbytes>={BNB_CPU_MIN}' or pass --device cuda"
        )
