"""KV-cache bookkeeping: which cell holds which position of which sequence."""

from pyengine.kvcache.causal import KVCache

__all__ = ["KVCache"]
