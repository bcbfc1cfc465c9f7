"""SGLang external model package: SGLANG_EXTERNAL_MODEL_PACKAGE=atom_frontends.sglang.models.

SGLang imports every module here and registers each module's `EntryClass` under its `__name__`,
the HF architecture; these classes then serve those architectures instead of SGLang's own models.
One module per architecture; keep imports light (SGLang imports this while its registry loads).
"""
