"""SGLang entry point (`sglang.srt.plugins` in pyproject.toml): `register()`.

SGLang calls it with no arguments in every process it starts (engine, scheduler, detokenizer), so
it is cheap and idempotent: it registers atom-core's attention backend under the name "atom", adds
"atom" to the `--attention-backend` choices, and marks the host "sglang" for atom_detect_host. The
backend module itself (which imports the attention machinery) is imported only when SGLang builds
the backend. Select plugins with SGLang's own SGLANG_PLUGINS filter (this one is named "atom").
"""

from __future__ import annotations

from atom_frontends.sglang.hooks import SGLANG

BACKEND_NAME = "atom"


def _create_backend(model_runner):
    from atom_frontends.sglang.backend import create_backend

    return create_backend(model_runner)


def register() -> None:
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    SGLANG.activate_process()
    if ATTENTION_BACKENDS.get(BACKEND_NAME) is not _create_backend:
        register_attention_backend(BACKEND_NAME)(_create_backend)
    # add_attention_backend_choices is list.extend: guard against duplicates.
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
