"""OpenAI-compatible HTTP server over one LLMEngine (FastAPI + uvicorn), Prometheus metrics.

Needs the ``server`` extra: ``pip install 'pagedattn[server]'``.
"""

from pagedattn.server.app import create_app
from pagedattn.server.engine_loop import AsyncEngine

__all__ = ["AsyncEngine", "create_app"]
