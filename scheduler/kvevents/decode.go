package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is what an event says happened.
type Kind uint8

// The events SGLang publishes.
const (
	// BlockStored: blocks entered the cache.
	BlockStored Kind = iota + 1
	// BlockRemoved: blocks left the cache (or this medium of it).
	BlockRemoved
	// AllBlocksCleared: the cache was emptied (flush_cache, a restart).
	AllBlocksCleared
)

// String names the kind as the wire does.
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one decoded event.
type Event struct {
	Kind Kind
	// BlockHashes are the engine's hashes of the blocks, one per page, in
	// order (Stored and Removed).
	BlockHashes []uint64
	// ParentHash is the hash of the block before the first (Stored);
	// HasParent is false for a chain that starts at the root.
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the stored blocks' tokens, BlockSize per block.
	TokenIDs  []int64
	BlockSize int
	// LoRAID is the adapter's id; HasLoRA is false without one.
	LoRAID  int64
	HasLoRA bool
	// Medium is the tier ("GPU", "CPU_PINNED", "DISK", "EXTERNAL"); empty
	// when the engine does not say (its GPU cache).
	Medium string
	// CacheSalt and LoRAName, when the engine sends them.
	CacheSalt, LoRAName string
}

// Batch is one published message's payload.
type Batch struct {
	// TS is the publisher's timestamp (seconds since the epoch).
	TS     float64
	Events []Event
	// DPRank is the attention DP rank that published it; HasRank is false
	// when the batch does not say.
	DPRank  int
	HasRank bool
	// Replayed is set by the Subscriber, never decoded: the batch came
	// from the publisher's replay socket, not live. It is history: how
	// old it is says nothing of how late the live stream runs.
	Replayed bool
	// Current is set by the Subscriber on the last batch of a replay that
	// ran to the publisher's end marker with no live batch to follow: the
	// publisher held nothing newer when it answered, so the view is as
	// current as the engine's cache, however long the engine has been idle.
	Current bool
}

// ErrMalformed marks a payload that is not a batch.
var ErrMalformed = errors.New("malformed KV event batch")

// maxItems bounds every array and map a payload may declare, so that a
// garbage length costs an error, never an allocation of that size.
const maxItems = 1 << 20

// DecodeBatch decodes a batch payload.
func DecodeBatch(payload []byte) (Batch, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	b, err := decodeBatch(d)
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if _, err := d.PeekCode(); !errors.Is(err, io.EOF) {
		return Batch{}, fmt.Errorf("%w: trailing bytes", ErrMalformed)
	}
	return b, nil
}

// decodeBatch reads [ts, events, attn_dp_rank?].
func decodeBatch(d *msgpack.Decoder) (Batch, error) {
	n, err := arrayLen(d)
	if err != nil {
		return Batch{}, err
	}
	if n < 2 {
		return Batch{}, fmt.Errorf("a batch of %d fields", n)
	}
	var b Batch
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return Batch{}, fmt.Errorf("ts: %w", err)
	}
	m, err := arrayLen(d)
	if err != nil {
		return Batch{}, fmt.Errorf("events: %w", err)
	}
	b.Events = make([]Event, 0, min(m, 1024))
	for i := range m {
		e, err := decodeEvent(d)
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	if n >= 3 {
		rank, ok, err := optInt(d)
		if err != nil {
			return Batch{}, fmt.Errorf("attn_dp_rank: %w", err)
		}
		b.DPRank, b.HasRank = int(rank), ok
		for range n - 3 {
			if err := d.Skip(); err != nil {
				return Batch{}, err
			}
		}
	}
	return b, nil
}

// decodeEvent reads one event, a tagged map or a tagged array.
func decodeEvent(d *msgpack.Decoder) (Event, error) {
	c, err := d.PeekCode()
	if err != nil {
		return Event{}, err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return decodeMapEvent(d)
	}
	return decodeArrayEvent(d)
}

// decodeMapEvent reads {"type": tag, field: value, ...}.
func decodeMapEvent(d *msgpack.Decoder) (Event, error) {
	n, err := d.DecodeMapLen()
	if err != nil {
		return Event{}, err
	}
	if n < 0 || n > maxItems {
		return Event{}, fmt.Errorf("a map of %d entries", n)
	}
	var e Event
	for range n {
		key, err := d.DecodeString()
		if err != nil {
			return Event{}, fmt.Errorf("key: %w", err)
		}
		if err := e.decodeField(d, key); err != nil {
			return Event{}, fmt.Errorf("%s: %w", key, err)
		}
	}
	if e.Kind == 0 {
		return Event{}, errors.New("an event without a type")
	}
	return e, nil
}

