package sim

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"
)

// keysOf returns the sorted keys of a JSON object.
func keysOf(t *testing.T, v any) []string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%v is not an object", v)
	}
	return slices.Sorted(maps.Keys(m))
}

// TestModelLoadsMatchServer checks that a Model's /v1/loads body has the
// shape a Server's has: the same top-level keys, the same keys per rank
// and in the aggregate, and the same values on an idle engine.
func TestModelLoadsMatchServer(t *testing.T) {
	cfg := Config{Mode: ModeDecode, Profile: "dsv3-dp8-h100-node", DPSize: 4}
	ts := startTest(t, cfg)
	resp, err := http.Get(ts.api.URL + "/v1/loads?include=core,disagg")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var fromServer map[string]any
	if err := json.Unmarshal(raw, &fromServer); err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	body, err := m.LoadsJSON(0)
	if err != nil {
		t.Fatal(err)
	}
	var fromModel map[string]any
	if err := json.Unmarshal(body, &fromModel); err != nil {
		t.Fatal(err)
	}
	if a, b := keysOf(t, fromServer), keysOf(t, fromModel); !slices.Equal(a, b) {
		t.Fatalf("top-level keys: server %v, model %v", a, b)
	}
	if a, b := keysOf(t, fromServer["aggregate"]), keysOf(t, fromModel["aggregate"]); !slices.Equal(a, b) {
		t.Fatalf("aggregate keys: server %v, model %v", a, b)
	}
	sl, ml := fromServer["loads"].([]any), fromModel["loads"].([]any)
	if len(sl) != 4 || len(ml) != 4 {
		t.Fatalf("ranks: server %d, model %d; want 4", len(sl), len(ml))
	}
	for i := range sl {
		if a, b := keysOf(t, sl[i]), keysOf(t, ml[i]); !slices.Equal(a, b) {
			t.Fatalf("rank %d keys: server %v, model %v", i, a, b)
		}
		for _, k := range []string{"dp_rank", "num_used_tokens", "num_total_tokens", "max_total_num_tokens"} {
			if sl[i].(map[string]any)[k] != ml[i].(map[string]any)[k] {
				t.Errorf("rank %d %s: server %v, model %v", i, k, sl[i].(map[string]any)[k], ml[i].(map[string]any)[k])
			}
		}
	}
}

// TestModelRunsAPDRequest drives a prefill and a decode Model through one
// request by hand, as the cluster simulator does, and checks the times.
func TestModelRunsAPDRequest(t *testing.T) {
	prefill, err := NewModel(Config{Mode: ModePrefill, Profile: "dsv3-dp8-h100-node", DPSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	decode, err := NewModel(Config{Mode: ModeDecode, Profile: "dsv3-dp8-h100-node", DPSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	prompt := Prompt{Tokens: 2000, Blocks: textBlocks(string(make([]byte, 8000)), 16)}
	p, err := prefill.Submit(0, 1, prompt, 10)
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode.Submit(0, 1, prompt, 10)
	if err != nil {
		t.Fatal(err)
	}
	decode.Advance(0)
	if d.State() != ItemTransfer {
		t.Fatalf("decode item %v, want its KV preallocated (ItemTransfer)", d.State())
	}
	var now time.Duration
	for p.State() != ItemDone {
		at, ok := prefill.NextEvent()
		if !ok {
			t.Fatal("prefill model idle before the item finished")
		}
		now = at
		prefill.Advance(now)
	}
	if p.Generated() != 1 || p.DoneAt() <= p.FirstTokenAt() {
		t.Fatalf("prefill item: generated %d, first token %v, done %v", p.Generated(), p.FirstTokenAt(), p.DoneAt())
	}
	decode.KVArrived(now, d)
	for d.State() != ItemDone {
		at, ok := decode.NextEvent()
		if !ok {
			t.Fatal("decode model idle before the item finished")
		}
		decode.Advance(at)
	}
	if d.Generated() != 10 || d.FirstTokenAt() < now {
		t.Fatalf("decode item: generated %d, first token %v (KV at %v)", d.Generated(), d.FirstTokenAt(), now)
	}
	if got := len(decode.Changed()); got == 0 {
		t.Error("no change reported for the decode item")
	}
}
