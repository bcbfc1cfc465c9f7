"""Runs one scheduled step: builds inputs + metadata, runs the model (eagerly or as a CUDA graph), samples.

On GPU nothing in a step waits for the device: inputs reach the device through non-blocking copies,
logits rows are gathered with device indices, the sampler is vectorised, and execute() returns a
StepOutput whose results() is the one read. With overlap scheduling a decode input may be a token the
previous step sampled and the CPU has not read: the input builder writes -1 - j for row j of that
step's sampled tokens, which the runner keeps in a persistent device buffer (`tokens`) and substitutes
on the device before the forward. On GPU a step is one graph replay (cuda_graphs.py: decode steps by batch size,
steps with prefill tokens by token count): substitution, forward, the logits of the completing sequences and
sample_tokens on them (argmax for greedy rows, Gumbel-max at the row's temperature else, with a Philox key per
row); when that is every row's answer (sampler.graph_sample_suffices: greedy or plain temperature sampling,
nothing else asked) the CPU launches nothing more than the graph and the copies in and out, and the step's
temperatures and keys travel with its inputs. Otherwise the graph's temperatures are 0 and the CPU samples from
the graph's logits (prompt logprobs: from the graph's hidden states).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

import atom_kernels
from atom_core.config import AtomConfig
from atom_core.forward_context import set_forward_context
from atom_core.layers.attention import metadata_builder_of
from atom_core.layers.kernel_warmup import AttentionCaches, warm_up
from atom_core.platform import Platform
from atom_frontends.native.attention import NativeCacheLayer
from atom_frontends.native.cuda_graphs import StepGraphs, why_not_capturable
from atom_frontends.native.graph_shapes import GraphShape, ShapeLadder, batch_size_ladder, token_ladder
from atom_frontends.native.inputs import StepInputs
from atom_frontends.native.request import Request
from atom_frontends.native.sampler import (
    Sampled,
    StepOutput,
    graph_sample_suffices,
    graph_seeds,
    sample,
    seed_base,
    to_device,
    top_logprobs,
)
from atom_frontends.native.scheduler import Scheduled

FP8_KV = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: AtomConfig, platform: Platform, seed: int | None) -> None:
        self.model, self.config, self.device = model, config, platform.device
        self.attn_layers = [m for m in model.modules() if isinstance(m, NativeCacheLayer)]
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()  # a fresh non-deterministic seed
        else:
            self.generator.manual_seed(seed)
        # graph steps' Philox keys: sampler.graph_seeds(seed_base, rows so far, G)
        self.seed_base, self.graph_rows = seed_base(seed), 0
        self.num_blocks = 0
        self.inputs = None  # built with the KV cache, once config.max_model_len is final
        self.graphs: StepGraphs | None = None
        # [max_num_seqs] int64: row j = the token the latest step sampled for its j-th completing sequence (what an
        # input -1 - j stands for); prev_tokens: a graph step's copy of them from before it overwrote them with its
        # sample_tokens (the penalties read it)
        self.tokens = torch.zeros(config.max_num_seqs, dtype=torch.int64, device=self.device)
        self.prev_tokens = torch.zeros_like(self.tokens)

    @property
    def kv_dtype(self) -> torch.dtype:
        return FP8_KV.get(self.config.kv_cache_dtype, self.config.dtype)

    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.kv_dtype).element_size()
        return sum(math.prod(a.cache_shape(1, self.config.block_size)) for a in self.attn_layers) * elem

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """One cache tensor per attention layer, of the shape the layer's spec asks for (K and V per KV head,
        or one MLA latent row per token); then the step inputs, whose block-table width follows
        config.max_model_len (the engine may lower it to what the cache holds), and on GPU the CUDA graphs,
        which bake in both. The cache is sized before the graphs exist (engine._num_kv_blocks: a share of the
        free memory), so the graphs' pool and outputs come out of the share left for activations."""
        self.num_blocks = num_blocks
        for layer in self.attn_layers:
            layer.kv_cache = torch.zeros(layer.cache_shape(num_blocks, self.config.block_size),
                                         dtype=self.kv_dtype, device=self.device)
            if self.config.kv_cache_dtype != "auto":
                layer.k_scale = torch.ones((), dtype=torch.float32, device=self.device)
                layer.v_scale = torch.ones((), dtype=torch.float32, device=self.device)
        self.inputs = metadata_builder_of(self.attn_layers)(self.config, self.device)
        # JIT kernels compile their shape classes now, not mid-serving
        warm_up(self.config.dtype, self.config.max_model_len, self.config.max_num_batched_tokens, model=self.model,
                attention=[AttentionCaches(layer.spec, layer.cache_views(), layer.k_scale, layer.v_scale)
                           for layer in self.attn_layers])
        self._capture_graphs()

    def _capture_graphs(self) -> None:
        ops = tuple(dict.fromkeys(op for layer in self.attn_layers for op in layer.syncing_ops))
        reason = why_not_capturable(self.device, self.config.enforce_eager, ops)
        if reason is not None:
            if self.device.type == "cuda":
                log.warning("CUDA graphs off (%s): steps run eagerly", reason)
            return
        self.graphs = self.step_graphs(capture=True)

    def graph_ladder(self) -> ShapeLadder:
        """The graph shapes: decode batch sizes up to max_num_seqs; token counts up to the step budget unless
        config.mixed_cuda_graphs is off (then steps with prefill tokens run eagerly)."""
        cfg = self.config
        tokens = token_ladder(cfg.max_num_batched_tokens) if cfg.mixed_cuda_graphs else []
        return ShapeLadder(batch_size_ladder(cfg.max_num_seqs), tokens, cfg.max_num_seqs, cfg.max_model_len)

    def step_graphs(self, capture: bool) -> StepGraphs:
        """The graphs of graph_ladder's shapes; capture=False (a CPU): their steps replayed eagerly."""
        return StepGraphs(self.graph_step, self.inputs, self.graph_ladder(), capture)

    def graph_step(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """A padded step as the graphs capture it, with no CPU reads: → hidden [T, D], logits [R, V] of the rows
        step.logits_indices names (the completing sequences' last tokens, then row 0); every row's sample_tokens
        (step.temperature, step.seeds) into tokens[:R] (the previous tokens kept in prev_tokens)."""
        self.prev_tokens.copy_(self.tokens)
        self.resolve_pending(step.input_ids, self.prev_tokens)
        hidden = self.model(step.input_ids, step.metadata.positions)
        logits = self.model.compute_logits(hidden.index_select(0, step.logits_indices))
        self.tokens[: len(logits)] = atom_kernels.sample_tokens(logits, step.temperature, step.seeds)
        return hidden, logits

    def graph_shape(self, batch: list[Scheduled]) -> GraphShape | None:
        """The graph shape a step pads to, None when it runs eagerly (no graphs, or no shape holds it)."""
        if self.graphs is None or not batch:
            return None
        return self.graphs.pick(sum(s.num_new_tokens for s in batch), len(batch))

    @torch.inference_mode()
    def execute(self, batch: list[Scheduled]) -> StepOutput:
        """Launch one step; its StepOutput gives one result per scheduled request (the sampled token, None for
        partial chunks, and the logprobs asked for) when read."""
        shape = self.graph_shape(batch)
        reqs = [s.request for s in batch]
        rows = [i for i, s in enumerate(batch) if s.completes]
        sampling = [reqs[i] for i in rows]
        # the graph's sample_tokens is the answer (logits row j: the j-th completing sequence)
        in_graph = bool(rows) and shape is not None and graph_sample_suffices(sampling)
        temperatures, seeds = self._graph_sampling(sampling, shape.rows) if in_graph else (None, None)
        step = self.inputs.build(batch, shape, temperatures, seeds)
        if shape is None:
            hidden, logits = self._eager_step(step, batch, rows)
        else:
            hidden, logits = self.graphs.replay(shape)
            logits = logits[: len(rows)]
        last = self.tokens if shape is None else self.prev_tokens  # the step before's (a graph overwrote tokens)
        prompt = self._prompt_logprobs(batch, hidden) if any(r.prompt_logprobs is not None for r in reqs) else {}
        sampled = None
        if in_graph:
            sampled = Sampled(self.tokens[: len(rows)])
        elif rows:
            sampled = sample(logits, sampling, self.generator, last)
            self.tokens[: len(rows)] = sampled.tokens
        return StepOutput(reqs, rows, sampled, prompt)

    def _graph_sampling(self, reqs: list[Request], size: int) -> tuple[list[float], np.ndarray | None]:
        """A graph step's temperatures (greedy: 0) and, when a row samples, fresh Philox keys for its R rows."""
        temperatures = [r.params.temperature for r in reqs]
        if not any(temperatures):
            return temperatures, None
        seeds = graph_seeds(self.seed_base, self.graph_rows, size)
        self.graph_rows += size
        return temperatures, seeds

    def _eager_step(self, step: StepInputs, batch: list[Scheduled], rows: list[int]):
        """A step the graphs do not cover (any step, with graphs off) → (hidden [T, D], logits of the completing rows
        or None)."""
        if any(s.request.num_pending for s in batch):
            self.resolve_pending(step.input_ids, self.tokens)
        with set_forward_context(step.metadata):
            hidden = self.model(step.input_ids, step.metadata.positions)
        logits = self.model.compute_logits(hidden[step.logits_indices]) if rows else None
        return hidden, logits

    @staticmethod
    def resolve_pending(input_ids: torch.Tensor, last: torch.Tensor) -> None:
        """input_ids [T] on the device: each -1 - j becomes last[j], row j of the previous step's sampled tokens (in
        place, so a CUDA graph reads it), without the CPU reading them."""
        rows = (-1 - input_ids).clamp_(min=0)
        input_ids.copy_(torch.where(input_ids < 0, last[rows], input_ids))

    def _prompt_logprobs(self, batch: list[Scheduled], hidden: torch.Tensor) -> dict[int, torch.Tensor]:
        """For requests that ask for prompt logprobs: batch index → the top_logprobs table (on the device) of
        each prompt token this chunk predicts (hidden row of position p → prompt token p + 1), skipping
        positions a recompute already gave."""
        out, start = {}, 0  # the chunk of batch[i] is hidden[start : start + num_new_tokens]
        for i, s in enumerate(batch):
            req = s.request
            first, n = max(req.num_computed_tokens, len(req.prompt_logprobs or [None]) - 1), req.params.prompt_logprobs
            end = min(req.num_computed_tokens + s.num_new_tokens, len(req.prompt_token_ids) - 1)
            if req.prompt_logprobs is not None and first < end:
                rows = torch.arange(first, end, device=hidden.device) - req.num_computed_tokens + start
                logprobs = self.model.compute_logits(hidden[rows]).float().log_softmax(dim=-1)
                targets = to_device(req.prompt_token_ids[first + 1 : end + 1], torch.int64, hidden.device)
                out[i] = top_logprobs(logprobs, targets, n)
            start += s.num_new_tokens
        return out
