package helm

import (
	"path/filepath"
	"reflect"
	"testing"
)

// checkAdmission: the chart passes config.admission through as it is, and
// renders none where the values set none (duet's defaults apply: one
// class). That duet loads the rendered section is checkDuetAndEnvoy's.
func checkAdmission(t *testing.T, vs valueSet, objs map[string]object) {
	var want any
	for _, f := range vs.files {
		var values struct {
			Config map[string]any
		}
		readYAML(t, filepath.Join("examples", f), &values)
		if v, ok := values.Config["admission"]; ok {
			want = v
		}
	}
	got, ok := duetConfig(objs)["admission"]
	switch {
	case want == nil && ok:
		t.Errorf("admission rendered as %v, but the values set none", got)
	case want != nil && !reflect.DeepEqual(got, want):
		t.Errorf("admission rendered as\n%v\nwant the values'\n%v", got, want)
	}
	if vs.admissionClasses == nil {
		return
	}
	var classes []string
	if a, ok := got.(map[string]any); ok {
		list, _ := a["classes"].([]any)
		for _, c := range list {
			name, _ := c.(map[string]any)["name"].(string)
			classes = append(classes, name)
		}
	}
	if !reflect.DeepEqual(classes, vs.admissionClasses) {
		t.Errorf("admission classes %v, want %v", classes, vs.admissionClasses)
	}
}
