"""SGLang external model package: SGLANG_EXTERNAL_MODEL_PACKAGE=atom_frontends.sglang.models.

SGLang imports every (non-package) module here and registers each class of a module's `EntryClass` (a class or
a list) under the class's `__name__`, the HF architecture; these classes then serve those architectures instead of
SGLang's own models. The one module, entry.py, derives its list from atom_core's model registry.
"""
