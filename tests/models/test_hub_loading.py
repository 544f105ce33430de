"""``FastLanguageModel.from_pretrained("org/name")`` loads like transformers: local cache, else a real download from
the Hub's URL layout (a local server on 127.0.0.1, started and stopped here, reached through ``HF_ENDPOINT``),
honouring ``token``, ``revision``, ``cache_dir``, ``local_files_only`` and ``HF_HUB_OFFLINE``. Each scenario runs
in a fresh process, since ``huggingface_hub`` reads ``HF_ENDPOINT`` / ``HF_HUB_OFFLINE`` when it is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.hub_server import FakeHub
from tests.tiny import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from slimrl import FastLanguageModel
from slimrl.compat.model_state import model_state
out = {}
for name, kwargs in json.loads(sys.argv[1]):
    try:
        model, tok = FastLanguageModel.from_pretrained(name, **kwargs)
        out[json.dumps(kwargs)] = {"ok": model_state(model).model_path,
                                   "first": float(next(model.parameters()).flatten()[0])}
    except Exception as err:
        out[json.dumps(kwargs)] = {"error": f"{type(err).__name__}: {err}"}
print("RESULT" + json.dumps(out))
"""


def _load(calls: list, **env) -> list[dict]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(calls)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=240,
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, r.stderr[-3000:]
    results = json.loads(line[len("RESULT") :])
    return [results[json.dumps(kwargs)] for _, kwargs in calls]


@pytest.fixture
def repo(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "repo")
    tiny_tokenizer().save_pretrained(tmp_path / "repo")
    (tmp_path / "repo" / "pytorch_model.bin").write_bytes(b"pickle weights must not be fetched")
    return tmp_path


def test_download_then_cache_then_offline(repo):
    cache = str(repo / "cache")
    expected = float(next(tiny_llama().parameters()).flatten()[0])
    with FakeHub(repo / "repo", "org/tiny", token="secret") as hub:
        no_token, bad_rev, downloaded, cached = _load(
            [
                ("org/tiny", {"cache_dir": cache}),
                ("org/tiny", {"cache_dir": cache, "token": "secret", "revision": "v9"}),
                ("org/tiny", {"cache_dir": cache, "token": "secret"}),
                ("org/tiny", {"cache_dir": cache, "token": "secret", "local_files_only": True}),
            ],
            HF_ENDPOINT=hub.url,
            HF_HUB_CACHE=str(repo / "default-cache"),
        )
        fetched = [r.split()[-1] for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert "model_name='org/tiny' was not found on the Hub" in no_token["error"] and "token=" in no_token["error"]
    assert "model_name='org/tiny' at revision 'v9' has no revision 'v9'" in bad_rev["error"]
    assert downloaded["ok"].startswith(cache) and downloaded["first"] == expected
    assert cached.get("ok") == downloaded["ok"], cached
    assert any(f.endswith("model.safetensors") for f in fetched)
    assert not any(f.endswith(".bin") for f in fetched), "pickle weights were downloaded"

    (offline_cached,) = _load(
        [("org/tiny", {"cache_dir": cache})], HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9"
    )  # nothing listens there: cache only
    assert offline_cached["ok"] == downloaded["ok"]


def test_offline_and_not_cached_is_one_line(tmp_path):
    offline, local_only = _load(
        [
            ("org/not-cached", {}),
            ("org/not-cached", {"local_files_only": True, "cache_dir": str(tmp_path / "c2")}),
        ],
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(tmp_path / "c1"),
    )
    assert "FileNotFoundError: model_name='org/not-cached' is not a local directory" in offline["error"]
    assert "downloads are off (HF_HUB_OFFLINE is set)" in offline["error"] and "\n" not in offline["error"]
    assert "downloads are off (local_files_only=True)" in local_only["error"]


def test_unreachable_hub_is_one_line(tmp_path):
    (down,) = _load([("org/tiny", {})], HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "c"))
    assert "model_name='org/tiny' could not be downloaded from http://127.0.0.1:9" in down["error"]
    assert "\n" not in down["error"]


def test_missing_local_path_is_not_sent_to_the_hub(tmp_path):
    from slimrl import FastLanguageModel

    with pytest.raises(FileNotFoundError, match=r"no such file or directory; pass an existing model directory"):
        FastLanguageModel.from_pretrained(str(tmp_path / "no" / "such" / "model"))
