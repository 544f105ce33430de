"""Uploading an export to the Hugging Face Hub (``huggingface_hub``: the repo created if missing, one commit with
every file; ``HF_ENDPOINT`` and ``HF_TOKEN`` honoured as everywhere in the Hugging Face stack). A refused token, a
missing repo or an unreachable Hub is one line naming it."""

from __future__ import annotations

from pathlib import Path


class HubError(RuntimeError):
    """The upload could not be made: one line saying why and what to do."""


def check_repo_id(repo_id: object) -> None:
    """A Hub repo name the Hub can take ('name' or 'user/name': letters, digits, '-', '_', '.'), checked before
    anything is written or computed (HubError, one line)."""
    import re

    if (
        not isinstance(repo_id, str)
        or not re.fullmatch(r"([\w.-]+/)?[\w.-]+", repo_id.strip())
        or repo_id.strip().startswith(("-", "."))
        or ".." in repo_id
        or len(repo_id) > 96
    ):
        raise HubError(f"repo_id={repo_id!r}: pass 'name' or 'user/name' (letters, digits, '-', '_', '.')")


def upload_folder(
    folder: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload with slimrl",
) -> str:
    """Every file of ``folder`` to model repo ``repo_id`` (created if missing, ``private`` as given) at
    ``revision`` (default the main branch), in one commit; returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    check_repo_id(repo_id)
    api = HfApi(token=token)
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    operations = [
        CommitOperationAdd(path_in_repo=p.relative_to(folder).as_posix(), path_or_fileobj=str(p)) for p in files
    ]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(repo_id, operations=operations, commit_message=commit_message, revision=revision)
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            raise HubError(
                f"the Hub at {constants.ENDPOINT} refused the token for {repo_id!r} (HTTP {status}): "
                f"pass token= with write access (or run `hf auth login`)"
            ) from None
        raise HubError(
            f"uploading to {repo_id!r} at {constants.ENDPOINT} failed (HTTP {status}): {str(err).splitlines()[0][:160]}"
        ) from None
    except (OSError, *_transport_errors()) as err:  # connection refused, DNS, timeouts
        raise HubError(
            f"could not reach the Hub at {constants.ENDPOINT} ({type(err).__name__}); check the network or HF_ENDPOINT"
        ) from None
    return info.commit_url


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's connection errors: ``huggingface_hub`` 2.x uses ``httpx2`` (older releases ``httpx`` or
    ``requests``); whichever of them is importable."""
    import importlib

    found: list[type[BaseException]] = []
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)
