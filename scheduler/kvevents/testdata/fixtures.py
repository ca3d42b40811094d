"""KV event payloads encoded by msgspec, the library SGLang encodes them
with, in the shapes SGLang 0.5.23's disaggregation/kv_events.py defines
(tagged maps, omit_defaults) and in the older tagged-array shape (vLLM's
array_like events, earlier SGLang). Writes a JSON list on stdout:
{"name", "payload" (hex), "want": the batch as plain data}.
"""
import json
import sys
from typing import Optional, Union

import msgspec

from sglang_events import AllBlocksCleared, Batch, BlockRemoved, BlockStored  # noqa: E402


# The older shape: tagged arrays, every field positional.
class ArrayEvent(msgspec.Struct, tag=True, array_like=True):
    pass


class OldBlockStored(ArrayEvent, tag="BlockStored"):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Optional[Union[int, bytes]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class OldBlockRemoved(ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[Union[int, bytes]]


class OldAllBlocksCleared(ArrayEvent, tag="AllBlocksCleared"):
    pass


def plain(e):
    """The event as the Go test expects it."""
    d = {"kind": type(e).__name__.removeprefix("Old")}
    for f in getattr(e, "__struct_fields__", ()):
        v = getattr(e, f)
        if isinstance(v, bytes):
            v = {"bytes": v.hex()}
        elif isinstance(v, list):
            v = [{"bytes": x.hex()} if isinstance(x, bytes) else x for x in v]
        d[f] = v
    return d


I64 = 2**63
cases = {
    "stored root chain": Batch(1764100000.25, [BlockStored([11, -22, I64 - 1], None, list(range(48)), 16, None)], 0),
    "stored with parent, medium, salt, lora": Batch(
        1.5, [BlockStored([-(I64)], 7, [1] * 16, 16, 3, "CPU_PINNED", "tenant-a", "s1", "adapter")], 3),
    "removed and cleared": Batch(2.0, [BlockRemoved([5, 6], "GPU"), AllBlocksCleared(), BlockRemoved([9])], 1),
    "no rank": Batch(3.0, [AllBlocksCleared()]),
    "empty": Batch(4.0, [], 0),
    "old arrays": Batch(5.0, [OldBlockStored([1, 2], None, [3, 4, 5, 6], 2, None), OldBlockRemoved([1]), OldAllBlocksCleared()], 1),
    "old arrays, bytes hashes": Batch(6.0, [OldBlockStored([b"\x01\x02", b"\xff" * 32], b"\x00", [7, 8], 1, 4)], 0),
    "large": Batch(7.0, [BlockStored(list(range(i * 64, i * 64 + 64)), i - 1 if i else None, list(range(64 * 16)), 16, None) for i in range(50)], 2),
}

enc = msgspec.msgpack.Encoder()
out = []
for name, batch in cases.items():
    out.append({
        "name": name,
        "payload": enc.encode(batch).hex(),
        "want": {"ts": batch.ts, "rank": batch.attn_dp_rank, "events": [plain(e) for e in batch.events]},
    })
json.dump(out, sys.stdout)
