"""LLMEngine: request intake, the step loop, and output assembly for the native host.

Overlap scheduling (EngineArgs.overlap_scheduling): step() schedules and launches batch n, then reads
and applies the tokens of batch n-1, so the host's work for batch n+1 runs while the device computes
batch n. A request whose token is still on the device is scheduled with it as its next input (the
runner reads it on the device); when that token turns out to end the request (EOS, stop token or
string), the request's part of the batch launched meanwhile is dropped and its blocks are freed.
Requests ending by length are known on the CPU and get no such extra work.
"""

from __future__ import annotations

import itertools
import logging

import torch

from atom_core.dummy_weights import init_dummy_weights
from atom_core.loader import build_model, load_weights, prepare_weights
from atom_frontends.native.block_manager import BlockManager
from atom_frontends.native.checkpoint_files import eos_token_ids, load_tokenizer
from atom_frontends.native.detokenizer import Detokenizer
from atom_frontends.native.engine_args import EngineArgs
from atom_frontends.native.hooks import NATIVE
from atom_frontends.native.input_checks import InputChecks
from atom_frontends.native.kv_memory import default_kv_cache_bytes, format_size
from atom_frontends.native.model_runner import ModelRunner
from atom_frontends.native.request import CompletionOutput, Logprob, Request, RequestOutput, Status
from atom_frontends.native.sampler import StepOutput
from atom_frontends.native.sampling_params import SamplingParams
from atom_frontends.native.scheduler import Scheduled, Scheduler
from atom_kernels import envs

log = logging.getLogger(__name__)

