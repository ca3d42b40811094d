"""Decodes duet-sim's KV event payloads with msgspec and SGLang 0.5.23's
structures (scheduler/kvevents/testdata/sglang_events.py), strictly typed
as SGLang's KVEventBatch declares its events, and encodes them again.

Reads hex payloads, one per line, on stdin; writes one JSON object per
line: {"reencoded": hex, "batch": the decoded batch as plain data}, or
{"error": message}.
"""
import json
import os
import sys
from typing import Union

import msgspec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scheduler", "kvevents", "testdata"))
from sglang_events import AllBlocksCleared, Batch, BlockRemoved, BlockStored  # noqa: E402


class KVEventBatch(Batch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


dec = msgspec.msgpack.Decoder(KVEventBatch)
enc = msgspec.msgpack.Encoder()
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        batch = dec.decode(bytes.fromhex(line))
    except msgspec.DecodeError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        continue
    plain = {"ts": batch.ts, "rank": batch.attn_dp_rank,
             "events": [dict(type=type(e).__name__, **msgspec.structs.asdict(e)) for e in batch.events]}
    print(json.dumps({"reencoded": enc.encode(batch).hex(), "batch": plain}), flush=True)
