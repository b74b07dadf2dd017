"""The request routers of this process, by deployment name.

Ray Serve builds a handle's router from a pickled copy of its class, whose module globals may
be copies too; routers therefore register here through a fresh import (one dict per process),
and the ingress reads the replicas' reports and the router's counters from here.
"""

from __future__ import annotations

from typing import Any

#: deployment name -> the router of that deployment's handle in this process.
ROUTERS: dict[str, Any] = {}
