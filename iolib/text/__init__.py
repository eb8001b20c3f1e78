"""Token data for language models: packed pretraining windows and token-budget batches.

- `PackedTokens`: fixed `seq_len` windows cut from documents concatenated with an eos.
- `TokenBudgetBatches`: variable-length rows grouped into batches of at most
  `max_tokens` tokens, similar lengths together.
- `cu_seqlens`: boundaries of a packed batch for variable-length attention kernels.

See docs/tokens.md for which to pick and what each batch key means.
"""

from __future__ import annotations

from iolib.text.budget import TokenBudgetBatches
from iolib.text.packed import PackedTokens, cu_seqlens

__all__ = ["PackedTokens", "TokenBudgetBatches", "cu_seqlens"]
