package extproc

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/envoy/contract"
)

func TestPoolRouting(t *testing.T) {
	pd, agg := &fakePicker{decision: pdPick}, &fakePicker{decision: aggPick}
	metrics := NewMetrics(prometheus.NewRegistry())
	c := clientFor(t, Options{Metrics: metrics, MaxBodyBytes: 1 << 20, Pools: []Pool{
		{Name: "ds", Models: []string{"deepseek-ai/DeepSeek-V3"}, Aliases: []string{"deepseek"}, Picker: pd, PrefillCluster: "duet_ds_prefill"},
		{Name: "qwen", Models: []string{"Qwen/Qwen3-8B", "qwen3"}, Picker: agg, PrefillCluster: "duet_qwen_prefill"},
	}})
	chat := func(model string) []byte {
		return []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)
	}
	tests := []struct {
		name, path string
		body       []byte
		wantPool   string
		wantModel  string // the body's model after the rewrite
		wantMirror string
	}{
		{"PD model", "/v1/chat/completions", chat("deepseek-ai/DeepSeek-V3"), "ds", "deepseek-ai/DeepSeek-V3", "duet_ds_prefill"},
		{"alias rewritten", "/v1/chat/completions", chat("deepseek"), "ds", "deepseek-ai/DeepSeek-V3", "duet_ds_prefill"},
		{"aggregated model", "/v1/completions", []byte(`{"model":"Qwen/Qwen3-8B","prompt":"hi"}`), "qwen", "Qwen/Qwen3-8B", ""},
		{"second model name kept", "/v1/chat/completions", chat("qwen3"), "qwen", "qwen3", ""},
		{"generate with a model", "/generate", []byte(`{"model":"qwen3","text":"hi"}`), "qwen", "qwen3", ""},
		{"a request without a body goes to the first pool", "/get_model_info", nil, "ds", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodPost
			if tt.body == nil {
				method = http.MethodGet
			}
			resp := exchange(t, c, method, tt.path, nil, tt.body)
			cr := common(resp)
			if cr == nil {
				t.Fatalf("no routing response: %v", resp)
			}
			h := setHeaders(cr)
			if h[contract.HeaderPool] != tt.wantPool || h[contract.HeaderMirror] != tt.wantMirror {
				t.Errorf("pool %q mirror %q, want %q %q", h[contract.HeaderPool], h[contract.HeaderMirror], tt.wantPool, tt.wantMirror)
			}
			if !cr.GetClearRouteCache() {
				t.Error("the route cache is not cleared: Envoy would keep the route it chose before x-duet-pool was set")
			}
			if tt.body != nil {
				if got := gjson.GetBytes(cr.GetBodyMutation().GetBody(), "model").String(); got != tt.wantModel {
					t.Errorf("body model %q, want %q", got, tt.wantModel)
				}
			}
			if md := resp.GetDynamicMetadata().GetFields()[contract.MetadataNamespace].GetStructValue().GetFields()["pool"].GetStringValue(); md != tt.wantPool {
				t.Errorf("metadata pool %q, want %q", md, tt.wantPool)
			}
		})
	}
	if got := testutil.ToFloat64(metrics.requests.WithLabelValues("chat", "ds", "routed")); got != 2 {
		t.Errorf("routed chat requests of pool ds = %v, want 2", got)
	}
}

