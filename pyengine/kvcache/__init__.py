"""KV-cache bookkeeping: which cell holds which position of which sequences."""

from pyengine.kvcache.causal import KV_TYPES, CacheGroup, KVCache
from pyengine.kvcache.cells import MAX_SEQUENCES, CellTable
from pyengine.kvcache.rotate import KeyRotator

__all__ = ["KVCache", "CacheGroup", "CellTable", "KeyRotator", "KV_TYPES", "MAX_SEQUENCES"]
