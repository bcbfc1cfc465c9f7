"""The SGLang host: atom-core's models and attention inside a real SGLang engine.

Set-up: `pip install atom-core[sglang]`, then start SGLang with
`SGLANG_EXTERNAL_MODEL_PACKAGE=atom_frontends.sglang.models` and `--attention-backend atom`
(the `sglang.srt.plugins` entry point, plugin.register, registers the backend). Importing this
package does not import SGLang; the modules that need it (attention, backend) import it themselves.
"""
