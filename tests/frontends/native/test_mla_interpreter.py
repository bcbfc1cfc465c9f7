"""DeepSeek-V3 on the native engine with the Triton MLA kernels (latent-cache write, MLA decode and prefill,
mla_kv_indices) run on CPU through Triton's interpreter: greedy tokens == transformers on the same checkpoint.

The kernels are registered as the dispatcher's "provided" backend for the CPU, so the engine runs them where it
would run the torch reference; the decode kernel then reads its pages from the step's MLA decode metadata, made
in the InputBuilder's persistent buffers (switch on) or by the kernels each step (switch off). Scenarios from
test_parity: plain batched prompts, and chunked prefill (steps mixing prefill chunks with decodes, so both
kernels and their routing run in one step); the rebuilt path runs the latter only. A subprocess: TRITON_INTERPRET
is read when triton is imported.
"""

from __future__ import annotations

import pytest

from tests.interpreter import run_under_interpreter

pytest.importorskip("triton")

KERNELS = {"write_latent_cache": "atom_kernels.triton.mla.cache:write_latent_cache",
           "mla_attention": "atom_kernels.triton.mla:mla_attention",
           "mla_kv_indices": "atom_kernels.triton.mla.kv_indices:mla_kv_indices"}


def run_scenarios(path: str, persistent: bool) -> None:
    """In the interpreter subprocess: each scenario's tokens must equal transformers'."""
    from atom_kernels import dispatch
    from tests.frontends.native import test_parity as scenarios

    for op, target in KERNELS.items():
        dispatch.register(op, "provided", target, device_type="cpu")
    assert all(dispatch.backend_for(op, "cpu") == "provided" for op in KERNELS)
    import atom_frontends.native.inputs as inputs

    built = []
    init = inputs.InputBuilder.__init__

    def record(self, *args, **kwargs):  # see which metadata path the engine took
        init(self, *args, **kwargs)
        built.append(self.mla_buffers is not None)

    inputs.InputBuilder.__init__ = record
    # chunked prefill mixes prefill chunks with decodes: the rebuilt-metadata path needs no more (CI time)
    for scenario in (scenarios.plain, scenarios.chunked_prefill) if persistent else (scenarios.chunked_prefill,):
        ours, want = scenario(lambda arch, **kw: path, ("DeepseekV3ForCausalLM", {}))
        assert ours == want, f"{scenario.__name__}: ours {ours} != transformers {want}"
    assert built and all(b == persistent for b in built), built
    print("interpreter parity passed")


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "rebuilt"])
def test_triton_mla_kernels_match_transformers_under_the_interpreter(checkpoint_factory, persistent):
    path = checkpoint_factory("DeepseekV3ForCausalLM")
    code = ("from tests.frontends.native.test_mla_interpreter import run_scenarios; "
            f"run_scenarios({str(path)!r}, {persistent})")
    run_under_interpreter(code, "interpreter parity passed",
                          ATOM_USE_PERSISTENT_MLA_DECODE_METADATA=str(int(persistent)))
