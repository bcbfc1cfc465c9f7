"""mla_kv_indices: the CSR page indices of a batch (reference.mla.MLADecodeMetadata) built on the GPU in place.

kv_indptr by an in-place cumulative sum (torch.cumsum(out=...)) of each sequence's page count, then one kernel
copies each sequence's live block-table entries to kv_indices[kv_indptr[i]:]. Grids come from tensor shapes:
no host sync, capturable in a CUDA graph (persistent buffers are refilled in place on every replay).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.triton._utils import check, check_same_device, pdl, pdl_prologue

BLOCK = 128  # block-table entries a program copies


@triton.jit(do_not_specialize=["s_bt", "width", "seq_lens_ptr", "bt_ptr"])  # step-varying
def _kv_indices_kernel(bt_ptr, seq_lens_ptr, indptr_ptr, out_ptr, s_bt, s_btc, width, BLOCK_SIZE,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    seq = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pages = tl.cdiv(tl.load(seq_lens_ptr + seq), BLOCK_SIZE)
    mask = (j < pages) & (j < width)
    ids = tl.load(bt_ptr + seq.to(tl.int64) * s_bt + j * s_btc, mask=mask)
    start = tl.load(indptr_ptr + seq).to(tl.int64)
    tl.store(out_ptr + start + j, ids.to(out_ptr.dtype.element_ty), mask=mask)


def mla_kv_indices(block_tables, seq_lens, block_size, kv_indptr, kv_indices) -> None:
    """block_tables [S, W], seq_lens [S] → kv_indptr [S + 1], kv_indices [>= S * W] (int32, written in place)."""
    num_seqs = seq_lens.shape[0]
    check(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs and not block_tables.is_floating_point(),
          f"block_tables must be int [num_seqs={num_seqs}, max_blocks], got {tuple(block_tables.shape)}")
    check(seq_lens.dim() == 1 and not seq_lens.is_floating_point(), "seq_lens must be int [num_seqs]")
    check(kv_indptr.shape == (num_seqs + 1,) and kv_indptr.dtype == torch.int32 and kv_indptr.is_contiguous(),
          f"kv_indptr must be contiguous int32 [{num_seqs + 1}], got {kv_indptr.dtype} {tuple(kv_indptr.shape)}")
    width = block_tables.shape[1]
    check(kv_indices.dim() == 1 and kv_indices.dtype == torch.int32 and kv_indices.shape[0] >= num_seqs * width,
          f"kv_indices must be int32 [>= {num_seqs * width}] (num_seqs x block-table width), got "
          f"{kv_indices.dtype} {tuple(kv_indices.shape)}")
    check_same_device(block_tables=block_tables, seq_lens=seq_lens, kv_indptr=kv_indptr, kv_indices=kv_indices)
    kv_indptr[:1].zero_()
    if num_seqs == 0:
        return
    torch.cumsum((seq_lens + (block_size - 1)) // block_size, 0, dtype=torch.int32, out=kv_indptr[1:])
    if width == 0:
        return
    _kv_indices_kernel[(num_seqs, triton.cdiv(width, BLOCK))](
        block_tables, seq_lens, kv_indptr, kv_indices, *block_tables.stride(), width, block_size, BLOCK=BLOCK,
            **pdl(block_tables.device),
    )
