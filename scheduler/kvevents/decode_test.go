package kvevents

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// fixture is one payload encoded by Python's msgspec (testdata/fixtures.py)
// and the batch it holds.
type fixture struct {
	Name    string
	Payload string
	Want    struct {
		TS     float64
		Rank   *int
		Events []map[string]json.RawMessage
	}
}

// fixtures runs testdata/fixtures.py in the project's venv.
func fixtures(t testing.TB) []fixture {
	t.Helper()
	python := os.Getenv("DUET_PYTHON")
	if python == "" {
		t.Skip("DUET_PYTHON is not set: run through make (make unit, make test), which installs msgspec in .venv")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(python, "testdata/fixtures.py")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fixtures.py: %v\n%s", err, stderr.String())
	}
	var fs []fixture
	if err := json.Unmarshal(out, &fs); err != nil {
		t.Fatal(err)
	}
	return fs
}

// wantHash turns a fixture's hash (an integer, or {"bytes": hex}) into
// the decoder's 64 bits.
func wantHash(t *testing.T, raw json.RawMessage) uint64 {
	t.Helper()
	var b struct{ Bytes string }
	if json.Unmarshal(raw, &b) == nil && b.Bytes != "" || bytes.HasPrefix(raw, []byte(`{"bytes": ""`)) {
		h, _ := hex.DecodeString(b.Bytes)
		return xxhash.Sum64(h)
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatalf("hash %s: %v", raw, err)
	}
	return uint64(n)
}

// TestDecodeMsgspecFixtures decodes what msgspec encodes, in SGLang's
// current shape (tagged maps) and the older one (tagged arrays, bytes
// hashes).
func TestDecodeMsgspecFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			payload, _ := hex.DecodeString(f.Payload)
			b, err := DecodeBatch(payload)
			if err != nil {
				t.Fatal(err)
			}
			if b.TS != f.Want.TS || b.HasRank != (f.Want.Rank != nil) || (f.Want.Rank != nil && b.DPRank != *f.Want.Rank) {
				t.Errorf("ts %v rank %v/%v, want %v %v", b.TS, b.DPRank, b.HasRank, f.Want.TS, f.Want.Rank)
			}
			if len(b.Events) != len(f.Want.Events) {
				t.Fatalf("%d events, want %d", len(b.Events), len(f.Want.Events))
			}
			for i, w := range f.Want.Events {
				var want Event
				var kind string
				_ = json.Unmarshal(w["kind"], &kind)
				want.Kind = map[string]Kind{"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}[kind]
				var hs []json.RawMessage
				_ = json.Unmarshal(w["block_hashes"], &hs)
				for _, h := range hs {
					want.BlockHashes = append(want.BlockHashes, wantHash(t, h))
				}
				if p, ok := w["parent_block_hash"]; ok && string(p) != "null" {
					want.ParentHash, want.HasParent = wantHash(t, p), true
				}
				_ = json.Unmarshal(w["token_ids"], &want.TokenIDs)
				_ = json.Unmarshal(w["block_size"], &want.BlockSize)
				if l, ok := w["lora_id"]; ok && string(l) != "null" {
					_ = json.Unmarshal(l, &want.LoRAID)
					want.HasLoRA = true
				}
				_ = json.Unmarshal(w["medium"], &want.Medium)
				_ = json.Unmarshal(w["cache_salt"], &want.CacheSalt)
				_ = json.Unmarshal(w["lora_name"], &want.LoRAName)
				if !reflect.DeepEqual(b.Events[i], want) {
					t.Errorf("event %d:\n got %+v\nwant %+v", i, b.Events[i], want)
				}
			}
		})
	}
}

// TestDecodeRefuses: payloads that are not batches are errors.
func TestDecodeRefuses(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, payload := range map[string][]byte{
		"empty":           nil,
		"not an array":    enc("hello"),
		"short":           enc([]any{1.0}),
		"events not list": enc([]any{1.0, "x"}),
		"unknown type":    enc([]any{1.0, []any{map[string]any{"type": "BlockExploded"}}}),
		"no type":         enc([]any{1.0, []any{map[string]any{"block_hashes": []int{1}}}}),
		"bad hashes":      enc([]any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": "x"}}}),
		"trailing":        append(enc([]any{1.0, []any{}}), 0xc0),
		"huge length":     {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
	} {
		if _, err := DecodeBatch(payload); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// FuzzDecodeBatch: any bytes decode or fail, never panic or allocate
// what a length field claims.
func FuzzDecodeBatch(f *testing.F) {
	for _, seed := range [][]byte{
		{0x93, 0xcb, 0x41, 0xda, 0x49, 0x81, 0xe8, 0x10, 0, 0, 0x91, 0x81, 0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0},
		{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err == nil && len(b.Events) > len(payload) {
			t.Fatalf("%d events from %d bytes", len(b.Events), len(payload))
		}
	})
}

// BenchmarkDecodeBatch is the decoding share of event ingestion: a batch
// of 8 BlockStored events of 4 pages of 16 tokens (SGLang merges a
// request's consecutive stores into one event), per event.
func BenchmarkDecodeBatch(b *testing.B) {
	var events []any
	for i := range 8 {
		hashes := []int64{int64(i*4 + 1), int64(i*4 + 2), int64(i*4 + 3), int64(i*4 + 4)}
		tokens := make([]int, 64)
		for j := range tokens {
			tokens[j] = 151000 + j
		}
		events = append(events, map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": int64(i * 4),
			"token_ids": tokens, "block_size": 16, "lora_id": nil})
	}
	payload, err := msgpack.Marshal([]any{1764100000.5, events, 0})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if _, err := DecodeBatch(payload); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
}
