"""KV memory of a hybrid model (Gemma 3 270M: 15 sliding-window layers of 512, 3 full layers)
with the hybrid KV cache vs every layer keeping every page (``--disable-hybrid-kv-cache-manager``).

    .venv/bin/python benchmarks/hybrid_kv_memory.py --context 2048
    .venv/bin/python benchmarks/hybrid_kv_memory.py --context 8192 --kv-cache-mib 320
    .venv/bin/python benchmarks/hybrid_kv_memory.py --context 8192 --kv-cache-dtype float16

Part 1, measured: for each mode one engine runs one greedy request of ``--context`` prompt
tokens cut from the novel (and ``--new-tokens`` generated); at every step the engine reports
each layer group's referenced K/V bytes while the forward ran (``StepReport.kv_group_bytes``).
Printed: the peak per group, their sum and the ratio hybrid / every layer; and the pool's
resident memory after the request (``Rss`` of the pool's mapping in ``/proc/self/smaps``; pages
become resident as they are written, so a group's unused rows cost nothing).

Part 2, from the pool shares the engine builds (``engine/kv_groups.py``, the same function):
sequences of ``--context`` tokens that fit at once in ``--kv-cache-mib`` for each
``--max-num-seqs`` of the sweep: full-group pages over one sequence's pages, sliding-group
pages over what one sequence's window holds, vs the every-layer pool.
"""

from __future__ import annotations

import argparse

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.cache.layer_groups import layer_groups
from pagedattn.engine.kv_groups import group_page_counts
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

MIB = 2**20


def mapping_rss(address: int) -> int:
    """Resident bytes of the memory mapping of this process that holds ``address``."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise LookupError(f"no mapping holds {address:#x}")


def one_request(args: argparse.Namespace, disable: bool) -> dict[str, int]:
    """Peak referenced bytes per group, and the pool's resident bytes, of one request."""
    llm = LLM(
        model=args.model, page_size=args.page_size, kv_cache_mib=args.kv_cache_mib,
        max_num_seqs=1, disable_hybrid_kv_cache_manager=disable,
        enable_prefix_caching=args.prefix_caching, kv_cache_dtype=args.kv_cache_dtype,
    )  # fmt: skip
    engine = llm.engine
    ids = corpus_token_ids(engine.tokenizer, None, args.context)[: args.context]
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=args.new_tokens))
    peak: dict[str, int] = {}
    while engine.has_unfinished_requests():
        report = engine.step().report
        for name, held in report.kv_group_bytes:
            peak[name] = max(peak.get(name, 0), held)
    peak["pool resident"] = mapping_rss(engine.page_pool.kv.__array_interface__["data"][0])
    return peak


def capacity(args: argparse.Namespace, max_num_seqs: int) -> tuple[int, int]:
    """(hybrid, every layer): sequences of ``--context`` tokens that fit at once (at most
    ``max_num_seqs`` either way)."""
    llm_config = LLM(
        model=args.model, page_size=args.page_size, kv_cache_mib=args.kv_cache_mib,
        max_num_seqs=max_num_seqs, kv_cache_dtype=args.kv_cache_dtype,
    ).engine  # fmt: skip
    config, mc = llm_config.config, llm_config.model_config
    ps = args.page_size
    num_pages = config.cache.resolve_num_pages(mc)
    per_seq = -(-(args.context + args.new_tokens - 1) // ps)
    groups = layer_groups(mc.num_layers, mc.layer_windows)
    counts = group_page_counts(num_pages, groups, config)
    sc = config.scheduler
    chunk = sc.prefill_chunk_size + (sc.num_speculative_tokens if sc.speculative else 0)
    fits = [counts[0] // per_seq]
    for group, pages in zip(groups[1:], counts[1:], strict=True):
        assert group.window is not None
        window_pages = min(per_seq, -(-(group.window + chunk) // ps) + 1)
        fits.append(pages // window_pages)
    return min(max_num_seqs, *fits), min(max_num_seqs, num_pages // per_seq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--kv-cache-mib", type=float, default=320.0)
    parser.add_argument("--kv-cache-dtype", default="float32", help="float32 or float16")
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sweep", default="1,2,4,8", help="--max-num-seqs values (part 2)")
    parser.add_argument("--capacity-only", action="store_true", help="part 2 only (no forward)")
    args = parser.parse_args()
    if not args.capacity_only:
        measure(args)
    print(f"sequences of {args.context} tokens that fit at once in {args.kv_cache_mib:g} MiB:")
    for n in (int(x) for x in args.sweep.split(",")):
        hybrid, every = capacity(args, n)
        print(f"  --max-num-seqs {n}: hybrid {hybrid}, every layer {every}"
              + (f" ({hybrid / every:.1f}x)" if every else ""))  # fmt: skip


def measure(args: argparse.Namespace) -> None:
    """Part 1: one request in each mode."""
    runs = {mode: one_request(args, mode == "every layer") for mode in ("hybrid", "every layer")}
    print(f"one request of {args.context} prompt tokens + {args.new_tokens} generated, "
          f"{args.model}, page size {args.page_size}, {args.kv_cache_dtype} KV:")  # fmt: skip
    for mode, peak in runs.items():
        groups = ", ".join(
            f"{k} {v / MIB:.1f} MiB" for k, v in peak.items() if k != "pool resident"
        )
        total = sum(v for k, v in peak.items() if k != "pool resident")
        print(f"  {mode}: KV referenced (peak) {total / MIB:.1f} MiB ({groups}); "
              f"pool resident after {peak['pool resident'] / MIB:.1f} MiB")  # fmt: skip
    ref = {m: sum(v for k, v in p.items() if k != "pool resident") for m, p in runs.items()}
    res = {m: p["pool resident"] for m, p in runs.items()}
    print(f"  hybrid / every layer: referenced {ref['hybrid'] / ref['every layer']:.2f}x, "
          f"pool resident {res['hybrid'] / res['every layer']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
