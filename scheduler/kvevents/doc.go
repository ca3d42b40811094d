// Package kvevents reads the KV cache events that SGLang (and vLLM)
// engines publish: what each (engine, DP rank) stored in, removed from or
// cleared out of its prefix cache. It decodes the wire format
// ([DecodeBatch]), keeps a subscription per rank alive ([Subscriber]), and
// holds what a rank's events say in duet's own token block keys
// ([RankView]); how routing weighs that view is the scheduler's business.
//
// # Wire format (SGLang 0.5.23, disaggregation/kv_events.py)
//
// Each DP rank publishes on its own ZMQ PUB socket, the configured port
// plus the rank. A message is three frames: the topic, the sequence number
// (8 bytes, big-endian, from 0 at the publisher's start) and a msgpack
// payload, the batch [ts, events, attn_dp_rank]. An event is a tagged
// msgpack map (msgspec tag=True, omit_defaults): "type" names it
// (BlockStored, BlockRemoved, AllBlocksCleared) and every other key is a
// field; optional fields left at None are absent. Older SGLang and vLLM
// versions write events as tagged arrays instead, [tag, field...], with
// trailing fields possibly missing; both forms decode. Block hashes are
// int64, or bytes in newer vLLM, which are folded to 64 bits.
//
// A publisher with a replay endpoint (a ROUTER socket) answers a DEALER
// that sends ["", start seq] with every buffered batch from that sequence
// on, as ["", topic, seq, payload], then ["", "", -1, ""]; vLLM and older
// SGLang answer ["", seq, payload], then ["", -1, ""]. Both are read. A
// replayed batch is history: its age is not lag (Batch.Replayed).
package kvevents