// arrayFields are the positional fields of each tagged-array event.
var arrayFields = map[Kind][]string{
	BlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "cache_salt", "session_id", "lora_name"},
	BlockRemoved:     {"block_hashes", "medium"},
	AllBlocksCleared: {},
}

// decodeArrayEvent reads [tag, field...] (older encoders), trailing
// fields possibly missing.
func decodeArrayEvent(d *msgpack.Decoder) (Event, error) {
	n, err := arrayLen(d)
	if err != nil {
		return Event{}, err
	}
	if n < 1 {
		return Event{}, errors.New("an empty event")
	}
	var e Event
	if err := e.decodeField(d, "type"); err != nil {
		return Event{}, fmt.Errorf("type: %w", err)
	}
	fields := arrayFields[e.Kind]
	for i := 1; i < n; i++ {
		if i-1 >= len(fields) {
			if err := d.Skip(); err != nil {
				return Event{}, err
			}
			continue
		}
		if err := e.decodeField(d, fields[i-1]); err != nil {
			return Event{}, fmt.Errorf("%s: %w", fields[i-1], err)
		}
	}
	return e, nil
}

// decodeField reads one named field into e; unknown fields are skipped.
func (e *Event) decodeField(d *msgpack.Decoder, key string) error {
	var err error
	switch key {
	case "type":
		tag, err := d.DecodeString()
		if err != nil {
			return err
		}
		switch tag {
		case "BlockStored":
			e.Kind = BlockStored
		case "BlockRemoved":
			e.Kind = BlockRemoved
		case "AllBlocksCleared":
			e.Kind = AllBlocksCleared
		default:
			return fmt.Errorf("unknown event type %q", tag)
		}
	case "block_hashes":
		e.BlockHashes, err = list(d, 4096, hash)
	case "parent_block_hash":
		e.ParentHash, e.HasParent, err = optHash(d)
	case "token_ids":
		e.TokenIDs, err = list(d, 1<<16, (*msgpack.Decoder).DecodeInt64)
	case "block_size":
		var n int64
		n, _, err = optInt(d)
		e.BlockSize = int(n)
	case "lora_id":
		e.LoRAID, e.HasLoRA, err = optInt(d)
	case "medium":
		e.Medium, err = optString(d)
	case "cache_salt":
		e.CacheSalt, err = optString(d)
	case "lora_name":
		e.LoRAName, err = optString(d)
	default:
		err = d.Skip()
	}
	return err
}

// arrayLen reads an array header, bounded.
func arrayLen(d *msgpack.Decoder) (int, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n < 0 || n > maxItems {
		return 0, fmt.Errorf("an array of %d items", n)
	}
	return n, nil
}

// isNil consumes a nil if one is next.
func isNil(d *msgpack.Decoder) (bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.DecodeNil()
	}
	return false, nil
}

// optInt reads an integer or nil.
func optInt(d *msgpack.Decoder) (int64, bool, error) {
	if null, err := isNil(d); null || err != nil {
		return 0, false, err
	}
	n, err := d.DecodeInt64()
	return n, err == nil, err
}

// optString reads a string or nil ("").
func optString(d *msgpack.Decoder) (string, error) {
	if null, err := isNil(d); null || err != nil {
		return "", err
	}
	return d.DecodeString()
}

// hash reads one block hash: an integer (its 64 bits), or bytes folded to
// 64 bits with xxhash.
func hash(d *msgpack.Decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		b, err := d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		return xxhash.Sum64(b), nil
	}
	if c == msgpcode.Uint64 {
		return d.DecodeUint64()
	}
	n, err := d.DecodeInt64()
	return uint64(n), err
}

// optHash reads a hash or nil.
func optHash(d *msgpack.Decoder) (uint64, bool, error) {
	if null, err := isNil(d); null || err != nil {
		return 0, false, err
	}
	h, err := hash(d)
	return h, err == nil, err
}

// list reads a list (or nil) of items that read decodes, preallocating at
// most capHint of them whatever length the list declares.
func list[T any](d *msgpack.Decoder, capHint int, read func(*msgpack.Decoder) (T, error)) ([]T, error) {
	if null, err := isNil(d); null || err != nil {
		return nil, err
	}
	n, err := arrayLen(d)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, min(n, capHint))
	for range n {
		v, err := read(d)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
