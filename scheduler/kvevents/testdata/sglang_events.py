"""KV event structures in the shapes SGLang 0.5.23's
disaggregation/kv_events.py defines, for the tests' msgspec encoders: the
batch is a positional array, events are tagged maps with None fields
omitted."""
from typing import Any, Optional

import msgspec


class Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


class MapEvent(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(MapEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class BlockRemoved(MapEvent):
    block_hashes: list[int]
    medium: Optional[str] = None


class AllBlocksCleared(MapEvent):
    pass
