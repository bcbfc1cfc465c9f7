"""atom_frontends: the hosts that drive atom-core (native engine, vLLM, SGLang)."""
