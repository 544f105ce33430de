"""Drop-in: what Unsloth-era notebooks and TRL's VLM and agent scripts do that stopped them.

* ``push_to_hub=True`` where the Hub cannot take a push (offline, a refused connection, a refused token, no token):
  TRL alone stops at trainer creation; patched, training runs and saves locally, the change said once in the
  changed-settings table, ``trainer.push_to_hub()`` saves and says so; ``SLIMRL_STRICT=1`` keeps TRL's error.
  The Hub is a stand-in on 127.0.0.1, never a real remote.
* the trainers and configs TRL moved to ``trl.experimental`` import from ``trl`` again while patched, each with one
  ``FutureWarning`` naming its new place; ``unpatch()`` takes them away; ``from slimrl import Version``.
* TRL's own ``AutoProcessor.from_pretrained`` on a Qwen2.5-VL without torchvision takes the image-only processor
  while patched (one line says what was left out)."""

from __future__ import annotations

import http.server
import socket
import threading
import warnings

import pytest

from slimrl import PatchFastRL, unpatch
from tests.patching.trainers.test_grpo import run_grpo


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(401)
        self.end_headers()
        self.wfile.write(b'{"error": "Invalid credentials"}')

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch):
    """A stand-in Hub: ``("401", url)`` answers every request 401; ``("refused", url)``: nothing listens there."""
    from huggingface_hub import constants

    server = http.server.HTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # free again once closed: nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")

    def use(kind: str) -> str:
        url = f"http://127.0.0.1:{server.server_port if kind == '401' else closed}"
        monkeypatch.setattr(constants, "ENDPOINT", url)
        return url

    yield use
    server.shutdown()


@pytest.mark.parametrize("kind", ["refused", "401", "offline", "no-token"])
def test_push_to_hub_without_a_hub_trains_and_saves_locally(tmp_path, hub, monkeypatch, capsys, kind):
    from huggingface_hub import constants

    hub("401" if kind == "401" else "refused")
    if kind == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    if kind == "no-token":
        monkeypatch.delenv("HF_TOKEN")
        monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    push = dict(push_to_hub=True, hub_model_id="someone/tiny-grpo")
    unpatch()
    with pytest.raises(Exception):  # noqa: B017 - TRL alone: whatever huggingface_hub raises at trainer creation
        run_grpo(tmp_path / "trl", "dapo", 0.0, **push)
    PatchFastRL("grpo")
    try:
        capsys.readouterr()
        _, deltas, losses, trainer = run_grpo(tmp_path / "slim", "dapo", 0.0, **push)
        out = capsys.readouterr().out
        assert len(losses) == 2 and trainer.args.push_to_hub is False
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("push_to_hub"))
        assert "True -> False" in line and "push later when online" in line, line
        trainer.push_to_hub()  # the end of TRL's scripts: saved, said, no traceback
        assert "push_to_hub skipped" in capsys.readouterr().out
        assert (tmp_path / "slim" / "adapter_config.json").is_file()
        monkeypatch.setenv("SLIMRL_STRICT", "1")
        with pytest.raises(Exception):  # noqa: B017 - strict: TRL's own behaviour
            run_grpo(tmp_path / "strict", "dapo", 0.0, **push)
    finally:
        unpatch()


def test_names_trl_moved_import_from_trl_while_patched():
    from slimrl.patching.every_trainer import moved_names
    from slimrl.patching.every_trainer.moved_names import MOVED

    moved_names._WARNED.clear()  # one warning per name and process: this test wants to see it
    unpatch()
    with pytest.raises(ImportError):
        from trl import ORPOConfig  # noqa: F401
    PatchFastRL("grpo")
    try:
        import trl

        importable = [n for n in MOVED if n in dir(trl)]
        assert {"ORPOConfig", "ORPOTrainer", "CPOConfig", "CPOTrainer", "OnlineDPOTrainer"} <= set(importable)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from trl import ORPOConfig, ORPOTrainer
            from trl.experimental import orpo
        assert ORPOConfig is orpo.ORPOConfig and ORPOTrainer.__name__ == "ORPOTrainer"
        notes = [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
        assert any("trl.experimental.orpo.ORPOConfig" in n for n in notes), notes
    finally:
        unpatch()
    with pytest.raises(ImportError):
        from trl import ORPOConfig  # noqa: F401,F811
    import trl

    assert "ORPOConfig" not in dir(trl) and type(trl).__name__ == "_LazyModule"


def test_version_behaves_as_unsloths_helper():
    from importlib.metadata import version

    from slimrl import Version

    assert str(Version("trl")) == version("trl").split("+")[0]
    assert Version("0.24.0") < Version("1.0") and str(Version("2.13.0+cpu")) == "2.13.0"
    assert (Version("trl") < Version("0.24.0")) is False
    with pytest.raises(ValueError, match="neither a version number nor an installed package"):
        Version("no-such-package-anywhere")


def test_trls_processor_loading_takes_the_image_only_fallback(tmp_path, monkeypatch):
    """transformers without torchvision cannot build Qwen2.5-VL's video processor: TRL's call to
    ``AutoProcessor.from_pretrained`` stops (here the failure is made where torchvision is present)."""
    from transformers import AutoProcessor
    from transformers.models.auto import processing_auto

    from slimrl.verify.tiny_vision import build

    tv = build("qwen2.5-vl")
    tv.model.config.save_pretrained(tmp_path)
    tv.processor.save_pretrained(tmp_path)
    real = processing_auto.AutoProcessor.from_pretrained.__func__

    def without_torchvision(cls, path, *args, **kwargs):
        raise OSError(f"Can't load video processor for '{path}'")

    monkeypatch.setattr(processing_auto.AutoProcessor, "from_pretrained", classmethod(without_torchvision))
    unpatch()
    with pytest.raises(OSError, match="video processor"):
        AutoProcessor.from_pretrained(str(tmp_path))
    PatchFastRL("grpo")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            processor = AutoProcessor.from_pretrained(str(tmp_path))
        assert type(processor).__name__.endswith("Processor") and processor.image_processor is not None
        assert any("loaded without its video processor" in str(w.message) for w in seen)
    finally:
        unpatch()
    assert AutoProcessor.from_pretrained.__func__ is without_torchvision  # restored exactly
    del real
