"""Real-format FP8 checkpoints from the tests' random-weight ones, and their oracle: transformers in float32 on the
dequantized weights, with the checkpoint's activation quantization simulated around each quantized GEMM.

Formats written (safetensors with float8_e4m3fn weights, config.json's quantization_config as releases have it):
  - "block": quant_method fp8, weight_block_size [128, 128], `weight_scale_inv` [ceil(N/128), ceil(K/128)], dynamic
    activations per token and group of 128 (DeepSeek-V3, Qwen3-FP8);
  - "channel": compressed-tensors, `weight_scale` [N, 1], dynamic per-token activations ("FP8-Dynamic");
  - "static": compressed-tensors, per-channel weights and a static per-tensor `input_scale`.
Quantized: every 2-D `*_proj*` weight (attention, MLPs, experts, DeepSeek's MLA projections); not the embeddings,
the LM head, norms or the routers, as in the releases. With `mtp`, DeepSeek-V3's multi-token-prediction layer
`model.layers.{num_hidden_layers}.*` is added with its released tensor names (fp8 too).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

E4M3 = torch.float8_e4m3fn
BLOCK = 128
STATIC_INPUT_SCALE = 0.05  # one per-tensor activation scale for every layer (fused shards must agree)
FORMATS = {
    "block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [BLOCK, BLOCK]},
    "channel": {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "quantization_status": "compressed", "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                                "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                          "dynamic": True}}}},
}
FORMATS["static"] = json.loads(json.dumps(FORMATS["channel"]))
FORMATS["static"]["config_groups"]["group_0"]["input_activations"].update(strategy="tensor", dynamic=False)


def quantized_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, t in tensors.items() if t.dim() == 2 and "_proj" in n.rsplit(".", 2)[-2]]


def quantize(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ (fp8 weight, the checkpoint's scale tensor, the dequantized float32 weight)."""
    if fmt != "block":
        scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0  # [N, 1]
        q = (w / scale).to(E4M3)
        return q, scale, q.float() * scale
    n, k = w.shape
    padded = torch.nn.functional.pad(w.float(), (0, -k % BLOCK, 0, -n % BLOCK))
    tiles = padded.unflatten(0, (-1, BLOCK)).unflatten(2, (-1, BLOCK))  # [Nb, 128, Kb, 128]
    scale = tiles.abs().amax((1, 3)).clamp(min=1e-12) / 448.0  # [Nb, Kb]
    q = (tiles / scale[:, None, :, None]).to(E4M3)
    deq = (q.float() * scale[:, None, :, None]).flatten(2).flatten(0, 1)[:n, :k].contiguous()
    return q.flatten(2).flatten(0, 1)[:n, :k].contiguous(), scale, deq


