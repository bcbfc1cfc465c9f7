"""`atom-core serve`: an OpenAI-compatible HTTP server for the native engine (optional extra `serve`)."""

from __future__ import annotations


def require_serve_deps() -> None:
    """Raise a clear error when FastAPI or uvicorn is missing (they come with the `serve` extra)."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(f"atom-core serve needs {' and '.join(missing)}: pip install 'atom-core[serve]'")
