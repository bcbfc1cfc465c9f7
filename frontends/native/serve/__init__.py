"""`atom-core serve`: an OpenAI-compatible HTTP server for the native engine (optional extra `serve`)."""

from __future__ import annotations


def require_serve_deps() -> None:
    """Raise a clear error when FastAPI, uvicorn or prometheus_client cannot be imported (the `serve` extra)."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ModuleNotFoundError(f"atom-core serve needs FastAPI, uvicorn and prometheus_client ({e}): "
                                  "pip install 'atom-core[serve]'") from None
