"""Prefill/decode disaggregation: a prefill pool and a decode pool of replicas, the KV of each request moved
between them over a link (``config``: the schema; ``kv_transfer``: links and bytes; ``pools``: the simulation)."""