class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        with NATIVE.scope():
            self.model, self.config, self.platform = build_model(args)
            if args.load_format == "dummy":
                init_dummy_weights(self.model, args.seed or 0)
                prepare_weights(self.model)
            else:
                load_weights(self.model, self.config.model_path)
            self.runner = ModelRunner(self.model, self.config, self.platform, args.seed)
        # The KV cache is sized from the memory left once the weights are loaded (measured, not estimated) and
        # may lower config.max_model_len: what depends on that length is built after it (the runner's step
        # inputs and CUDA graphs, the scheduler). The model's rope table, built for the longer length, covers it.
        num_blocks = self._num_kv_blocks()
        self.runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, self.config.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                   self.config.max_model_len)
        on_gpu = self.platform.device.type == "cuda"
        overlap = envs.ATOM_OVERLAP_SCHEDULING if args.overlap_scheduling is None else args.overlap_scheduling
        self.overlap = on_gpu if overlap is None else overlap
        self._in_flight: tuple[list[Scheduled], StepOutput] | None = None  # overlap: launched, not read yet
        # skip_tokenizer_init: `atom-core serve`'s engine process, whose server tokenizes and detokenizes
        self.tokenizer = None if args.skip_tokenizer_init else load_tokenizer(args.model)
        self.eos_token_ids = eos_token_ids(args.model, self.config.hf_config)
        self.vocab_size = self.config.hf_config.vocab_size
        self.inputs = InputChecks(self.tokenizer, self.vocab_size, self.config.max_model_len)
        self._ids = itertools.count()
        self._groups: dict[str, list[Request]] = {}  # live request id → its n samples
        self._ended: list[RequestOutput] = []  # of requests ended between steps (abort, stop_sample): next step()

    def _num_kv_blocks(self) -> int:
        """Blocks of the KV cache, from the memory free now that the weights are loaded. When the user left
        max_model_len unset and the cache holds fewer tokens, config.max_model_len is lowered to fit."""
        a, cfg, per_block = self.args, self.config, self.runner.bytes_per_block()
        if a.num_kv_blocks is not None:
            blocks, source = a.num_kv_blocks, "num_kv_blocks"
        elif a.kv_cache_memory is not None:
            blocks, source = a.kv_cache_memory // per_block, "kv_cache_memory"
        else:
            most = cfg.max_num_seqs * -(-cfg.max_model_len // cfg.block_size) * per_block
            budget, source = default_kv_cache_bytes(self.platform.device, most)
            blocks = budget // per_block
        capacity = blocks * cfg.block_size
        size = f"{capacity} tokens ({blocks} blocks of {cfg.block_size}, {format_size(blocks * per_block)}: {source})"
        if capacity >= cfg.max_model_len:
            log.info("atom-core: KV cache of %s; max_model_len=%d", size, cfg.max_model_len)
        elif a.max_model_len is None and blocks > 0:
            log.warning("atom-core: max_model_len=%d, lowered from the checkpoint's %d as the KV cache holds %s; "
                        "pass max_model_len (CLI: --max-model-len) for another length, kv_cache_memory or "
                        "num_kv_blocks (CLI: --kv-cache-memory) for a bigger cache", capacity, cfg.max_model_len, size)
            cfg.max_model_len = capacity
        else:
            raise ValueError(
                f"the KV cache holds {size}, fewer than max_model_len={cfg.max_model_len}; raise "
                "num_kv_blocks/kv_cache_memory or lower max_model_len"
            )
        return blocks

    # ---- intake -------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue one request; raises ValueError/TypeError without touching running ones."""
        params = self.inputs.check_params(params)
        return self.enqueue(*self.inputs.check_prompt(prompt), params, request_id)

    def enqueue(self, text: str | None, ids: list[int], params: SamplingParams,
                request_id: str | None = None, stream: bool = False) -> str:
        """Queue a request whose prompt and params came out of inputs.check_prompt / check_params: its n samples
        as n sequences; samples 1.. wait for sample 0's prefill and then share its prompt blocks.
        stream=True: its text is decoded as tokens come, and each of its outputs (current_output(), the final
        one) holds only the tokens and logprobs since the previous one, its prompt logprobs once complete."""
        rid = request_id
        while rid is None or (request_id is None and rid in self._groups):  # auto ids skip the ids users gave
            rid = str(next(self._ids))
        if request_id is not None and rid in self._groups:
            raise ValueError(f"request_id {rid!r} is already in use; give each live request its own id")
        samples = []
        for i in range(params.n):
            req = Request(rid, text, ids, params, self.eos_token_ids, index=i,
                          fork_parent=samples[0] if samples else None)
            if params.seed is not None:  # per-sample streams, as vLLM: sample i uses seed + i
                req.generator = torch.Generator(device=self.platform.device).manual_seed(params.seed + i)
            if self.tokenizer is not None:
                req.detokenizer = Detokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output,
                                              incremental=stream)
            if params.logprobs is not None:
                req.logprobs = []
            if stream:
                req.num_handed = 0
            samples.append(req)
            self.scheduler.add(req)
        if params.prompt_logprobs is not None:
            samples[0].prompt_logprobs = [None]
        self._groups[rid] = samples
        return rid

    # ---- the loop ----------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._ended) or self._in_flight is not None

    def step(self) -> list[RequestOutput]:
        """Run one batch; return the requests that finished in it (and those aborted since the last step).
        With overlap scheduling: launch one batch, then apply the one launched by the previous step()."""
        finished, self._ended = self._ended, []
        batch = self.scheduler.schedule()
        launched = (batch, self._launch(batch)) if batch else None
        if self.overlap:
            launched, self._in_flight = self._in_flight, launched
        if launched is not None:
            finished += self._apply(*launched)
        return finished

    def _launch(self, batch: list[Scheduled]) -> StepOutput:
        """Start the batch on the device; its positions count as computed from now on, the tokens it samples as
        pending (on the device, row pending_row of the step's sampled tokens) until _apply reads them."""
        out = self.runner.execute(batch)
        row = 0
        for s in batch:
            req = s.request
            req.num_computed_tokens += s.num_new_tokens
            if s.completes:
                req.num_pending += 1
                req.pending_row, row = row, row + 1
        return out

    def _apply(self, batch: list[Scheduled], out: StepOutput) -> list[RequestOutput]:
        """Read a launched batch's results and apply them: new tokens, logprobs, stops."""
        finished = []
        for s, res in zip(batch, out.results()):
            req = s.request
            req.num_pending -= s.completes
            if req.status is Status.FINISHED:
                continue  # aborted, or ended by its token of the batch before: its part of this one is dropped
            if req.status is Status.RUNNING:  # (preempted since launch: its blocks are gone, its token is not)
                # before a finished request frees its blocks: those it filled in this last step count too
                self.block_manager.cache_full_blocks(req)
            if res.prompt_logprobs:
                req.prompt_logprobs += self._logprob_dicts(res.prompt_logprobs)
            if res.token is None:
                continue
            req.output_token_ids.append(res.token)
            if res.logprobs is not None:
                req.logprobs += self._logprob_dicts([res.logprobs])
                req.cumulative_logprob += res.logprobs[1][0]  # the sampled token's, listed first
            if self._check_stop(req, res.token):
                self.scheduler.finish(req, req.finish_reason)
                group = self._groups[req.request_id]
                if all(r.status is Status.FINISHED for r in group):
                    finished.append(self._output(group))
        return finished

    def _check_stop(self, req: Request, tok: int) -> bool:
        """Set req.finish_reason / stop_reason when tok ends it, as vLLM: an EOS or stop token gives "stop"
        (stop_reason None for EOS, the id for a stop token) and its text stays out of the output unless
        include_stop_str_in_output; a stop string gives "stop" (the text is cut there), even at max_tokens."""
        n, d = len(req.output_token_ids), req.detokenizer
        if tok in req.stop_ids and n >= req.params.min_tokens:
            req.finish_reason = "stop"
            req.stop_reason = None if tok in self.eos_token_ids and not req.params.ignore_eos else tok
            if d is not None and req.params.include_stop_str_in_output:
                d.add(tok, check_stop=False)
        else:
            # stop strings are searched for only past min_tokens, in the text added since (vLLM)
            stop_str = d.add(tok, n > req.params.min_tokens) if d is not None else None
            if stop_str is not None:
                req.finish_reason, req.stop_reason = "stop", stop_str
            elif n >= req.params.max_tokens or req.num_tokens >= self.config.max_model_len:
                req.finish_reason = "length"
            else:
                return False
        if d is not None and not isinstance(req.stop_reason, str):
            d.finish()
        return True

    def _logprob_dicts(self, rows: list[tuple[list[int], list[float], list[int]]]) -> list[dict[int, Logprob]]:
        """Per position (token ids, logprobs, ranks) → {token id: Logprob}, decoded tokens when a tokenizer exists."""
        out = []
        for ids, lps, ranks in rows:
            # as vLLM: each token decoded on its own (a byte of a multi-byte character reads U+FFFD)
            words = [self.tokenizer.decode([t]) if self.tokenizer is not None else None for t in ids]
            out.append({t: Logprob(lp, r, w) for t, lp, r, w in zip(ids, lps, ranks, words)})
        return out

    def current_output(self, request_id: str) -> RequestOutput | None:
        """A live request's output so far (finished=False; a sample that ended has its finish_reason), for
        streaming (a streamed request's: what is new since its last output); None when no live request has
        that id."""
        group = self._groups.get(request_id)
        return None if group is None else self._output(group, finished=False)

    def has_news(self, request_id: str) -> bool:
        """A live streamed request has output tokens not handed out yet (current_output would hold them); a request
        still waiting has none, so a server's step skips it without building its output."""
        group = self._groups.get(request_id)
        return group is not None and any(len(r.output_token_ids) > (r.num_handed or 0) for r in group)

    def _output(self, group: list[Request], finished: bool = True) -> RequestOutput:
        """The group's RequestOutput; finished=True also forgets the group (its id may then be reused). Lists
        are copies, as a live request's keep growing; a streamed request's hold only what is new, so building
        them takes time in the news, not in the request's length."""
        head = group[0]
        if finished:
            del self._groups[head.request_id]
        prompt_logprobs = head.prompt_logprobs
        if prompt_logprobs is not None and head.num_handed is not None:
            # streamed: once, whole, with the first token (a stream yields nothing without a token or the end)
            send = (not head.prompt_logprobs_handed and len(prompt_logprobs) == len(head.prompt_token_ids)
                    and (finished or len(head.output_token_ids) > head.num_handed))
            head.prompt_logprobs_handed |= send
            prompt_logprobs = prompt_logprobs if send else None
        outs = []
        for r in group:
            k = r.num_handed or 0
            lps = None if r.logprobs is None else r.logprobs[k:]
            outs.append(CompletionOutput(r.index, r.detokenizer.text if r.detokenizer is not None else "",
                                         r.output_token_ids[k:], None if lps is None else r.cumulative_logprob, lps,
                                         r.finish_reason, r.stop_reason))
            if r.num_handed is not None:
                r.num_handed = len(r.output_token_ids)
        return RequestOutput(head.request_id, head.prompt, head.prompt_token_ids,
                             None if prompt_logprobs is None else list(prompt_logprobs), outs, finished,
                             max(head.num_cached_tokens, 0))

    def abort(self, request_id: str) -> bool:
        """Stop a request; its output (finish_reason "abort") comes out of the next step(). Tokens still on the
        device (overlap scheduling) are dropped."""
        group = self._groups.get(request_id)
        if group is None:
            return False
        for req in group:
            if req.status is Status.FINISHED:
                continue
            self.scheduler.finish(req, "abort")
            if req.detokenizer is not None:
                req.detokenizer.finish()
        self._ended.append(self._output(group))
        return True

    def stop_sample(self, request_id: str, index: int, stop: str) -> bool:
        """End one sample at a stop string its caller found (an engine without a tokenizer cannot: the server
        detokenizes) and free its blocks; when it was the request's last sample, the request's output comes out of
        the next step(). False when that sample had already ended."""
        group = self._groups.get(request_id)
        if group is None or group[index].status is Status.FINISHED:
            return False
        self.scheduler.finish(group[index], "stop")
        group[index].stop_reason = stop
        if all(r.status is Status.FINISHED for r in group):
            self._ended.append(self._output(group))
        return True
