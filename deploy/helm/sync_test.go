package helm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// syncConfig is duet's sync section, as rendered.
type syncConfig struct {
	Sync *struct {
		NATS struct {
			URL       string
			TokenFile string `yaml:"token_file"`
		} `yaml:"nats"`
		Subject, Name, Heartbeat string
	}
}

func parseSyncConfig(t *testing.T, data string) syncConfig {
	t.Helper()
	var cfg syncConfig
	if err := yaml.Unmarshal([]byte(data), &cfg); err != nil {
		t.Fatalf("duet.yaml: %v", err)
	}
	return cfg
}

// checkSync checks how the replicas share their state: duet's sync section
// names the value set's NATS, on the release's own subject, with the token
// from the pod's Secret volume when there is one; the replica's name comes
// from the pod's name (POD_NAME, from the downward API); and several duets
// behind a gateway never run without sharing.
func checkSync(t *testing.T, vs valueSet, objs map[string]object) {
	var cm struct{ Data map[string]string }
	objs["ConfigMap/duet-system/duet"].into(t, &cm)
	s := parseSyncConfig(t, cm.Data["duet.yaml"]).Sync
	var dep deployment
	objs["Deployment/duet-system/duet"].into(t, &dep)
	pod := dep.Spec.Template.Spec
	duet := pod.Containers[0]
	podName := ""
	for _, e := range duet.Env {
		if e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			podName = e.ValueFrom.FieldRef.FieldPath
		}
	}
	natsVolume := slices.ContainsFunc(pod.Volumes, func(v volume) bool { return v.Name == "nats-token" })

	if !vs.envoy && vs.replicas > 1 && s == nil {
		t.Errorf("%d duets behind a gateway without a sync section: each would see only part of the feedback", vs.replicas)
	}
	if s == nil {
		if vs.sync != "" {
			t.Fatalf("no sync section, want one naming %s", vs.sync)
		}
		if podName != "" || natsVolume {
			t.Errorf("without sync: POD_NAME from %q, a nats-token volume %v; want neither", podName, natsVolume)
		}
		return
	}
	if s.NATS.URL != vs.sync {
		t.Errorf("sync.nats.url = %q, want %q", s.NATS.URL, vs.sync)
	}
	subject := vs.subject
	if subject == "" {
		subject = defaultSubject
	}
	if s.Subject != subject {
		t.Errorf("sync.subject = %q, want %q", s.Subject, subject)
	}
	if s.Name != "" || podName != "metadata.name" {
		t.Errorf("sync.name %q, POD_NAME from %q: want no name and POD_NAME from metadata.name (each pod its own name)", s.Name, podName)
	}
	if got := s.NATS.TokenFile != ""; got != vs.natsToken || natsVolume != vs.natsToken {
		t.Errorf("sync.nats.token_file %q, a nats-token volume %v; want both %v", s.NATS.TokenFile, natsVolume, vs.natsToken)
	}
}

// The NATS chart's selector labels for the release "nats" (nats-io/k8s,
// helm/charts/nats/templates/_helpers.tpl, nats.selectorLabels), which
// examples/nats-networkpolicy.yaml selects.
var natsPodLabels = map[string]string{
	"app.kubernetes.io/name":      "nats",
	"app.kubernetes.io/instance":  "nats",
	"app.kubernetes.io/component": "nats",
}

