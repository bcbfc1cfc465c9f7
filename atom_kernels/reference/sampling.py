"""sample_tokens: one token per row of logits, greedy or Gumbel-max, with the noise of Triton's Philox.

Row r with temperature 0 takes argmax(logits[r]) (the first index of the maximum, as torch.argmax). Row r with
temperature t > 0 takes argmax_v(logits[r, v] * (1 / t) + g_v), g_v = -log(-log(u_v)): Gumbel-max, a draw from
softmax(logits[r] / t). The uniforms are Triton's `tl.rand4x(seeds[r], i)`: Philox-4x32-10 keyed by the row's
seed at counter i gives four 32-bit words, each mapped to [0, 1) by `uint_to_uniform_float`. Token v reads word
v // V4 of counter v % V4, V4 = ceil(V / 4) (the vocabulary in four contiguous quarters: one Philox call per four
tokens, and each quarter is a contiguous load in the kernel). u is clamped to [U_MIN, U_MAX] (the smallest positive
value the mapping gives, and the largest float32 below 1) so both logs are finite: the mapping gives 0 for words 0
and 2**32 - 1, and never 1.

This is the CPU implementation and the oracle of atom_kernels.triton.sampling: the same float32 operations
(an IEEE reciprocal of t, one multiply, one add), Philox replayed in int64 with every 32x32-bit product split in
16-bit halves so nothing overflows. Slow (about 30 int64 passes over [N, V / 4] per round); no device syncs.
NaN logits are not supported (torch.argmax takes NaN as the maximum, the kernel skips it).
"""

from __future__ import annotations

import torch

# Philox-4x32 constants (triton/language/random.py)
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUNDS = 10
_MASK32 = 0xFFFFFFFF
# uint_to_uniform_float's scale for 32-bit words: the largest s with (2**31 - 1) * s < 1 in float32
UNIFORM_SCALE = 4.6566127342e-10
U_MIN = UNIFORM_SCALE  # the smallest positive uniform the mapping gives (word 1)
U_MAX = 1.0 - 2.0**-24  # the largest float32 below 1


def _mul_hi_lo(const: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """const * x for a 32-bit constant and int64 x in [0, 2**32) → (high 32 bits, low 32 bits), exactly: with
    const = c_hi * 2**16 + c_lo, const * x = (c_hi * x + (c_lo * x >> 16)) * 2**16 + (c_lo * x & 0xFFFF),
    and every term stays below 2**49."""
    c_hi, c_lo = const >> 16, const & 0xFFFF
    low = c_lo * x
    mid = c_hi * x + (low >> 16)
    return mid >> 16, ((mid & 0xFFFF) << 16) | (low & 0xFFFF)


def philox4x32(seeds: torch.Tensor, counters: torch.Tensor) -> list[torch.Tensor]:
    """Triton's randint4x(seed, counter) for an int32 counter: seeds [N] int64, counters [C] int64 in
    [0, 2**31) → four [N, C] int64 tensors of 32-bit words (as unsigned values)."""
    k0 = (seeds & _MASK32).unsqueeze(1)  # [N, 1]: the seed's low word keys the first lane
    k1 = ((seeds >> 32) & _MASK32).unsqueeze(1)
    c0 = counters.unsqueeze(0).expand(len(seeds), -1).clone()  # [N, C]
    c1, c2, c3 = (torch.zeros_like(c0) for _ in range(3))  # the counter's high word and the two unused lanes
    for _ in range(_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return [c0, c1, c2, c3]


def uniform(words: torch.Tensor) -> torch.Tensor:
    """Triton's uint_to_uniform_float for 32-bit words (int64 holding [0, 2**32)) → float32 in [0, 1)."""
    signed = torch.where(words >= 2**31, words - 2**32, words)  # the bitcast to int32
    folded = torch.where(signed < 0, -signed - 1, signed)  # [0, 2**31)
    return folded.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32)


def gumbel_uniforms(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, vocab] float32: u of token v = word v // V4 of Philox(seed, v % V4), V4 = ceil(vocab / 4), clamped."""
    quarter = -(-vocab // 4)
    words = philox4x32(seeds, torch.arange(quarter, device=seeds.device))
    return uniform(torch.cat(words, dim=1)[:, :vocab]).clamp_(U_MIN, U_MAX)


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """logits [N, V] (bf16/fp16/fp32), temperature [N] float32 (0 = greedy), seeds [N] int64 → [N] int64."""
    scores = logits.float()
    inv_t = 1.0 / torch.where(temperature > 0, temperature, 1.0)  # an IEEE division, as the kernel's div_rn
    gumbel = -torch.log(-torch.log(gumbel_uniforms(seeds, logits.shape[1])))
    sampled = scores * inv_t.unsqueeze(1) + gumbel
    return torch.where((temperature > 0).unsqueeze(1), sampled, scores).argmax(dim=-1)
