"""atom-core's EntryClass, imported by SGLang's model registry in every scheduler process, after changes to that
process that let SGLang 0.5.23 run DP attention on a CPU-only machine. SGLang's DP-attention steps have CPU code
paths, but each module takes them only under SGLANG_USE_CPU_ENGINE=1 (its CPU engine, which needs sgl_kernel's CPU
build: not installable here), through a module-level `_is_cpu`; off them they need CUDA. This sets `_is_cpu` in the
three modules whose paths DP attention runs, as SGLang's CPU engine would:

- model_executor/forward_batch_info.py, prepare_mlp_sync_batch (`self.use_pin_memory = not _is_cpu`): otherwise it
  pins the per-rank token counts of every DP-attention batch, which raises "Found no NVIDIA driver"; with it, DP
  padding rows also get the attention backend's get_cpu_graph_seq_len_fill_value.
- layers/dp_attention.py (`memcpy_func = memcpy_cpu if _is_cpu else memcpy_triton`): the DP gather and scatter copy
  rows with a Triton kernel, which has no driver without a GPU; memcpy_cpu is SGLang's own copy for the CPU.
- distributed/parallel_state.py, GroupCoordinator.all_gather_into_tensor / reduce_scatter_tensor: otherwise through
  custom ops registered for CUDA only ("Could not run 'sglang::reg_all_gather_into_tensor' ... 'CPU' backend");
  with it, torch.distributed on the group (gloo).

With DP_CANARY_DROP_REMOTE_TOKENS=1 (the canary) atom-core's gather before the MoE experts also keeps only this DP
rank's rows, every other rank's tokens zeroed, as a gather that lost them would. With DP_TEST_LOG=<file> each MoE
layer call appends "<attention-DP rank> <forward mode> <padding mode> <local rows>" to <file>.<TP rank>.
"""

import os

from sglang.srt.distributed import parallel_state
from sglang.srt.layers import dp_attention
from sglang.srt.model_executor import forward_batch_info

from atom_frontends.sglang import data_parallel
from atom_frontends.sglang.models.entry import EntryClass  # noqa: F401 - SGLang's registry reads it

forward_batch_info._is_cpu = True
dp_attention.memcpy_func = dp_attention.memcpy_cpu
parallel_state._is_cpu = True

if os.environ.get("DP_CANARY_DROP_REMOTE_TOKENS") == "1":
    _gather = data_parallel._gather

    def _gather_own_rows_only(x, forward_batch):
        from sglang.srt.layers.dp_attention import get_dp_local_info

        out = _gather(x, forward_batch)
        start, count = (int(v) for v in get_dp_local_info(forward_batch))
        own = out[start:start + count].clone()
        out.zero_()
        out[start:start + count] = own
        return out

    data_parallel._gather = _gather_own_rows_only

if os.environ.get("DP_TEST_LOG"):
    _reduce_to_local = data_parallel._reduce_to_local

    def _logged_reduce_to_local(out, local_rows, forward_batch):
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        with open(f"{os.environ['DP_TEST_LOG']}.{parallel.tp_rank}", "a") as log:
            log.write(f"{parallel.attn_dp_rank} {forward_batch.forward_mode.name} "
                      f"{forward_batch.dp_padding_mode.name} {local_rows}\n")
        return _reduce_to_local(out, local_rows, forward_batch)

    data_parallel._reduce_to_local = _logged_reduce_to_local
