package bench

import (
	"math"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// A case's engines publish KV events and tokenize when the configuration
// says so, whatever the policy, and the policy's duet YAML reaches duet;
// by default neither.
func TestStackOptionsKVEvents(t *testing.T) {
	c := Config{KVEvents: true, SimTokenizer: "/tok/qwen3"}.withDefaults()
	o := c.stackOptions(Policy{Name: "least_cost+events", Prefill: "least_cost", Decode: "least_cost", DuetYAML: "kv_events:\n  mode: auto\n"}, "/tmp/x")
	if !o.KVEvents || o.SimTokenizer != "/tok/qwen3" || o.DuetYAML != "kv_events:\n  mode: auto\n" || o.PrefillPolicy != "least_cost" {
		t.Errorf("options %+v", o)
	}
	if o := c.stackOptions(Policy{Name: "least_cost", Prefill: "least_cost", Decode: "least_cost"}, "/tmp/x"); !o.KVEvents || o.SimTokenizer == "" || o.DuetYAML != "" {
		t.Errorf("plain policy on the same engines: %+v", o)
	}
	if o := (Config{}).withDefaults().stackOptions(Policy{Name: "least_cost"}, "/tmp/x"); o.KVEvents || o.SimTokenizer != "" || o.DuetYAML != "" {
		t.Errorf("default options %+v", o)
	}
}

// duet's metrics are summed by outcome and state; CPU figures are per
// request and per window, unknown when not read.
func TestDuetStats(t *testing.T) {
	counter := func(v float64, labels ...string) *dto.Metric {
		m := &dto.Metric{Counter: &dto.Counter{Value: proto.Float64(v)}}
		for i := 0; i+1 < len(labels); i += 2 {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(labels[i]), Value: proto.String(labels[i+1])})
		}
		return m
	}
	f := &dto.MetricFamily{Metric: []*dto.Metric{counter(3, "pool", "a", "outcome", "ok"), counter(4, "pool", "b", "outcome", "ok"),
		counter(1, "pool", "a", "outcome", "template_fallback")}}
	got := sumByLabel(f, "outcome")
	if len(got) != 2 || got["ok"] != 7 || got["template_fallback"] != 1 {
		t.Errorf("sumByLabel = %v", got)
	}
	if sumAll(f) != 8 || sumAll(nil) != 0 || sumByLabel(nil, "x") != nil {
		t.Errorf("sums of nothing")
	}
	d := DuetStats{CPUSeconds: 1.5, WindowSeconds: 3}
	if d.CPUPerRequestMs(300) != 5 || d.Cores() != 0.5 {
		t.Errorf("%g ms/request, %g cores", d.CPUPerRequestMs(300), d.Cores())
	}
	unknown := DuetStats{CPUSeconds: -1, WindowSeconds: 3}
	if unknown.CPUPerRequestMs(300) >= 0 || unknown.Cores() >= 0 || d.CPUPerRequestMs(0) >= 0 || math.IsNaN(d.Cores()) {
		t.Errorf("unknown CPU read as known")
	}
	d.KVEventStates = map[string]int{"live": 8, "fallback": 8}
	d.Tokenized = map[string]float64{"ok": 10}
	if line := d.line(300); line != "cpu 1.50s in the window (0.50 cores, 5.00 ms/request); tokenized ok=10; kv event targets fallback=8 live=8, 0 events, 0 fallbacks" {
		t.Errorf("line %q", line)
	}
}

// The report's duet table appears for workloads with a tokenizing or
// event-following case, with every duet case of the workload, and not
// otherwise.
func TestReportDuetTable(t *testing.T) {
	base := Summary{Workload: WorkloadMultiTenant, Rate: 4, Requests: 100, HitRate: 0.5}
	plain, tokens, events := base, base, base
	plain.Policy, tokens.Policy, events.Policy = "least_cost", "least_cost+tokens", "least_cost+events"
	plain.Duet = &DuetStats{CPUSeconds: 0.2, WindowSeconds: 4}
	tokens.Duet = &DuetStats{CPUSeconds: 0.3, WindowSeconds: 4, Tokenized: map[string]float64{"ok": 104}}
	events.Duet = &DuetStats{CPUSeconds: -1, WindowSeconds: 4, Tokenized: map[string]float64{"ok": 104},
		KVEventStates: map[string]int{"live": 4, "fallback": 4}, KVEvents: 321}
	var b strings.Builder
	if err := WriteMarkdown(&b, Report{Summaries: []Summary{plain, tokens, events}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 4 | least_cost | 2.00 | 0.050 | - | - | 0 | 0 |",
		"| 4 | least_cost+tokens | 3.00 | 0.075 | ok=104 | - | 0 | 0 |",
		"| 4 | least_cost+events | n/a | n/a | ok=104 | fallback=4 live=4 | 321 | 0 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := WriteMarkdown(&b, Report{Summaries: []Summary{plain}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "duet per case") {
		t.Errorf("duet table without a tokenizing case:\n%s", b.String())
	}
}
