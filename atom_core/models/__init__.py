"""atom-core model implementations and their registry."""

from atom_core.models.registry import get_model_class, is_supported, register_model, supported_architectures

__all__ = ["get_model_class", "is_supported", "register_model", "supported_architectures"]