func TestPoolRejects(t *testing.T) {
	metrics := NewMetrics(prometheus.NewRegistry())
	picker := &fakePicker{decision: aggPick}
	c := clientFor(t, Options{Metrics: metrics, MaxBodyBytes: 1 << 20, Pools: []Pool{
		{Name: "a", Models: []string{"m1"}, Picker: picker, PrefillCluster: "pa"},
		{Name: "b", Models: []string{"m2"}, Aliases: []string{"two"}, Picker: picker, PrefillCluster: "pb"},
	}})
	tests := []struct {
		name, method, path string
		body               []byte
		status             int
		code               any
	}{
		{"unknown model", "POST", "/v1/chat/completions", []byte(`{"model":"gpt-9","messages":[]}`), 404, "model_not_found"},
		{"missing model", "POST", "/v1/completions", []byte(`{"prompt":"hi"}`), 404, "model_not_found"},
		{"null model", "POST", "/v1/completions", []byte(`{"model":null,"prompt":"hi"}`), 404, "model_not_found"},
		{"generate without a model, several pools", "POST", "/generate", []byte(`{"text":"hi"}`), 404, "model_not_found"},
		{"model not a string", "POST", "/v1/completions", []byte(`{"model":7,"prompt":"hi"}`), 400, float64(400)},
		{"unknown model retrieved", "GET", "/v1/models/gpt-9", nil, 404, "model_not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ir := exchange(t, c, tt.method, tt.path, nil, tt.body).GetImmediateResponse()
			if ir == nil || int(ir.GetStatus().GetCode()) != tt.status {
				t.Fatalf("got %v, want an immediate %d", ir, tt.status)
			}
			var e openAIError
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Code != tt.code {
				t.Errorf("body %s, want code %v", ir.GetBody(), tt.code)
			}
			if tt.status == 404 && (e.Error.Param == nil || *e.Error.Param != "model" || !strings.Contains(e.Error.Message, "m1, m2")) {
				t.Errorf("body %s: want param model and the served models named", ir.GetBody())
			}
		})
	}
	if got := testutil.ToFloat64(metrics.requests.WithLabelValues("chat", "", "model_not_found")); got != 1 {
		t.Errorf("model_not_found chat requests = %v, want 1", got)
	}
}

func TestModelsList(t *testing.T) {
	picker := &fakePicker{decision: aggPick}
	c := clientFor(t, Options{Pools: []Pool{
		{Name: "a", Models: []string{"m1", "m1b"}, Picker: picker, PrefillCluster: "pa"},
		{Name: "b", Models: []string{"m2"}, Aliases: []string{"two"}, Picker: picker, PrefillCluster: "pb"},
	}})
	ir := exchange(t, c, "GET", "/v1/models", nil, nil).GetImmediateResponse()
	var list struct {
		Object string
		Data   []struct{ ID, Object, OwnedBy string }
	}
	if err := json.Unmarshal(ir.GetBody(), &list); err != nil || ir.GetStatus().GetCode() != 200 || list.Object != "list" || len(list.Data) != 3 ||
		list.Data[0].ID != "m1" || list.Data[2].ID != "m2" || list.Data[2].Object != "model" {
		t.Errorf("GET /v1/models: %v %s", ir.GetStatus(), ir.GetBody())
	}
	ir = exchange(t, c, "GET", "/v1/models/two", nil, nil).GetImmediateResponse()
	if ir.GetStatus().GetCode() != 200 || gjson.GetBytes(ir.GetBody(), "id").String() != "two" {
		t.Errorf("GET /v1/models/two: %v %s", ir.GetStatus(), ir.GetBody())
	}

	// A single pool without models passes /v1/models to its engines.
	single := client(t, picker, 1024)
	if resp := exchange(t, single, "GET", "/v1/models", nil, nil); resp.GetImmediateResponse() != nil || common(resp).GetClearRouteCache() {
		t.Errorf("a single pool answered /v1/models itself or cleared the route cache: %v", resp)
	}
}

func TestNewServerPools(t *testing.T) {
	p := &fakePicker{}
	for _, tt := range []struct {
		name string
		opts Options
		want string
	}{
		{"models on some pools only", Options{Pools: []Pool{{Name: "a", Models: []string{"m"}, Picker: p, PrefillCluster: "x"}, {Name: "b", Picker: p, PrefillCluster: "y"}}}, "every pool must name its models"},
		{"a model twice", Options{Pools: []Pool{{Name: "a", Models: []string{"m"}, Picker: p, PrefillCluster: "x"}, {Name: "b", Models: []string{"m"}, Picker: p, PrefillCluster: "y"}}}, "served by two pools"},
		{"two pools of one name", Options{Pools: []Pool{{Name: "a", Models: []string{"m"}, Picker: p, PrefillCluster: "x"}, {Name: "a", Models: []string{"n"}, Picker: p, PrefillCluster: "y"}}}, "two pools are named"},
		{"pools and a picker", Options{Picker: p, Pools: []Pool{{Name: "a", Picker: p, PrefillCluster: "x"}}}, "without Pools"},
		{"no picker", Options{Pools: []Pool{{Name: "a", PrefillCluster: "x"}}}, "no Picker"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewServer(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewServer: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
