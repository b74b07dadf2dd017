"""pagedattn on Ray Serve: engine replicas sharing one KV tier, an OpenAI-compatible ingress,
and a request router that sends each prompt to the replica holding its longest cached prefix.

Needs the ``ray`` extra: ``pip install 'pagedattn[ray]'``. Start it with
``pagedattn serve --replicas N --kv-store redis://HOST:PORT/DB`` or
:func:`pagedattn.cluster.app.build_cluster_app` + :func:`pagedattn.cluster.app.run_cluster`.
"""
