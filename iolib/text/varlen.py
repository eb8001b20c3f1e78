"""Boundaries of packed batches for variable-length attention: `cu_seqlens`.

Apart from `PackedTokens` because it reads a batch, not the data: it runs in the
training loop, on whatever device the batch is on.
"""

from __future__ import annotations

import torch

__all__ = ["cu_seqlens"]


def cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative sequence boundaries (int32 [n + 1]) of a packed batch, from its
    `position_ids` (a new sequence wherever they restart at 0), over the flattened
    batch: what flash-attention's variable-length kernels take as `cu_seqlens_q/k`."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    end = torch.tensor([flat.numel()], dtype=starts.dtype, device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)
