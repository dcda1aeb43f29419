"""The caches a model's layers keep: K/V cells (causal and sliding), recurrent states,
encoder memories, and the Cache that composes them per layer."""

from pyengine.kvcache.cache import Cache, CacheKind, ContextShiftError
from pyengine.kvcache.causal import KV_TYPES, CacheGroup, KVCache
from pyengine.kvcache.cells import MAX_SEQUENCES, CellTable
from pyengine.kvcache.encoder import EncoderMemory
from pyengine.kvcache.recurrent import DEFAULT_CHECKPOINTS, RecurrentState, StepRows
from pyengine.kvcache.rotate import KeyRotator
from pyengine.kvcache.rows import KV_CACHE_TYPE_ENV, resolve_kv_type

__all__ = ["Cache", "CacheKind", "ContextShiftError", "KVCache", "CacheGroup", "CellTable", "EncoderMemory",
           "RecurrentState", "StepRows", "KeyRotator", "KV_TYPES", "KV_CACHE_TYPE_ENV", "MAX_SEQUENCES",
           "DEFAULT_CHECKPOINTS", "resolve_kv_type"]
