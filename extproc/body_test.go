package extproc

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestParseBodyBatch(t *testing.T) {
	tests := []struct {
		name  string
		route Route
		body  string
		batch int
		bad   bool
	}{
		{"chat single", RouteChat, `{"messages":[{"role":"user","content":"hi"}]}`, 0, false},
		{"chat n=1", RouteChat, `{"messages":[],"n":1}`, 0, false},
		{"chat n=3", RouteChat, `{"messages":[],"n":3}`, 3, false},
		{"chat n null", RouteChat, `{"messages":[],"n":null}`, 0, false},
		{"chat n=0", RouteChat, `{"messages":[],"n":0}`, 0, true},
		{"chat n=1.5", RouteChat, `{"messages":[],"n":1.5}`, 0, true},
		{"chat n string", RouteChat, `{"messages":[],"n":"2"}`, 0, true},
		{"completions string", RouteCompletions, `{"prompt":"hi"}`, 0, false},
		{"completions token ids", RouteCompletions, `{"prompt":[1,2,3]}`, 0, false},
		{"completions list", RouteCompletions, `{"prompt":["a","b"]}`, 2, false},
		{"completions token lists", RouteCompletions, `{"prompt":[[1],[2],[3]]}`, 3, false},
		{"completions empty list", RouteCompletions, `{"prompt":[]}`, 0, true},
		{"generate text", RouteGenerate, `{"text":"hi"}`, 0, false},
		{"generate text list", RouteGenerate, `{"text":["a","b","c"]}`, 3, false},
		{"generate empty text list", RouteGenerate, `{"text":[]}`, 0, true},
		{"generate input_ids", RouteGenerate, `{"input_ids":[1,2]}`, 0, false},
		{"generate input_ids batch", RouteGenerate, `{"input_ids":[[1],[2]]}`, 2, false},
		{"responses", RouteResponses, `{"input":"hi"}`, 0, false},
		{"malformed", RouteChat, `{"messages":`, 0, true},
		{"array", RouteChat, `[1,2]`, 0, true},
		{"string", RouteChat, `"hi"`, 0, true},
		{"empty", RouteChat, ``, 0, true},
		{"trailing garbage", RouteChat, `{} x`, 0, true},
		// Megabytes of brackets overflowed gjson's recursion and killed the
		// process before the depth check.
		{"deep nesting", RouteChat, `{"messages":` + strings.Repeat("[", 6<<20) + `}`, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBody(tt.route, []byte(tt.body))
			if tt.bad {
				if !errors.Is(err, errBadBody) {
					t.Fatalf("err = %v, want errBadBody", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Batch != tt.batch {
				t.Errorf("Batch = %d, want %d", b.Batch, tt.batch)
			}
		})
	}
}

func TestRewritePD(t *testing.T) {
	client := `{"model":"m","text":["a","b","c"],"bootstrap_room":5,"bootstrap_host":"evil","routed_dp_rank":1,"data_parallel_rank":1,"disagg_prefill_dp_rank":0,"sampling_params":{"max_new_tokens":4}}`
	b, err := ParseBody(RouteGenerate, []byte(client))
	if err != nil {
		t.Fatal(err)
	}
	out, rooms, err := b.Rewrite(Placement{PD: true, BootstrapHost: "10.0.0.1", BootstrapPort: 8998,
		PrefillRank: 2, PrefillDPSize: 4, RoutedRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	j := gjson.ParseBytes(out)
	if len(rooms) != 3 {
		t.Fatalf("rooms = %v, want 3", rooms)
	}
	for i, r := range j.Get("bootstrap_room").Array() {
		if r.Uint() != rooms[i] || r.Uint()%4 != 2 {
			t.Errorf("room %d = %d (minted %d), want room %% 4 == 2", i, r.Uint(), rooms[i])
		}
	}
	for _, f := range []string{"bootstrap_host", "bootstrap_port"} {
		if n := len(j.Get(f).Array()); n != 3 {
			t.Errorf("%s has %d items, want 3: %s", f, n, out)
		}
	}
	if j.Get("bootstrap_host.0").String() != "10.0.0.1" || j.Get("bootstrap_port.2").Int() != 8998 {
		t.Errorf("bootstrap fields wrong: %s", out)
	}
	if j.Get("disagg_prefill_dp_rank").Int() != 2 {
		t.Errorf("disagg_prefill_dp_rank wrong: %s", out)
	}
	if j.Get("routed_dp_rank").Exists() || j.Get("data_parallel_rank").Exists() {
		t.Errorf("client rank fields survived: %s", out)
	}
	if j.Get("sampling_params.max_new_tokens").Int() != 4 || j.Get("model").String() != "m" {
		t.Errorf("client fields lost: %s", out)
	}
}

func TestRewriteScalarAndAggregated(t *testing.T) {
	b, err := ParseBody(RouteChat, []byte(`{"messages":[{"role":"user","content":"hi"}],"bootstrap_room":[1,2]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, rooms, err := b.Rewrite(Placement{PD: true, BootstrapHost: "h", BootstrapPort: 1, PrefillRank: 0, PrefillDPSize: 1, RoutedRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	j := gjson.ParseBytes(out)
	if len(rooms) != 1 || j.Get("bootstrap_room").Uint() != rooms[0] || j.Get("bootstrap_room").IsArray() {
		t.Errorf("scalar room wrong: %s", out)
	}

	out, rooms, err = b.Rewrite(Placement{RoutedRank: 3})
	if err != nil {
		t.Fatal(err)
	}
	j = gjson.ParseBytes(out)
	if rooms != nil || j.Get("bootstrap_room").Exists() || j.Get("disagg_prefill_dp_rank").Exists() {
		t.Errorf("aggregated body carries bootstrap fields: %s", out)
	}
	if j.Get("routed_dp_rank").Int() != 3 {
		t.Errorf("routed_dp_rank not set: %s", out)
	}
}

// A client's routing fields go however often and however spelled they
// come: JSON parsers such as the engine's keep the last of duplicate keys.
func TestRewriteRemovesEveryCopy(t *testing.T) {
	tests := []struct {
		name string
		body string
		pl   Placement
	}{
		{"duplicate keys, PD", `{"model":"m","data_parallel_rank":1,"data_parallel_rank":1,"routed_dp_rank":0,"routed_dp_rank":1}`,
			Placement{PD: true, BootstrapHost: "10.0.0.1", BootstrapPort: 8998, PrefillRank: 1, PrefillDPSize: 2, RoutedRank: -1}},
		{"escaped names", `{"model":"m","\u0072outed_dp_rank":1,"boot\u0073trap_room":7,"r\u0069d":"mine"}`,
			Placement{RoutedRank: -1}},
		{"duplicate rid and room, aggregated", `{"rid":"a","rid":"b","bootstrap_room":1,"bootstrap_room":2,"model":"m"}`,
			Placement{RoutedRank: 0, RID: "duet-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBody(RouteChat, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := b.Rewrite(tt.pl)
			if err != nil {
				t.Fatal(err)
			}
			if !gjson.ValidBytes(out) {
				t.Fatalf("invalid JSON: %s", out)
			}
			counts := map[string]int{}
			gjson.ParseBytes(out).ForEach(func(k, _ gjson.Result) bool {
				counts[k.String()]++
				return true
			})
			for _, f := range routingFields {
				want := 0
				switch {
				case f == FieldRID && tt.pl.RID != "",
					f == FieldRoutedDPRank && tt.pl.RoutedRank >= 0,
					tt.pl.PD && (f == FieldBootstrapHost || f == FieldBootstrapPort || f == FieldBootstrapRoom || f == FieldDisaggPrefillDPRank):
					want = 1
				}
				if counts[f] != want {
					t.Errorf("%s appears %d times, want %d: %s", f, counts[f], want, out)
				}
			}
			if got := gjson.GetBytes(out, "model").String(); got != "m" {
				t.Errorf("model = %q: %s", got, out)
			}
			if tt.pl.RID != "" && gjson.GetBytes(out, FieldRID).String() != tt.pl.RID {
				t.Errorf("rid is not duet's: %s", out)
			}
		})
	}
}

func TestParseBodyNamesWhatIsNotAnObject(t *testing.T) {
	for _, tc := range []struct{ body, kind string }{
		{`[1]`, "an array"}, {` "s" `, "a string"}, {`3`, "a number"}, {`null`, "null"}, {`true`, "a boolean"},
	} {
		_, err := ParseBody(RouteChat, []byte(tc.body))
		if want := "the body must be a JSON object, got " + tc.kind; err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errBadBody) {
			t.Errorf("ParseBody(%q) = %v, want a bad-body error containing %q", tc.body, err, want)
		}
	}
}
