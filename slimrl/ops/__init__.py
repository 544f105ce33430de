"""Log-prob kernels that never materialise ``[B, T, V]`` logits."""

from slimrl.ops.chunked_logprob import chunked_logprobs, masked_token_logprobs, rows_per_chunk

__all__ = ["chunked_logprobs", "masked_token_logprobs", "rows_per_chunk"]
