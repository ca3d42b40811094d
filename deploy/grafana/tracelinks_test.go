package grafana

import (
	"net/url"
	"slices"
	"strings"
	"testing"
)

// The dashboard's trace links (docs/tracing.md): Jaeger UI searches for the
// services duet's otlp section names by default.
const (
	// jaegerVariable is the textbox variable holding the Jaeger UI's
	// address, as the links use it (raw: not URL-encoded).
	jaegerVariable = "jaeger"
	jaegerLinkBase = "${" + jaegerVariable + ":raw}/search?"
	// jaegerDefault is the variable's default: where the compose stack
	// publishes Jaeger's UI (deploy/compose/compose.yaml, TestTracing).
	jaegerDefault = "http://localhost:16686"
	// The service names of duet's and Envoy's spans: duet's defaults
	// (otlp.service_name, otlp.envoy_service_name).
	duetService  = "duet"
	envoyService = "duet-envoy"
)

// TestDashboardTraceLinks checks the links from the dashboard to a
// request's trace: a textbox variable holds the Jaeger UI's address
// (default, the compose stack's); the dashboard links search Envoy's traces
// of whole requests (all, and the failed ones: error=true) and duet's
// decision spans; and every link that names the variable, on the dashboard
// or on a panel, is a search of Jaeger's UI for one of the two services
// over the dashboard's time range (microseconds, as Jaeger's start and
// end take them), opened in a new tab.
func TestDashboardTraceLinks(t *testing.T) {
	d := loadDashboard(t)
	v, ok := d.variable(jaegerVariable)
	if !ok || v.Type != "textbox" || v.Query != jaegerDefault {
		t.Errorf("variable %s = %+v, %v; want a textbox defaulting to %s", jaegerVariable, v, ok, jaegerDefault)
	}
	type search struct{ service, tags string }
	check := func(where string, l link) (search, bool) {
		t.Helper()
		if !strings.Contains(l.URL, "${"+jaegerVariable) {
			return search{}, false
		}
		rest, ok := strings.CutPrefix(l.URL, jaegerLinkBase)
		if !ok {
			t.Errorf("%s link %q: url %q, want %s...", where, l.Title, l.URL, jaegerLinkBase)
			return search{}, false
		}
		// Grafana's time range, in milliseconds since the epoch.
		rest = strings.NewReplacer("${__from}", "1700000000000", "${__to}", "1700000600000").Replace(rest)
		q, err := url.ParseQuery(rest)
		if err != nil || strings.Contains(rest, "$") {
			t.Errorf("%s link %q: query %q: %v (or a variable left over)", where, l.Title, rest, err)
			return search{}, false
		}
		s := search{q.Get("service"), q.Get("tags")}
		if s.service != duetService && s.service != envoyService {
			t.Errorf("%s link %q searches service %q, want %s or %s", where, l.Title, s.service, duetService, envoyService)
		}
		if q.Get("lookback") != "custom" || q.Get("start") != "1700000000000000" || q.Get("end") != "1700000600000000" {
			t.Errorf("%s link %q: lookback %q start %q end %q, want the dashboard's time range in microseconds",
				where, l.Title, q.Get("lookback"), q.Get("start"), q.Get("end"))
		}
		if s.tags != "" && s.tags != `{"error":"true"}` {
			t.Errorf("%s link %q: tags %q, want none or error=true as Jaeger's JSON", where, l.Title, s.tags)
		}
		if !l.TargetBlank || l.Title == "" {
			t.Errorf("%s link %q: opens in a new tab %v; want a titled link to a new tab", where, l.Title, l.TargetBlank)
		}
		return s, true
	}
	var top []search
	for _, l := range d.Links {
		if s, ok := check("dashboard", l); ok {
			top = append(top, s)
			if l.Type != "link" {
				t.Errorf("dashboard link %q: type %q, want link", l.Title, l.Type)
			}
		}
	}
	for _, want := range []search{{envoyService, ""}, {envoyService, `{"error":"true"}`}, {duetService, ""}} {
		if !slices.Contains(top, want) {
			t.Errorf("no dashboard link searching %+v among %+v", want, top)
		}
	}
	panels := 0
	for _, p := range d.allPanels() {
		for _, l := range p.Links {
			if _, ok := check("panel "+p.Title, l); ok {
				panels++
			}
		}
	}
	if panels == 0 {
		t.Error("no panel links to traces")
	}
}
