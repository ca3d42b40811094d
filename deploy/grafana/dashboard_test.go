// Package grafana holds duet's Grafana dashboard (duet-dashboard.json). Its
// tests check the dashboard's structure, parse every PromQL expression with
// Prometheus's own parser, check that every query on a metric with a pool
// label filters it by the dashboard's pool variable (and no other query
// does), and check every metric, label and label value it queries against
// the real /metrics output of duet, of the simulated engines and of Envoy,
// taken from a running stack in which requests were served, legs failed
// and were aborted, and engines were ejected.
package grafana

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/duet-router/duet/e2e/harness"
)

const dashboardPath = "duet-dashboard.json"

// datasourceUID is how every query names its data source: the dashboard's
// datasource variable, so that any Prometheus can be chosen on import.
const datasourceUID = "${datasource}"

// dashboard is the part of Grafana's dashboard JSON model the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Links      []link  `json:"links"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

// variable is one templating variable.
type variable struct {
	Type       string      `json:"type"`
	Name       string      `json:"name"`
	Query      string      `json:"query"`
	Datasource *datasource `json:"datasource"`
	Multi      bool        `json:"multi"`
	IncludeAll bool        `json:"includeAll"`
	AllValue   string      `json:"allValue"`
	Refresh    int         `json:"refresh"`
}

// variable returns the templating variable named name.
func (d dashboard) variable(name string) (variable, bool) {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return v, true
		}
	}
	return variable{}, false
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
	Links   []link   `json:"links"`
}

// link is a dashboard link or a panel link.
type link struct {
	Title       string `json:"title"`
	Type        string `json:"type"` // a dashboard link's; panel links have none
	URL         string `json:"url"`
	TargetBlank bool   `json:"targetBlank"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *datasource `json:"datasource"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels flattens rows.
func (d dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// query is one PromQL expression of the dashboard.
type query struct {
	where  string // panel title and refId
	expr   string
	legend string
}

func (d dashboard) queries() []query {
	var qs []query
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), expr: tg.Expr, legend: tg.LegendFormat})
		}
	}
	return qs
}

// TestDashboardStructure checks what Grafana needs to show every panel.
func TestDashboardStructure(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are required", d.UID, d.Title)
	}
	hasVar := false
	for _, v := range d.Templating.List {
		hasVar = hasVar || (v.Type == "datasource" && v.Query == "prometheus" && "${"+v.Name+"}" == datasourceUID)
	}
	if !hasVar {
		t.Errorf("no Prometheus datasource variable named as in %s", datasourceUID)
	}
	// The pool variable lists the pools from a metric every pool's
	// scheduler exports, and lets one choose several or all of them.
	if v, ok := d.variable(strings.TrimPrefix(poolVariable, "$")); !ok {
		t.Errorf("no variable %s", poolVariable)
	} else {
		if m, err := poolVariableMetric(v.Query); err != nil {
			t.Error(err)
		} else if !poolLabelled(t)[m] {
			t.Errorf("variable %s lists the pools of %s, which has no pool label", poolVariable, m)
		}
		if v.Type != "query" || v.Datasource == nil || v.Datasource.UID != datasourceUID || !v.Multi || !v.IncludeAll || v.AllValue != ".*" || v.Refresh == 0 {
			t.Errorf("variable %s = %+v, want a query of %s, multi-valued, with All as .*, refreshed", poolVariable, v, datasourceUID)
		}
	}
	ids := map[int]string{}
	for _, p := range d.allPanels() {
		if other, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d is missing or also %q's", p.Title, p.ID, other)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v is outside Grafana's 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != datasourceUID {
			t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, datasourceUID)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != datasourceUID || tg.Datasource.Type != "prometheus" {
				t.Errorf("panel %q target %s: datasource %+v, want prometheus %s", p.Title, tg.RefID, tg.Datasource, datasourceUID)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s: empty expression", p.Title, tg.RefID)
			}
		}
	}
	if len(d.queries()) < 10 {
		t.Errorf("only %d queries", len(d.queries()))
	}
}

// poolVariable is the dashboard's pool variable, as queries use it:
// pool=~"$pool".
const poolVariable = "$pool"

// grafanaVariables are the variables the queries may use, with a value
// standing in for Grafana's when parsing. $pool stays as it is, a valid
// regular expression, so that the tests see which matchers use it.
var grafanaVariables = map[string]string{
	"$__rate_interval": "1m",
	"$__interval":      "15s",
	"$__range":         "30m",
	poolVariable:       poolVariable,
}

var variablePattern = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