def write_fp8(base: Path, out: Path, fmt: str, mtp: bool = False) -> tuple[Path, Path]:
    """(fp8 checkpoint, float32 checkpoint of its dequantized weights) from the float checkpoint at `base`."""
    tensors = load_file(str(base / "model.safetensors"))
    config = json.loads((base / "config.json").read_text())
    if mtp:
        tensors.update(_mtp_layer(tensors, config))
        config["num_nextn_predict_layers"] = 1
    fp8, deq = dict(tensors), {}
    scale_name = "weight_scale_inv" if fmt == "block" else "weight_scale"
    for name in quantized_names(tensors):
        q, scale, deq[name] = quantize(tensors[name], fmt)
        stem = name.removesuffix(".weight")
        fp8[name], fp8[f"{stem}.{scale_name}"] = q, scale
        if fmt == "static":
            fp8[f"{stem}.input_scale"] = torch.tensor([STATIC_INPUT_SCALE])
    dirs = (out / f"fp8-{fmt}", out / f"fp8-{fmt}-dequantized")
    for d in dirs:
        shutil.copytree(base, d, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(fp8, str(dirs[0] / "model.safetensors"), metadata={"format": "pt"})
    (dirs[0] / "config.json").write_text(json.dumps(dict(config, quantization_config=FORMATS[fmt]), indent=1))
    layers = config["num_hidden_layers"]
    main = {n: deq.get(n, t) for n, t in tensors.items() if not n.startswith(f"model.layers.{layers}.")}
    save_file(main, str(dirs[1] / "model.safetensors"), metadata={"format": "pt"})
    return dirs


def _mtp_layer(tensors: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """DeepSeek-V3's MTP module as released: a decoder layer (the last one's weights, renamed) + enorm / hnorm /
    eh_proj / shared_head / embed_tokens, at index num_hidden_layers."""
    last, mtp = f"model.layers.{config['num_hidden_layers'] - 1}.", f"model.layers.{config['num_hidden_layers']}."
    layer = {mtp + n[len(last):]: t.clone() for n, t in tensors.items() if n.startswith(last)}
    hidden = config["hidden_size"]
    layer.update({mtp + "enorm.weight": torch.ones(hidden), mtp + "hnorm.weight": torch.ones(hidden),
                  mtp + "eh_proj.weight": torch.randn(hidden, 2 * hidden) * 0.05,
                  mtp + "shared_head.norm.weight": torch.ones(hidden),
                  mtp + "shared_head.head.weight": tensors["lm_head.weight"].clone(),
                  mtp + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone()})
    return layer


def qdq(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """An activation quantized to e4m3 and back as the format says, one token group at a time."""
    if fmt == "static":
        return (x / STATIC_INPUT_SCALE).clamp(-448, 448).to(E4M3).to(x.dtype) * STATIC_INPUT_SCALE
    group = BLOCK if fmt == "block" else x.shape[-1]
    out = torch.empty_like(x)
    for start in range(0, x.shape[-1], group):
        part = x[..., start:start + group]
        scale = part.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
        out[..., start:start + group] = (part / scale).to(E4M3).to(x.dtype) * scale
    return out


def simulate_activation_quantization(model: torch.nn.Module, fmt: str, absorbed: tuple[str, ...] = ("kv_b_proj",)):
    """Forward pre-hooks quantizing the input of every quantized nn.Linear of a transformers model, and of the
    fused experts' GEMMs (their F.linear calls); `absorbed` layers keep their input (MLA's kv_b_proj: its latent
    input is not quantized in the absorbed form, as in DeepSeek's own inference)."""
    if hasattr(model, "set_experts_implementation"):  # transformers 5: fused experts, run as their per-expert
        model.set_experts_implementation("eager")  # F.linear calls (not grouped_mm), patched below; 4.x: nn.Linear
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and "_proj" in last and last not in absorbed:
            module.register_forward_pre_hook(lambda _m, args: (qdq(args[0], fmt),) + args[1:])
        elif last == "experts" and hasattr(module, "gate_up_proj"):
            module.forward = _quantized_linears(module.forward, fmt)
    return model


def _quantized_linears(forward, fmt: str):
    """`forward` with F.linear (the fused experts' GEMMs) quantizing its input."""
    linear = torch.nn.functional.linear

    def run(*args, **kwargs):
        with _patched(torch.nn.functional, "linear", lambda x, w, b=None: linear(qdq(x, fmt), w, b)):
            return forward(*args, **kwargs)

    return run


@contextlib.contextmanager
def _patched(owner, attr: str, value):
    saved = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, saved)


# (architecture, base checkpoint overrides) of the FP8 test models: hidden 256 (two 128-blocks), an intermediate
# size of 320 (a partial block at the end of gate|up's rows and of down's columns), 64-row k/v shards (a block cut
# by the fused q|k|v shard edges)
QWEN3 = ("Qwen3ForCausalLM", dict(hidden_size=256, intermediate_size=320, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=64, tie_word_embeddings=False))
QWEN3_MOE = ("Qwen3MoeForCausalLM", dict(hidden_size=256, intermediate_size=320, moe_intermediate_size=128,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=64))
DEEPSEEK_V3 = ("DeepseekV3ForCausalLM", dict(hidden_size=256, intermediate_size=320, moe_intermediate_size=128,
                                             q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32,
                                             qk_rope_head_dim=16, v_head_dim=32))
# A greedy token may differ from the oracle's where the oracle's own top-2 logits are this close: the simulated
# quantization rounds each activation to 3 mantissa bits, so a float32 summation order that differs by one ulp
# (transformers 4.x vs 5.x, our kernels vs theirs) can flip one rounding and move a logit by ~0.03.
NEAR_TIE = 0.1
_oracles: dict[tuple, torch.nn.Module] = {}
_greedy: dict[tuple, list[list[int]]] = {}


def oracle(dequantized: Path, fmt: str) -> torch.nn.Module:
    from tests.frontends.native.hf_oracle import hf_model

    key = (str(dequantized), fmt)
    if key not in _oracles:
        _oracles[key] = simulate_activation_quantization(hf_model(dequantized), fmt)
    return _oracles[key]


def oracle_greedy(dequantized: Path, fmt: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens (float32, dequantized weights, activation quantization simulated), checked to
    vary with the context (hf_oracle.informative_greedy); cached per arguments."""
    from tests.frontends.native.hf_oracle import informative_greedy

    key = (str(dequantized), fmt, tuple(map(tuple, prompts)), max_new_tokens)
    if key not in _greedy:
        _greedy[key] = informative_greedy(oracle(dequantized, fmt), prompts, max_new_tokens, dequantized)
    return [list(o) for o in _greedy[key]]


def parity_failures(dequantized: Path, fmt: str, prompts: list[list[int]], ours: list[list[int]],
                    max_new_tokens: int) -> list[tuple[int, int, float]]:
    """(prompt, first differing position, the oracle's logit margin there) of every output that leaves the oracle's
    greedy tokens other than at a near-tie (margin < NEAR_TIE); near-ties are printed."""
    from tests.smollm2 import divergence_report

    want = oracle_greedy(dequantized, fmt, prompts, max_new_tokens)
    with torch.inference_mode():
        report = divergence_report(oracle(dequantized, fmt), prompts, ours, want)
    if report:
        print(f"\nfp8 parity, {dequantized.name}: first divergences (prompt, token, oracle margin): {report}")
    return [r for r in report if r[2] >= NEAR_TIE]
