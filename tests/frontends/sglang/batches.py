"""Real SGLang pools and ForwardBatches, laid out by hand as SGLang's scheduler would.

Each request gets a req_to_token row and one KV slot per token of its whole sequence up front;
a batch then covers tokens [start, end) of each of its requests (EXTEND over a cached prefix of
`start` tokens, DECODE with end == start + 1, MIXED for both kinds in one batch).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field

import torch


def make_runner(num_layers: int, kv_heads: int, head_dim: int, slots: int = 512, max_context: int = 128,
                dtype=torch.float32, mla_rope_dim: int | None = None, device: str = "cpu"):
    """What an attention backend takes from SGLang's ModelRunner: device, the two real pools, and what the
    start-up warm-up reads (a model without attention layers here, the context length, the step budget). With
    mla_rope_dim, the KV pool is SGLang's MLA pool: rows of head_dim = kv_lora_rank + mla_rope_dim (kv_heads 1)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool

    req = ReqToTokenPool(size=8, max_context_len=max_context, device=device, enable_memory_saver=False)
    if mla_rope_dim is None:
        kv = MHATokenToKVPool(size=slots, page_size=1, dtype=dtype, head_num=kv_heads, head_dim=head_dim,
                              layer_num=num_layers, device=device, enable_memory_saver=False)
    else:
        kv = MLATokenToKVPool(size=slots, page_size=1, dtype=dtype, kv_lora_rank=head_dim - mla_rope_dim,
                              qk_rope_head_dim=mla_rope_dim, layer_num=num_layers, device=device,
                              enable_memory_saver=False)
    return types.SimpleNamespace(device=device, req_to_token_pool=req, token_to_kv_pool=kv, model=torch.nn.Module(),
                                 model_config=types.SimpleNamespace(context_len=max_context, dtype=dtype),
                                 server_args=types.SimpleNamespace(chunked_prefill_size=-1, max_prefill_tokens=64))


@dataclass
class Requests:
    """Requests placed in `runner`'s pools; rid = req_to_token row (row 0 is SGLang's padding row)."""

    runner: types.SimpleNamespace
    tokens: dict[int, list[int]] = field(default_factory=dict)
    next_slot: int = 1  # slot 0 is the pool's padding slot

    def add(self, tokens: list[int]) -> int:
        rid = len(self.tokens) + 1
        slots = torch.arange(self.next_slot, self.next_slot + len(tokens), dtype=torch.int32)
        self.runner.req_to_token_pool.req_to_token[rid, : len(tokens)] = slots
        self.next_slot += len(tokens)
        self.tokens[rid] = list(tokens)
        return rid

    def batch(self, spans: dict[int, tuple[int, int]], mode: str | None = None):
        """ForwardBatch of tokens [start, end) of each request rid → (start, end)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        rids = list(spans)
        starts = [spans[r][0] for r in rids]
        q_lens = [spans[r][1] - spans[r][0] for r in rids]
        ends = [s + n for s, n in zip(starts, q_lens)]
        if mode is None:
            mode = "DECODE" if all(n == 1 for n in q_lens) else "EXTEND"
        table = self.runner.req_to_token_pool.req_to_token
        ids = [t for r, s, e in zip(rids, starts, ends) for t in self.tokens[r][s:e]]
        loc = torch.cat([table[r, s:e] for r, s, e in zip(rids, starts, ends)]).long()
        positions = torch.cat([torch.arange(s, e) for s, e in zip(starts, ends)])
        seq_lens = torch.tensor(ends)
        dev = table.device
        fields = dict(forward_mode=ForwardMode[mode], batch_size=len(rids), input_ids=torch.tensor(ids, device=dev),
                      req_pool_indices=torch.tensor(rids, device=dev), seq_lens=seq_lens.to(dev), out_cache_loc=loc,
                      seq_lens_sum=sum(ends), seq_lens_cpu=seq_lens.clone(), positions=positions.to(dev),
                      capture_hidden_mode=CaptureHiddenMode.NULL)
        if mode != "DECODE":
            fields.update(extend_num_tokens=sum(q_lens), extend_seq_lens=torch.tensor(q_lens, device=dev),
                          extend_prefix_lens=torch.tensor(starts, device=dev), extend_prefix_lens_cpu=starts,
                          extend_seq_lens_cpu=q_lens, extend_logprob_start_lens_cpu=q_lens,
                          extend_start_loc=torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()[:-1]],
                                                        device=dev))
        return ForwardBatch(**fields)


def idle_batch():
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

    empty = torch.zeros(0, dtype=torch.int64)
    return ForwardBatch(forward_mode=ForwardMode.IDLE, batch_size=0, input_ids=empty, req_pool_indices=empty,
                        seq_lens=empty, out_cache_loc=empty, seq_lens_sum=0, seq_lens_cpu=empty,
                        positions=empty, capture_hidden_mode=CaptureHiddenMode.NULL)


@contextlib.contextmanager
def sglang_runtime(path):
    """SGLang's runtime context (published ServerArgs, rank 0 of 1) as its engine processes have it,
    scoped to the block."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(path), device="cpu", dtype="float32", attention_backend="atom",
                      disable_cuda_graph=True, skip_tokenizer_init=True)
    with rc.use_context(rc.create_context(args, role="test", ranks=rc.SpawnRanks(world_rank=0))):
        yield args


def load_sglang_model(path):
    """Our EntryClass for the checkpoint, built and loaded the way SGLang's loader does it."""
    from sglang.srt.models.registry import import_model_classes
    from transformers import AutoConfig

    from atom_core.loader import iterate_weights

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    model = import_model_classes("atom_frontends.sglang.models", strict=True)[config.architectures[0]](config)
    model.load_weights(iterate_weights(path))
    return model.eval()
