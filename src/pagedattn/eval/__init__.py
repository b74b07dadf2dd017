"""The perplexity lab: what each KV eviction policy, budget and KV dtype costs in model quality.

``policies`` (one protocol over page tables), ``perplexity`` (StreamingLLM's token-by-token
method on the real paged model, plus a chunked fast path), ``chunks`` (llama-perplexity's
method), ``kv_pools`` (pools per dtype, budgets in bytes), ``grid`` (the dtype x policy x
budget runs), ``report`` (table, JSON) and ``plot`` (PNG).
"""
