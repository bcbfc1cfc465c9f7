"""The torch reference of sample_tokens (the CPU op and the kernels' oracle): its draws follow softmax(logits / t),
its Philox is Random123's (published answer), its 32x32-bit products are exact, greedy rows are torch.argmax.
The replica against Triton's own tl.randint4x / tl.rand: test_triton_sampling_interpreter.py."""

from __future__ import annotations

import random

import torch

from atom_kernels import reference, sample_tokens
from atom_kernels.reference.sampling import U_MAX, U_MIN, _mul_hi_lo, philox4x32, uniform

DRAWS = 20000
CHI2_15_DOF_999 = 37.70  # the 99.9% quantile of chi-square with 15 degrees of freedom
LOGITS = torch.tensor([1.5, -0.5, 0.0, 2.0, -2.0, 0.7, 0.3, -1.0, 1.0, -0.2, 0.1, -1.5, 0.5, -0.7, 1.2, -0.1])


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of token counts against len(tokens) draws from probs [V]."""
    observed = torch.bincount(tokens, minlength=len(probs)).double()
    expected = probs.double() * len(tokens)
    return float(((observed - expected) ** 2 / expected).sum())


def draws(temperature: float, first_seed: int = 0) -> torch.Tensor:
    """DRAWS tokens of LOGITS (V = 16) at one temperature, one row per seed first_seed, first_seed + 1, ..."""
    seeds = torch.arange(first_seed, first_seed + DRAWS)
    return reference.sample_tokens(LOGITS.expand(DRAWS, -1), torch.full((DRAWS,), temperature), seeds)


def test_draws_follow_softmax_of_logits_over_temperature():
    """Fixed seeds, so the statistics are fixed numbers; the canaries (a temperature off by 2x, plain argmax, a
    constant token) would pass a weaker threshold and fail this one by orders of magnitude."""
    for t in (1.0, 0.5, 2.0):
        assert chi_square(draws(t), (LOGITS / t).softmax(-1)) < CHI2_15_DOF_999, t
    assert chi_square(draws(2.0), LOGITS.softmax(-1)) > 10 * CHI2_15_DOF_999  # t = 2 where 1 was asked
    assert chi_square(draws(1.0), (LOGITS / 2).softmax(-1)) > 10 * CHI2_15_DOF_999
    greedy = LOGITS.argmax().expand(DRAWS)
    assert chi_square(greedy, LOGITS.softmax(-1)) > 10 * CHI2_15_DOF_999


def test_seeds_give_independent_streams():
    """Other seeds, other draws (the same law): the engine keys every row of every graph step differently."""
    a, b = draws(1.0), draws(1.0, first_seed=DRAWS)
    assert (a == b).float().mean() < 0.3  # two independent draws agree with probability sum(p**2) ~ 0.13
    assert torch.equal(a, draws(1.0))  # deterministic per seed
    assert chi_square(b, LOGITS.softmax(-1)) < CHI2_15_DOF_999


def test_philox_known_answer():
    """Random123's published Philox-4x32-10 answer for counter 0 and key 0 (kat_vectors)."""
    words = philox4x32(torch.tensor([0]), torch.tensor([0]))
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_split_products_are_exact():
    rng = random.Random(0)
    xs = [0, 1, 2**31, 2**32 - 1] + [rng.randrange(2**32) for _ in range(1000)]
    for const in (0xD2511F53, 0xCD9E8D57, 2**32 - 1):
        hi, lo = _mul_hi_lo(const, torch.tensor(xs))
        assert hi.tolist() == [const * x >> 32 for x in xs]
        assert lo.tolist() == [const * x & 0xFFFFFFFF for x in xs]


def test_uniforms_stay_inside_the_open_interval():
    """Words 0 and 2**32 - 1 map to 0 (then clamped to U_MIN, so log(u) is finite); the largest maps below 1."""
    u = uniform(torch.tensor([0, 2**32 - 1, 1, 2**31 - 1, 2**31]))
    assert u[0] == 0 and u[1] == 0 and u[2] == U_MIN
    assert u.max() < 1 and u.max() <= U_MAX
    assert torch.isfinite(-torch.log(-torch.log(u.clamp(U_MIN, U_MAX)))).all()


def test_greedy_rows_are_torch_argmax_and_the_op_dispatches_to_the_reference_on_cpu():
    g = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 3, (64, 50), generator=g).to(torch.bfloat16)  # many ties of the maximum
    temperature = torch.zeros(64)
    temperature[1::2] = 1.0
    seeds = torch.arange(64)
    got = sample_tokens(logits, temperature, seeds)
    assert torch.equal(got[::2], logits[::2].argmax(-1))
    assert torch.equal(got, reference.sample_tokens(logits, temperature, seeds))
