"""Open a GGUF file with the `gguf` package and read its metadata, with errors that name the file and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

INSTALL_GGUF = "pip install gguf (or: pip install 'atom-core[gguf]')"


def gguf_module():
    try:
        import gguf
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"reading GGUF checkpoints needs the `gguf` package: {INSTALL_GGUF}") from None
    return gguf


class GGUFFile:
    """A GGUF file's metadata (key → Python value) and tensors (gguf.ReaderTensor, name → tensor)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file {str(self.path)!r} does not exist")
        gguf = gguf_module()
        try:
            reader = gguf.GGUFReader(str(self.path))
        except Exception as e:  # numpy/struct errors of a cut-off or foreign file: name the file, not numpy
            if "cannot reshape" in str(e):  # the header promises more tensor data than the file holds
                raise ValueError(f"{self.path} is truncated: its tensors need more data than the file's "
                                 f"{self.path.stat().st_size} bytes; download or write it again") from None
            raise ValueError(f"{self.path} is not a readable GGUF file (corrupt or truncated?): "
                             f"{type(e).__name__}: {e}") from None
        self.tensors = {t.name: t for t in reader.tensors}
        for t in reader.tensors:
            # A file cut inside its data section still parses (numpy memory-maps what is there): check sizes.
            if t.data.nbytes != int(t.n_bytes):
                raise ValueError(f"{self.path} is truncated: tensor {t.name!r} should hold {int(t.n_bytes)} bytes, "
                                 f"the file has {t.data.nbytes}; download or write it again")
        self.metadata: dict[str, Any] = {}
        for name, field in reader.fields.items():
            if not name.startswith("GGUF."):
                self.metadata[name] = field.contents()
        self.architecture = self.metadata.get("general.architecture")
        if not isinstance(self.architecture, str):
            raise ValueError(f"{self.path} has no general.architecture in its metadata: not a model GGUF")

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value of `key`; '{arch}.' is replaced by the file's architecture prefix."""
        return self.metadata.get(key.replace("{arch}", self.architecture), default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.path} lacks metadata {key.replace('{arch}', self.architecture)!r}, which "
                             f"a {self.architecture} checkpoint needs")
        return value
