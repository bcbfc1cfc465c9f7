"""Tensor parallelism through a host's Platform: 2 CPU processes (gloo) vs transformers' logits.

A small test frontend plays the host: its atom_platform answers with collectives over a real
torch.distributed group, exactly as the vLLM/SGLang frontends hand over their groups.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from atom_core.hookspecs import hookimpl


class _GlooHost:
    @hookimpl
    def atom_platform(self):
        from atom_core.platform import Platform

        def all_reduce(t):
            dist.all_reduce(t)
            return t

        def all_gather(t, dim=-1):
            parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts, dim=dim)

        return Platform(host="tp-test", device=torch.device("cpu"), tp_rank=dist.get_rank(),
                        tp_size=dist.get_world_size(), all_reduce=all_reduce, all_gather=all_gather)

    @hookimpl
    def atom_attention_impl(self, spec):
        from atom_frontends.native.attention import NativeAttention

        return NativeAttention

    @hookimpl
    def atom_metadata_builder(self, spec):
        from atom_frontends.native.inputs import InputBuilder

        return InputBuilder


def _worker(rank, world, path, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ATOM_HOST="tp-test")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from atom_core import plugins
    from atom_core.config import AtomConfig
    from atom_core.forward_context import set_forward_context
    from atom_core.layers.attention import metadata_builder_of
    from atom_core.loader import load_hf_config, load_model
    from atom_core.quantization import checkpoint_precision
    from atom_frontends.native.request import Request
    from atom_frontends.native.sampling_params import SamplingParams
    from atom_frontends.native.scheduler import Scheduled

    plugins.get_plugin_manager().register(_GlooHost(), name="tp-test")
    hf_config = load_hf_config(path)
    cfg = AtomConfig(hf_config=hf_config, model_path=str(path), max_model_len=64, block_size=4,
                     quantization=checkpoint_precision(hf_config, torch.float32, None).quantization)
    model = load_model(cfg, torch.device("cpu"))
    for layer in model.modules():
        if hasattr(layer, "kv_cache"):
            layer.kv_cache = torch.zeros(2, 8, 4, layer.spec.num_kv_heads, layer.spec.head_dim)
    req = Request("0", None, list(range(3, 3 + 11)), SamplingParams(), frozenset(), block_ids=[5, 2, 7])
    step = metadata_builder_of(model.modules())(cfg, torch.device("cpu")).build([Scheduled(req, 11)])
    ids, md = step.input_ids, step.metadata
    with torch.inference_mode(), set_forward_context(md):
        logits = model.compute_logits(model(ids, md.positions))
    if rank == 0:
        queue.put(logits.tolist())  # plain data: a shared-memory tensor dies with this process
        queue.close()
        queue.join_thread()  # the data is in the pipe before this process goes
    dist.barrier()
    dist.destroy_process_group()
    # Skip interpreter teardown: gloo's threads can abort ("terminate called without an active
    # exception") while C++ statics are destroyed, after all the work above succeeded.
    os._exit(0)


def _tp2_logits(path) -> torch.Tensor:
    """Logits of 11 tokens from our model on 2 ranks (one process each)."""
    import socket

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(r, 2, str(path), port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = torch.tensor(queue.get(timeout=300))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


def _hf_logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.arange(3, 3 + 11)[None]).logits[0]


@pytest.mark.parametrize("arch, overrides", [
    ("LlamaForCausalLM", dict(num_key_value_heads=2, vocab_size=321)),  # kv heads split, vocab padded
    ("Qwen3ForCausalLM", dict(num_key_value_heads=1)),  # kv head replicated on both ranks
    ("Qwen3MoeForCausalLM", {}),  # a dense layer, then MoE: each expert's intermediate dim split, all-reduced
])
def test_tp2_logits_match_transformers(checkpoint_factory, arch, overrides):
    from transformers import AutoModelForCausalLM

    path = checkpoint_factory(arch, **overrides)
    got = _tp2_logits(path)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    torch.testing.assert_close(got, _hf_logits(hf), rtol=1e-4, atol=1e-4)


def test_tp2_fp8_logits_match_transformers(fp8_checkpoint):
    """An fp8 block checkpoint on 2 ranks: weights and their block scales sharded by rows (q|k|v: a rank's 64 k rows
    are half of a 128-block) and by K (o_proj, down_proj, the experts' down: 128-multiples per rank)."""
    from tests.fp8_checkpoints import QWEN3_MOE, simulate_activation_quantization
    from tests.frontends.native.hf_oracle import hf_model

    arch, overrides = QWEN3_MOE
    path, dequantized = fp8_checkpoint((arch, dict(overrides, intermediate_size=512, moe_intermediate_size=256)),
                                       "block")
    got = _tp2_logits(path)
    want = _hf_logits(simulate_activation_quantization(hf_model(dequantized), "block"))
    # An activation on an fp8 rounding boundary may round the other way after another summation order (the partial
    # sums of two ranks, transformers 4.x's MoE): ~0.03 on a logit; an ignored or misplaced scale moves them by ~1.
    torch.testing.assert_close(got, want, rtol=1e-2, atol=5e-2)
