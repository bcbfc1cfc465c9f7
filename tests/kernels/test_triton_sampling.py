"""sample_tokens' Triton kernel vs the torch reference (atom_kernels.reference.sampling) on the GPU: bf16/fp16/fp32
logits, 1 / 7 / 256 rows, vocabularies of 1000 and 151936, greedy and sampling rows mixed; and inside a CUDA graph
whose temperature and seed buffers change between replays.

The reference replays the kernel's float32 operations, but the GPU's log is not torch's to the last bit: a row may
take another token only where the reference's two scores are a near-tie (same_tokens). Greedy rows must agree
exactly. The checks are shared with the interpreter test (CPU tensors, run in CI)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from atom_kernels import reference  # noqa: E402  (after the triton skip)
from atom_kernels.reference.sampling import gumbel_uniforms  # noqa: E402

pytestmark = pytest.mark.gpu
NEAR_TIE = 1e-4  # relative gap of two float32 scores that a last-bit difference in log can flip


def scores(logits, temperature, seeds) -> torch.Tensor:
    """[N, V] float64: the perturbed scores the reference maximises (greedy rows: the logits)."""
    t = temperature.double().unsqueeze(1)
    gumbel = -torch.log(-torch.log(gumbel_uniforms(seeds, logits.shape[1]).double()))
    return torch.where(t > 0, logits.double() / t.clamp(min=1e-30) + gumbel, logits.double())


def same_tokens(got, logits, temperature, seeds) -> None:
    """got == the reference's tokens, except sampling rows whose two tokens' scores are a near-tie."""
    want = reference.sample_tokens(logits, temperature, seeds)
    assert got.dtype == torch.int64 and got.shape == want.shape and got.device == want.device
    differ = (got != want).nonzero().flatten().tolist()
    if not differ:
        return
    s = scores(logits, temperature, seeds)
    for r in differ:
        assert temperature[r] > 0, f"greedy row {r}: {got[r].item()} != argmax {want[r].item()}"
        a, b = s[r, got[r]].item(), s[r, want[r]].item()
        assert abs(a - b) <= NEAR_TIE * max(1.0, abs(b)), f"row {r}: token {got[r].item()} scores {a}, the " \
            f"reference's {want[r].item()} scores {b}"
    assert len(differ) <= max(1, len(got) // 100), f"{len(differ)} near-ties in {len(got)} rows"


def tie_positions(vocab: int) -> list[int]:
    """Where the greedy rows' tied maxima are: in several quarters of the vocabulary (V4 = vocab / 4 tokens each),
    and in one lane of one program visited late-quarter first (3 * V4 + 5 in the first tile, 512 + 5 in the next),
    so a lane that kept the first tie it met instead of the smallest token would answer wrong."""
    v4 = -(-vocab // 4)
    pos = [vocab - 1, v4 + 1, vocab // 2, 3 * v4 + 5, 512 + 5]
    return sorted({p for p in pos if p < vocab})


def case(n, vocab, dtype, device, seed=0):
    """Logits with a wide spread, ties of the maximum in the greedy rows (tie_positions), temperatures 0 and
    0.25-2, seeds spanning int64 (negative and above 2**32)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 4
    for r in range(0, n, 3):
        logits[r, tie_positions(vocab)] = logits[r].max() + 1
    temperature = torch.rand(n, generator=g) * 1.75 + 0.25
    temperature[::3] = 0
    seeds = torch.randint(-2**62, 2**62, (n,), generator=g)
    return logits.to(dtype).to(device), temperature.to(device), seeds.to(device)


def check_kernel(sample, n, vocab, dtype, device, seed=0) -> None:
    logits, temperature, seeds = case(n, vocab, dtype, device, seed)
    got = sample(logits, temperature, seeds)
    same_tokens(got, logits, temperature, seeds)
    greedy = temperature == 0
    assert torch.equal(got[greedy], logits[greedy].argmax(-1))
    assert (got[greedy] == tie_positions(vocab)[0]).all()  # the first of the tied maxima, not the first visited


def check_edge_rows(sample, device) -> None:
    """All -inf (torch.argmax answers 0), -inf but one token, one-token vocabulary, a 0-row batch."""
    logits = torch.full((4, 37), float("-inf"), device=device)
    logits[1, 30] = 0.0
    logits[3, 36] = -1e30
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.5], device=device)
    seeds = torch.arange(4, device=device)
    assert sample(logits, temperature, seeds).tolist() == [0, 30, 0, 36]
    one = torch.zeros(3, 1, device=device)
    assert sample(one, temperature[:3], seeds[:3]).tolist() == [0, 0, 0]
    assert sample(logits[:0], temperature[:0], seeds[:0]).shape == (0,)


@pytest.fixture(scope="module")
def kernel():
    from atom_kernels.triton.sampling import sample_tokens

    return sample_tokens


@pytest.mark.parametrize("vocab", [1000, 151936])
@pytest.mark.parametrize("n", [1, 7, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_kernel_matches_reference(kernel, dtype, n, vocab):
    check_kernel(kernel, n, vocab, dtype, "cuda", seed=n + vocab)


def test_edge_rows(kernel):
    check_edge_rows(kernel, "cuda")


def test_kernel_in_a_cuda_graph_reads_its_buffers_on_every_replay(kernel):
    """Captured once; each replay samples with the temperatures and seeds then in the buffers."""
    logits, temperature, seeds = case(32, 151936, torch.bfloat16, "cuda", seed=5)
    kernel(logits, temperature, seeds)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(logits, temperature, seeds)
    draws = []
    for step in range(3):
        temperature.copy_(torch.linspace(0, 2, 32, device="cuda").roll(step))
        seeds.copy_(torch.arange(32, device="cuda") + 1000 * step)
        graph.replay()
        same_tokens(out, logits, temperature, seeds)
        draws.append(out.clone())
    assert not torch.equal(draws[1], draws[2])  # new seeds, new draws


def test_kernel_is_the_dispatched_op_on_cuda():
    from atom_kernels import dispatch

    assert dispatch.backend_for("sample_tokens", "cuda") == "triton"
