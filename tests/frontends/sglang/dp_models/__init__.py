"""SGLANG_EXTERNAL_MODEL_PACKAGE of test_dp_attention.py's engines: atom-core's model classes (entry.py), plus what
SGLang's scheduler processes need to run DP attention on a CPU-only machine, applied when SGLang's model registry
imports this package in each of them (see entry.py)."""
