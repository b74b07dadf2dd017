"""OpenAI-compatible HTTP server over one LLMEngine (FastAPI + uvicorn), Prometheus metrics.

Needs the ``server`` extra: ``pip install 'pagedattn[server]'``. The app is built by
:func:`pagedattn.server.app.create_app` (or ``build_app``, which loads a model first); this
package's modules import one way, from the routes down to the protocol models.
"""
