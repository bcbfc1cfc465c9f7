"""Linear layers' GEMM: y = x @ weight^T + bias, and the weight preparation a backend may do once after loading.

A backend whose GEMM wants the weight in its own format (a host's prepacked oneDNN GEMM) makes it once with
pack_linear and gets it back with every linear call; the reference needs nothing and ignores it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """weight [out, in], bias [out] as linear will get them → what linear needs besides them: nothing here."""
    return None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed=None) -> torch.Tensor:
    """x [..., in], weight [out, in], bias [out] or None → [..., out]. `packed`: pack_linear's answer (unused)."""
    return F.linear(x, weight, bias)
