"""The ingress has no model: built from the spec a replica sends, in a fresh process, it loads
no weights and imports no model-forward, kernel or Numba code, and still tokenises, renders
chat templates and refuses what the replicas could not hold."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from pagedattn.engine.llm import engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.server.model_spec import ModelSpec
from pagedattn.server.model_spec_wire import spec_to_wire
from tests.cluster.conftest import OPTIONS

# What a process that loads or runs a model imports; the ingress must import none of it.
MODEL_CODE = (
    "numba",
    "llvmlite",
    "torch",
    "safetensors",
    "pagedattn.kernels",
    "pagedattn.model.decoder",
    "pagedattn.model.llama",
    "pagedattn.model.loader",
    "pagedattn.model.gguf_loader",
    "pagedattn.model.gguf_header",
    "pagedattn.model.hf_loader",
    "pagedattn.model.weights",
    "pagedattn.model.build",
    "pagedattn.cache.page_pool",
    "pagedattn.engine.llm_engine",
    "pagedattn.engine.model_runner",
    "pagedattn.engine.scheduler",
)

INGRESS = """
import asyncio, json, sys

import httpx

from pagedattn.cluster.ingress import ClusterIngress

wire = json.loads(open(sys.argv[1], encoding="utf-8").read())
calls = []


class Handle:
    def options(self, **options):
        calls.append(options)
        return self

    def remote(self, *args):
        async def reply():
            return wire

        return reply()


async def main():
    ingress = ClusterIngress.__new__(ClusterIngress)
    await ingress.__init__(Handle(), "PagedAttnEngine", ["tiny"])
    app = ingress.__serve_build_asgi_app__()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        tokens = await client.post("/tokenize", json={"prompt": "Hello world"})
        chat = await client.post(
            "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}
        )
        too_long = await client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": [5] * 500, "max_tokens": 100},
        )
        models = await client.get("/v1/models")
    print(json.dumps({
        "calls": calls,
        "tokens": tokens.json()["tokens"],
        "chat_tokens": chat.json()["tokens"],
        "too_long": [too_long.status_code, too_long.json()["error"]["code"]],
        "models": models.json()["data"][0]["max_model_len"],
        "modules": sorted(sys.modules),
    }))


asyncio.run(main())
"""


def test_the_ingress_loads_no_model_and_imports_no_model_code(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    engine = LLMEngine.from_config(
        engine_config(str(tiny_gguf), **{**OPTIONS, "max_model_len": 512})
    )
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec_to_wire(ModelSpec.of_engine(engine))), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", INGRESS, str(spec_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["calls"][0] == {"method_name": "model_spec"}
    # the ingress tokenises and renders as the replicas' engine does
    tokenizer = engine.tokenizer
    assert got["tokens"] == tokenizer.encode("Hello world")
    assert got["chat_tokens"] == tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    # and refuses, without a replica, what no replica could hold (512-token context)
    assert got["too_long"] == [400, "context_length_exceeded"]
    assert got["models"] == 512
    loaded = [m for m in got["modules"] if any(m == c or m.startswith(f"{c}.") for c in MODEL_CODE)]
    assert loaded == []


def test_abort_cancels_the_replica_call_and_ends_the_stream() -> None:
    from pagedattn.cluster.client import RemoteEngine
    from pagedattn.sampling_params import SamplingParams

    class Responses:
        """A replica call that never answers until cancelled."""

        def __init__(self) -> None:
            self.cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

        async def __anext__(self) -> dict[str, str]:
            raise AssertionError("an aborted stream must not wait on its replica")

    class Handle:
        def __init__(self) -> None:
            self.calls: list[Responses] = []

        def options(self, **options: object) -> Handle:
            return self

        def remote(self, wire: dict[str, object]) -> Responses:
            self.calls.append(Responses())
            return self.calls[-1]

    handle = Handle()
    client = RemoteEngine(handle, metrics=None)
    client.start()
    streams = [client.generate([1, 2, 3], SamplingParams(max_tokens=4), f"r{i}") for i in (0, 1)]
    client.abort("r0")
    client.abort("r0")  # already ended: nothing more
    client.abort("unknown")
    assert [c.cancelled for c in handle.calls] == [True, False]

    async def drain(stream: object) -> list[object]:
        return [out async for out in stream]  # type: ignore[attr-defined]

    assert asyncio.run(drain(streams[0])) == []
    asyncio.run(streams[1].aclose())  # type: ignore[attr-defined]
    assert handle.calls[1].cancelled
