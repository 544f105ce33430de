"""``push_to_hub=True`` where the Hugging Face Hub cannot take a push (offline, no token, a refused token, nothing
answering at ``HF_ENDPOINT``): transformers' ``Trainer`` would stop at its creation (it creates the repository
then); slimrl trains and saves locally instead, the pushes skipped, and says so once in the changed-settings table
with how to push later. ``SLIMRL_STRICT=1`` keeps TRL's behaviour (the error at creation)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

PUSH_LATER = (
    "push later when online: trainer.push_to_hub(), or slimrl export --adapter {out} --push_to_hub <user>/<repo>"
)


def hub_problem(timeout: float = 5.0) -> str | None:
    """Why a push to the Hub cannot happen now (one phrase), or None when it can."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    token = get_token()
    if not token:
        return "no Hugging Face token is set (`hf auth login` or HF_TOKEN)"
    request = urllib.request.Request(
        f"{constants.ENDPOINT.rstrip('/')}/api/whoami-v2", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            return f"the Hub refuses the token (HTTP {err.code})"
        return f"{constants.ENDPOINT} answered HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return f"{constants.ENDPOINT} cannot be reached ({getattr(err, 'reason', err)})"


def skip_push_if_unreachable(config: Any) -> str | None:
    """Before the trainer is built: with ``push_to_hub=True`` and the Hub out of reach, ``push_to_hub`` becomes False
    and the change is recorded for the changed-settings table; the reason, or None."""
    from slimrl.patching.every_trainer.defaults import strict
    from slimrl.patching.every_trainer.state import config_state

    if config is None or not getattr(config, "push_to_hub", False) or strict():
        return None
    why = hub_problem()
    if why is None:
        return None
    config.push_to_hub = False
    state = config_state(config)
    state.changed = {
        **state.changed,
        "push_to_hub": (
            True,
            f"False ({why}: training saves to {config.output_dir}; {PUSH_LATER.format(out=config.output_dir)})",
        ),
    }
    state.push_skipped = why
    return why
