package config

import (
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// referenceDoc is the configuration reference that must list every key.
const referenceDoc = "../../../../docs/configuration.md"

// keyPaths walks the YAML keys of t: every node (sections included) goes in
// nodes, and the keys that hold a value go in leaves. A list of mappings
// contributes "<key>[].<field>"; a map contributes "<key>.<...>" as a pattern.
func keyPaths(t reflect.Type, prefix string, nodes, leaves map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		nodes[path] = f.Type
		typ := f.Type
		if typ.Kind() == reflect.Pointer && typ.Elem().Kind() == reflect.Struct {
			typ = typ.Elem() // an optional section
		}
		switch {
		case typ.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]():
			keyPaths(typ, path+".", nodes, leaves)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			keyPaths(f.Type.Elem(), path+"[].", nodes, leaves)
		case f.Type.Kind() == reflect.Map:
			leaves[path] = f.Type
			nodes[path+".<"] = f.Type.Elem() // any "<path>.<name>" row
		default:
			leaves[path] = f.Type
		}
	}
}

// referenceRows returns the reference's table rows: key to default cell.
func referenceRows(t *testing.T, doc string) map[string]string {
	t.Helper()
	rows := map[string]string{}
	row := regexp.MustCompile("^\\| `([^`]+)` \\|[^|]*\\|([^|]*)\\|")
	for _, line := range strings.Split(doc, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("%s: key %s is listed twice", referenceDoc, m[1])
		}
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	return rows
}

// yamlBlocks returns the fenced YAML examples in doc.
func yamlBlocks(doc string) []string {
	return regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllString(doc, -1)
}

// leafValue returns the field at a dotted key path of v (no lists or maps);
// an absent optional section reads as its zero value.
func leafValue(v reflect.Value, path string) reflect.Value {
	for _, name := range strings.Split(path, ".") {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v = reflect.New(v.Type().Elem())
			}
			v = v.Elem()
		}
		t := v.Type()
		for i := range t.NumField() {
			if strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0] == name {
				v = v.Field(i)
				break
			}
		}
	}
	return v
}

// sameValue reports whether the documented default (a cell's first
// backquoted token) equals the loader's default v.
func sameValue(doc string, v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Int64:
		if v.Type() == reflect.TypeFor[time.Duration]() {
			d, err := time.ParseDuration(doc)
			return err == nil && d == time.Duration(v.Int())
		}
		n, err := strconv.ParseInt(doc, 10, 64)
		return err == nil && n == v.Int()
	case reflect.Int, reflect.Uint64:
		n, err := strconv.ParseFloat(doc, 64)
		return err == nil && n == float64(v.Convert(reflect.TypeFor[float64]()).Float())
	case reflect.Float64:
		f, err := strconv.ParseFloat(doc, 64)
		return err == nil && f == v.Float()
	case reflect.Bool:
		b, err := strconv.ParseBool(doc)
		return err == nil && b == v.Bool()
	case reflect.String:
		return doc == v.String()
	}
	return false
}

// The reference lists exactly the keys of Config, with the defaults the
// loader applies, and its examples load.
func TestReferenceListsEveryKey(t *testing.T) {
	data, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	nodes, leaves := map[string]reflect.Type{}, map[string]reflect.Type{}
	keyPaths(reflect.TypeFor[Config](), "", nodes, leaves)
	rows := referenceRows(t, doc)

	for _, key := range slices.Sorted(maps.Keys(leaves)) {
		if _, ok := rows[key]; !ok {
			t.Errorf("%s does not list the key %s", referenceDoc, key)
		}
	}
	for key := range rows {
		if _, ok := nodes[key]; ok {
			continue
		}
		if i := strings.LastIndex(key, ".<"); i > 0 {
			if _, ok := nodes[key[:i]+".<"]; ok {
				continue
			}
		}
		t.Errorf("%s lists %s, which is not a configuration key", referenceDoc, key)
	}

	defaults, err := Parse([]byte("decode: [{url: \"http://10.0.0.1:30000\"}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	// The defaults of these sections apply when the section is present.
	sections := map[string]*Config{}
	for prefix, yaml := range map[string]string{
		"kubernetes.": "kubernetes: {decode: {service: sglang}}\n",
		"envoy.duet_tls.": "decode: [{url: \"http://10.0.0.1:30000\"}]\nauth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}}\n" +
			"envoy: {duet_tls: {cert_file: c, key_file: k, ca_file: ca}}\n",
		"sync.": "decode: [{url: \"http://10.0.0.1:30000\"}]\nsync: {nats: {url: \"nats://nats:4222\"}}\n",
		"otlp.": "decode: [{url: \"http://10.0.0.1:30000\"}]\notlp: {endpoint: \"collector:4317\"}\n",
	} {
		if sections[prefix], err = Parse([]byte(yaml)); err != nil {
			t.Fatal(err)
		}
	}
	token := regexp.MustCompile("`([^`]*)`")
	for key, cell := range rows {
		typ, leaf := leaves[key]
		if !leaf || strings.Contains(key, "[]") || typ.Kind() == reflect.Map || typ.Kind() == reflect.Slice {
			continue
		}
		loaded := defaults
		for prefix, cfg := range sections {
			if strings.HasPrefix(key, prefix) {
				loaded = cfg
			}
		}
		v := leafValue(reflect.ValueOf(*loaded), key)
		m := token.FindStringSubmatch(cell)
		switch {
		case strings.HasPrefix(cell, "required"):
			// No default.
		case strings.HasPrefix(cell, "as `"):
			// Another key's value.
			if other := leafValue(reflect.ValueOf(*loaded), m[1]); !other.IsValid() || !v.Equal(other) {
				t.Errorf("%s: the default of %s is %s's value, but the loader sets %v (%s is %v)", referenceDoc, key, m[1], v, m[1], other)
			}
		case strings.HasPrefix(cell, "empty"):
			if !v.IsZero() {
				t.Errorf("%s: the default of %s is empty, but the loader sets %v", referenceDoc, key, v)
			}
		case m == nil:
			t.Errorf("%s: the default of %s (%q) names no value in backquotes", referenceDoc, key, cell)
		case v.IsZero() && strings.Contains(cell, "(scheduler default)"):
			// The scheduler's default; the loader leaves the key at zero.
		case !sameValue(m[1], v):
			t.Errorf("%s: the default of %s is %q, but the loader sets %v", referenceDoc, key, m[1], v)
		}
	}

	for _, path := range []string{referenceDoc, "../../../../README.md"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks := yamlBlocks(string(data))
		if len(blocks) == 0 {
			t.Errorf("%s has no YAML example", path)
		}
		for i, b := range blocks {
			b = strings.TrimSuffix(strings.TrimPrefix(b, "```yaml\n"), "```")
			if _, err := Parse([]byte(b)); err != nil {
				t.Errorf("%s: YAML example %d does not load: %v", path, i+1, err)
			}
		}
	}
}
