"""atom_core: framework-neutral models, layers and the host-plugin machinery of atom-core."""

__version__ = "0.1.0"
