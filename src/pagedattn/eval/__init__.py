"""The perplexity lab: what each KV eviction policy and budget costs in model quality.

``policies`` (one protocol over page tables), ``perplexity`` (StreamingLLM's token-by-token
method on the real paged model, plus a chunked fast path), ``report`` (table, JSON, PNG).
"""
