"""The log-prob routes (method capture, score positions, fused head); :func:`served_calls` counts their work."""


def served_calls() -> int:
    """How many calls slimrl's fused-head kernel and score-positions forward have served (``slimrl verify`` and the
    parity tests compare it before and after a run to prove slimrl's path ran)."""
    from slimrl.patching.routes.fused_head import SlimrlChunkedLogProbFunction
    from slimrl.patching.routes.score_positions import score_positions

    return SlimrlChunkedLogProbFunction.calls + score_positions.calls