// testNATSExample: the NATS that the duet examples name is the one
// examples/nats.yaml installs (the release "nats": its Service "nats" on
// port 4222), it requires the token of the Secret that those examples
// mount, and examples/nats-networkpolicy.yaml is valid and admits duet's
// pods to NATS's client port. The NATS chart itself cannot be fetched here
// (docs/deploy/kubernetes.md says what was checked by hand).
func testNATSExample(t *testing.T, tk tools, schemas string) {
	var values struct {
		Config struct {
			Cluster struct {
				Enabled  bool
				Replicas int
			}
			Merge struct {
				Authorization struct{ Token string }
			}
		}
		Container struct {
			Env map[string]struct {
				ValueFrom struct {
					SecretKeyRef struct{ Name, Key string } `yaml:"secretKeyRef"`
				} `yaml:"valueFrom"`
			}
		}
		NatsBox struct{ Enabled *bool } `yaml:"natsBox"`
	}
	readYAML(t, filepath.Join("examples", "nats.yaml"), &values)
	env, ok := strings.CutPrefix(values.Config.Merge.Authorization.Token, "<< $")
	env, ok2 := strings.CutSuffix(env, " >>")
	if !ok || !ok2 {
		t.Fatalf("nats.yaml: authorization.token %q is not an environment variable (<< $NAME >>)", values.Config.Merge.Authorization.Token)
	}
	if ref := values.Container.Env[env].ValueFrom.SecretKeyRef; ref.Name != natsSecret || ref.Key != "token" {
		t.Errorf("nats.yaml: $%s comes from Secret %q key %q, want %s key token (sync.nats.tokenSecret)", env, ref.Name, ref.Key, natsSecret)
	}
	if !values.Config.Cluster.Enabled || values.Config.Cluster.Replicas < 3 {
		t.Errorf("nats.yaml: cluster %+v, want three servers or more", values.Config.Cluster)
	}
	if values.NatsBox.Enabled == nil || *values.NatsBox.Enabled {
		t.Error("nats.yaml: nats-box is another holder of the token; want it disabled")
	}
	// Every example that shares names the NATS Service of the release
	// "nats" and the Secret above.
	for _, vs := range valueSets {
		if vs.sync == "" || len(vs.files) == 0 {
			continue
		}
		if !strings.HasPrefix(vs.sync, "nats://nats.") || !strings.HasSuffix(vs.sync, ".svc.cluster.local:4222") {
			t.Errorf("%s: sync.nats.url %s is not the Service of the NATS release \"nats\"", vs.files[0], vs.sync)
		}
		if !vs.natsToken || !slices.Contains(vs.external, natsSecret) {
			t.Errorf("%s: want the token of Secret %s", vs.files[0], natsSecret)
		}
	}

	data, err := os.ReadFile(filepath.Join("examples", "nats-networkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubeconform(t, tk, schemas, string(data)); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "Valid: 1,") {
		t.Fatalf("kubeconform summary:\n%s", out)
	}
	var np networkPolicy
	for _, o := range parseObjects(t, string(data)) {
		o.into(t, &np)
	}
	if !sameLabels(np.Spec.PodSelector.MatchLabels, natsPodLabels) {
		t.Errorf("nats-networkpolicy.yaml selects %v, want the NATS pods %v", np.Spec.PodSelector.MatchLabels, natsPodLabels)
	}
	// duet's pods, as the chart labels them for the release "duet".
	manifest, err := render(tk, chartDir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var dep deployment
	parseObjects(t, manifest)["Deployment/duet-system/duet"].into(t, &dep)
	duetPods := dep.Spec.Template.Metadata.Labels
	admits := map[string]string{} // port name -> who: duet, nats, any
	for _, rule := range np.Spec.Ingress {
		who := "any"
		if len(rule.From) > 0 {
			who = "other"
		}
		if len(rule.From) == 1 && len(rule.From[0]) == 1 {
			sel, _ := rule.From[0]["podSelector"].(map[string]any)
			ml, _ := sel["matchLabels"].(map[string]any)
			labels := map[string]string{}
			for k, v := range ml {
				labels[k] = fmt.Sprint(v)
			}
			switch {
			case len(labels) == 0:
			case sameLabels(labels, natsPodLabels):
				who = "nats"
			case subset(labels, duetPods):
				who = "duet"
			}
		}
		for _, p := range rule.Ports {
			admits[fmt.Sprint(p.Port)] = who
		}
	}
	want := map[string]string{"nats": "duet", "cluster": "nats", "monitor": "any"}
	if !sameLabels(admits, want) {
		t.Errorf("nats-networkpolicy.yaml admits %v, want %v", admits, want)
	}
}

// sameLabels reports whether two label sets hold the same pairs.
func sameLabels(a, b map[string]string) bool { return len(a) == len(b) && subset(a, b) }

// readYAML decodes the YAML file at path into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// testNotes renders NOTES.txt (helm template leaves it out, so a copy of
// the chart renders it as an ordinary template) and checks what it tells
// about the replicas: how many, whether and where they share, and never
// the old advice to keep one.
func testNotes(t *testing.T, tk tools) {
	chart := copyChart(t)
	notes, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(chart, "templates", "_notes_test.tpl"),
		[]byte(`{{- define "test.notes" -}}`+string(notes)+`{{- end }}`))
	writeFile(t, filepath.Join(chart, "templates", "notes_test.yaml"), []byte(`notes: {{ include "test.notes" . | toJson }}`+"\n"))
	tests := []struct {
		name          string
		files, set    []string
		want, wantNot []string
	}{
		{
			name: "gateway sharing", files: []string{"aggregated-static.yaml"},
			want: []string{"duet replicas: 2.", "share their state over NATS at " + natsURL + ", subject " + defaultSubject,
				"Secret " + natsSecret, "duet_sync_peers (1)"},
			wantNot: []string{"beside its own Envoy", "routes with its own view"},
		},
		{
			name:    "pairs sharing nothing",
			want:    []string{"duet replicas: 2, each beside its own Envoy.", "Each pair routes with its own view: set sync.nats.url"},
			wantNot: []string{"share their state over NATS", "Tracing"},
		},
		{
			name: "two pools", files: []string{"two-pools.yaml"},
			want: []string{"Pools, chosen by the body's model",
				"deepseek: deepseek-ai/DeepSeek-V3 (aliases deepseek); engines: prefill Service sglang-prefill, decode Service sglang-decode in inference.",
				"qwen: Qwen/Qwen3-8B (aliases qwen); engines: decode Service vllm in inference.",
				"curl -s localhost:8080/v1/models", `"model":"deepseek-ai/DeepSeek-V3"`},
			wantNot: []string{`"model":"default"`, "Engines: "},
		},
		{
			name: "tracing", files: []string{"tracing.yaml"},
			want: []string{"Tracing (docs/tracing.md): each Envoy traces 1 % of the requests, as service duet-envoy;",
				"duet's decision spans join them, as service duet. Spans go to otel-collector.observability.svc.cluster.local:4317."},
		},
		{
			name: "tracing behind a gateway", files: []string{"aggregated-static.yaml"},
			set:     []string{"otlp.enabled=true", "otlp.endpoint=collector:4317", "otlp.envoyEndpoint=other:4317"},
			want:    []string{"Tracing (docs/tracing.md): your gateway traces;", "Spans go to collector:4317."},
			wantNot: []string{"each Envoy traces", "other:4317"},
		},
		{
			name: "one duet", set: []string{"replicaCount=1"},
			want:    []string{"duet replicas: 1, each beside its own Envoy."},
			wantNot: []string{"share their state over NATS", "routes with its own view"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc struct{ Notes string }
			args := append([]string{"template", release}, helmArgs(chart, tt.files, tt.set)...)
			out, err := command(tk.helm, append(args, "--show-only", "templates/notes_test.yaml")...)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(out), &doc); err != nil || doc.Notes == "" {
				t.Fatalf("rendered notes: %v\n%s", err, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(doc.Notes, w) {
					t.Errorf("NOTES lack %q:\n%s", w, doc.Notes)
				}
			}
			for _, w := range append(tt.wantNot, "keep replicaCount", "replicaCount at 1", "one replica", "one duet replica") {
				if strings.Contains(doc.Notes, w) {
					t.Errorf("NOTES say %q:\n%s", w, doc.Notes)
				}
			}
		})
	}
}