// expandVariables replaces Grafana's variables; an unknown one is an error.
func expandVariables(expr string) (string, error) {
	var unknown []string
	out := variablePattern.ReplaceAllStringFunc(expr, func(v string) string {
		if s, ok := grafanaVariables[v]; ok {
			return s
		}
		unknown = append(unknown, v)
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown Grafana variables %q", unknown)
	}
	return out, nil
}

// use is what one query needs from the series it selects.
type use struct {
	metric string
	// labels the query reads from the metric's series (matchers, groupings).
	labels []string
	// values are label values that equality matchers require.
	values map[string]string
}

// analyze parses expr and returns the metrics it selects and the labels it
// reads from each, and the labels its result keeps (for the legend).
func analyze(expr string) ([]use, []string, error) {
	expanded, err := expandVariables(expr)
	if err != nil {
		return nil, nil, err
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expanded)
	if err != nil {
		return nil, nil, fmt.Errorf("promql: %w", err)
	}
	var uses []use
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		u := use{metric: vs.Name, values: map[string]string{}}
		// The innermost aggregation groups the selected series themselves;
		// outer ones group its result, whose labels it already needed.
		for i := len(path) - 1; i >= 0; i-- {
			if agg, ok := path[i].(*parser.AggregateExpr); ok {
				if !agg.Without {
					u.labels = append(u.labels, agg.Grouping...)
				}
				break
			}
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				continue
			}
			u.labels = append(u.labels, m.Name)
			if m.Type == labels.MatchEqual {
				u.values[m.Name] = m.Value
			}
		}
		uses = append(uses, u)
		return nil
	})
	var kept []string
	if agg, ok := outermostAggregate(e); ok && !agg.Without {
		kept = agg.Grouping
	}
	return uses, kept, nil
}

// outermostAggregate finds the aggregation whose grouping decides the
// result's labels (through histogram_quantile, parentheses and "or").
func outermostAggregate(e parser.Expr) (*parser.AggregateExpr, bool) {
	switch e := e.(type) {
	case *parser.AggregateExpr:
		return e, true
	case *parser.ParenExpr:
		return outermostAggregate(e.Expr)
	case *parser.Call:
		if e.Func.Name == "histogram_quantile" {
			agg, ok := outermostAggregate(e.Args[1])
			if ok {
				cp := *agg
				cp.Grouping = slices.DeleteFunc(slices.Clone(agg.Grouping), func(l string) bool { return l == "le" })
				return &cp, true
			}
		}
	case *parser.BinaryExpr:
		return outermostAggregate(e.LHS)
	}
	return nil, false
}

var legendPattern = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// TestDashboardQueriesParse parses every expression with Prometheus's parser
// and checks that every legend label survives the query's aggregation.
func TestDashboardQueriesParse(t *testing.T) {
	for _, q := range loadDashboard(t).queries() {
		uses, kept, err := analyze(q.expr)
		if err != nil {
			t.Errorf("%s: %q: %v", q.where, q.expr, err)
			continue
		}
		if len(uses) == 0 {
			t.Errorf("%s: %q selects no metric", q.where, q.expr)
		}
		for _, m := range legendPattern.FindAllStringSubmatch(q.legend, -1) {
			if !slices.Contains(kept, m[1]) {
				t.Errorf("%s: legend %q names %s, which the query's result does not keep (%v)", q.where, q.legend, m[1], kept)
			}
		}
	}
}

