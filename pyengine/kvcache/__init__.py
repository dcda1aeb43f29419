"""KV-cache bookkeeping: which cell holds which position of which sequences."""

from pyengine.kvcache.causal import KV_TYPES, CacheGroup, KVCache
from pyengine.kvcache.cells import MAX_SEQUENCES, CellTable
from pyengine.kvcache.rotate import KeyRotator
from pyengine.kvcache.rows import KV_CACHE_TYPE_ENV, resolve_kv_type

__all__ = ["KVCache", "CacheGroup", "CellTable", "KeyRotator", "KV_TYPES", "KV_CACHE_TYPE_ENV", "MAX_SEQUENCES",
           "resolve_kv_type"]