// poolVariableQuery is the pool variable's query: the pool label's values
// on one metric.
var poolVariableQuery = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*pool\s*\)$`)

// poolVariableMetric returns the metric the pool variable's query reads.
func poolVariableMetric(query string) (string, error) {
	m := poolVariableQuery.FindStringSubmatch(query)
	if m == nil {
		return "", fmt.Errorf("variable %s: query %q, want label_values(<metric>, pool)", poolVariable, query)
	}
	return m[1], nil
}

// poolSources are where the metrics with a pool label are defined, relative
// to this directory. duet registers each pool's scheduler metrics
// (packages scheduler and scheduler/...) with a Registerer that adds the
// pool's name as the constant label pool, so every metric they define has
// it; elsewhere (extproc) a metric has it when pool is among its variable
// labels. Other packages' metrics (duet_auth_*, duet_sync_*,
// duet_feedback_entries_total, duet_legs_*, duet_leg_*, go_*, process_*)
// have none.
var poolSources = []struct {
	dir string
	all bool // every metric defined there, or only those with a pool label
}{
	{"../../scheduler", true},
	{"../../extproc", false},
}

var (
	// metricName finds a metric name where one is defined: Name: "duet_…"
	// in the options of prometheus.New*, or prometheus.NewDesc("duet_…".
	metricName = regexp.MustCompile(`(?:\bName:\s*|\bNewDesc\(\s*)"(duet_[a-z0-9_]+)"`)
	// vecLabels finds a *Vec's name and label names:
	// Name: "duet_…", … }, []string{"a", "b"}).
	vecLabels = regexp.MustCompile(`\bName:\s*"(duet_[a-z0-9_]+)",[^}]*\},\s*\[\]string\{([^}]*)\}`)
)

// poolLabelled returns the metrics with a pool label, as series names
// (histograms also as name_bucket, name_sum and name_count), from the Go
// sources of poolSources.
func poolLabelled(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	add := func(name string) {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			out[name+suffix] = true
		}
	}
	for _, src := range poolSources {
		err := filepath.WalkDir(src.dir, func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if src.all {
				for _, m := range metricName.FindAllStringSubmatch(string(data), -1) {
					add(m[1])
				}
				return nil
			}
			for _, m := range vecLabels.FindAllStringSubmatch(string(data), -1) {
				if slices.Contains(strings.Split(strings.ReplaceAll(m[2], " ", ""), ","), `"pool"`) {
					add(m[1])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The sources are read right: a few metrics that must be there.
	for _, m := range []string{"duet_picks_total", "duet_pick_duration_seconds_bucket", "duet_reservations", "duet_target_tokens", "duet_extproc_requests_total"} {
		if !out[m] {
			t.Fatalf("%s is not among the metrics with a pool label found in %v: %v", m, poolSources, slices.Sorted(maps.Keys(out)))
		}
	}
	for _, m := range []string{"duet_extproc_decision_seconds_bucket", "duet_legs_tracked", "duet_feedback_entries_total"} {
		if out[m] {
			t.Fatalf("%s is among the metrics with a pool label", m)
		}
	}
	return out
}

// TestDashboardPoolFilter checks that every selector of a metric with a
// pool label filters it by the pool variable (pool=~"$pool"), and that no
// other selector reads a pool label, which would hide its series as soon
// as one pool is chosen.
func TestDashboardPoolFilter(t *testing.T) {
	pooled := poolLabelled(t)
	filtered := 0
	for _, q := range loadDashboard(t).queries() {
		expanded, err := expandVariables(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		e, err := parser.NewParser(parser.Options{}).ParseExpr(expanded)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			var byVariable, other []string
			for _, m := range vs.LabelMatchers {
				if m.Name != "pool" {
					continue
				}
				if m.Type == labels.MatchRegexp && m.Value == poolVariable {
					byVariable = append(byVariable, m.String())
				} else {
					other = append(other, m.String())
				}
			}
			switch {
			case pooled[vs.Name] && (len(byVariable) != 1 || len(other) > 0):
				t.Errorf("%s: %s has a pool label: want exactly one pool matcher, pool=~%q, got %q, %q in %q", q.where, vs.Name, poolVariable, byVariable, other, q.expr)
			case !pooled[vs.Name] && len(byVariable)+len(other) > 0:
				t.Errorf("%s: %s has no pool label, but %q matches on it", q.where, vs.Name, q.expr)
			case pooled[vs.Name]:
				filtered++
			}
			// A grouping by pool needs a pool label too.
			for i := len(path) - 1; i >= 0; i-- {
				if agg, ok := path[i].(*parser.AggregateExpr); ok {
					if !pooled[vs.Name] && !agg.Without && slices.Contains(agg.Grouping, "pool") {
						t.Errorf("%s: %s has no pool label, but %q groups it by pool", q.where, vs.Name, q.expr)
					}
					break
				}
			}
			return nil
		})
	}
	if filtered == 0 {
		t.Error("no query filters by pool")
	}
}

// scrapeLabels are the labels Prometheus adds to every scraped series.
var scrapeLabels = []string{"job", "instance"}

// series is what the stack exports: per series name, the label names and
// the values seen for each.
type series map[string]map[string]map[string]bool

// add records the families of one /metrics answer under their series names
// (histograms and summaries as name_bucket/_sum/_count with their le or
// quantile label).
func (s series) add(families map[string]*dto.MetricFamily) {
	put := func(name string, m *dto.Metric, extra ...string) {
		if s[name] == nil {
			s[name] = map[string]map[string]bool{}
		}
		lbls := s[name]
		set := func(k, v string) {
			if lbls[k] == nil {
				lbls[k] = map[string]bool{}
			}
			lbls[k][v] = true
		}
		for _, lp := range m.GetLabel() {
			set(lp.GetName(), lp.GetValue())
		}
		for i := 0; i+1 < len(extra); i += 2 {
			set(extra[i], extra[i+1])
		}
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					put(name+"_bucket", m, "le", fmt.Sprint(b.GetUpperBound()))
				}
				put(name+"_bucket", m, "le", "+Inf")
				put(name+"_sum", m)
				put(name+"_count", m)
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					put(name, m, "quantile", fmt.Sprint(q.GetQuantile()))
				}
				put(name+"_sum", m)
				put(name+"_count", m)
			default:
				put(name, m)
			}
		}
	}
}

// missing returns what u needs that s lacks, or "".
func (s series) missing(u use) string {
	lbls, ok := s[u.metric]
	if !ok {
		return "metric " + u.metric + " is not exported"
	}
	for _, l := range u.labels {
		if lbls[l] == nil && !slices.Contains(scrapeLabels, l) {
			return fmt.Sprintf("%s has no label %s (labels: %v)", u.metric, l, slices.Sorted(maps.Keys(lbls)))
		}
	}
	for l, v := range u.values {
		if lbls[l] != nil && !lbls[l][v] {
			return fmt.Sprintf("%s has no series with %s=%q (seen: %v)", u.metric, l, v, slices.Sorted(maps.Keys(lbls[l])))
		}
	}
	return ""
}

// faultHealth makes duet probe and eject within the test's time.
const faultHealth = `health:
  interval: 250ms
  timeout: 250ms
  base_ejection: 1s
  max_ejection: 4s
`

// notYetExported are series the dashboard queries that the stack below
// does not export: the admission queue's wait histogram has a series only
// once a request has queued, and this stack never saturates its engines.
// TestDashboardMetricsExist logs one that is absent instead of failing;
// once exported, a series is checked like any other (labels and label
// values).
var notYetExported = map[string]bool{
	"duet_admission_wait_seconds_bucket": true,
}

// TestDashboardMetricsExist runs Envoy, duet and simulated engines, makes
// every event the dashboard shows happen (requests served, a decode engine
// failing every request so that its legs fail, their prefill legs are
// aborted and its targets ejected, then a prefill engine killed so that its
// probes and scrapes fail and it is ejected), and checks each query against
// the /metrics output of duet, the engines and Envoy.
func TestDashboardMetricsExist(t *testing.T) {
	d := loadDashboard(t)
	var uses []use
	// The pool variable's metric, with its pool label.
	if v, ok := d.variable(strings.TrimPrefix(poolVariable, "$")); ok {
		m, err := poolVariableMetric(v.Query)
		if err != nil {
			t.Fatal(err)
		}
		uses = append(uses, use{metric: m, labels: []string{"pool"}, values: map[string]string{}})
	}
	for _, q := range d.queries() {
		u, _, err := analyze(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		uses = append(uses, u...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := harness.Start(ctx, harness.Options{
		Prefill:  []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		Decode:   []harness.SimSpec{{DPSize: 2}, {DPSize: 2, Args: []string{"--fault-error-rate", "1"}}},
		LogLevel: "info",
		DuetYAML: faultHealth,
	})
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	defer s.CloseLoggingIfFailed(t)

	client := &http.Client{Timeout: 20 * time.Second}
	send := func(n int) {
		for i := range n {
			harness.Chat(ctx, client, s.EnvoyURL, i, i%2 == 0, 8)
		}
	}
	send(24)
	s.Prefill[1].Kill()

	var last []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := series{}
		var errs []string
		endpoints := []string{s.DuetAdminURL + "/metrics", s.EnvoyAdminURL + "/stats/prometheus",
			s.Prefill[0].URL + "/metrics", s.Decode[0].URL + "/metrics"}
		for _, url := range endpoints {
			families, err := harness.ScrapeMetrics(ctx, nil, url)
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			got.add(families)
		}
		last = errs
		var awaited []string
		for _, u := range uses {
			m := got.missing(u)
			switch {
			case m == "":
			case notYetExported[u.metric] && got[u.metric] == nil:
				awaited = append(awaited, u.metric)
			default:
				last = append(last, m)
			}
		}
		if len(last) == 0 && len(awaited) > 0 {
			slices.Sort(awaited)
			t.Logf("not exported yet (notYetExported): %v", slices.Compact(awaited))
		}
		if len(last) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		send(2)
		time.Sleep(250 * time.Millisecond)
	}
	slices.Sort(last)
	t.Errorf("the dashboard queries what the stack does not export:\n  %s", strings.Join(slices.Compact(last), "\n  "))
}
