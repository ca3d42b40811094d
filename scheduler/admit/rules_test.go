package admit

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"
)

func TestClassify(t *testing.T) {
	sum := sha256.Sum256([]byte("sk-gold"))
	gold := hex.EncodeToString(sum[:])
	rules := Rules{
		Classes: []string{"batch", "interactive", "gold"}, Default: "batch",
		ClassHeader: "X-Duet-Priority", TenantHeader: "x-duet-tenant", TenantFromAPIKey: true,
		APIKeys: map[string]string{gold: "gold"},
		Models:  map[string]string{"chat-model": "interactive"},
		Pools:   map[string]string{"fast": "interactive"},
	}
	c, err := rules.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Headers(); !slices.Equal(got, []string{"x-duet-priority", "x-duet-tenant", "authorization"}) {
		t.Errorf("headers %v", got)
	}
	tests := []struct {
		name        string
		headers     map[string]string
		model, pool string
		wantClass   int
		wantTenant  string
	}{
		{"nothing", nil, "m", "p", 0, ""},
		{"header", map[string]string{"x-duet-priority": " interactive "}, "m", "p", 1, ""},
		{"unknown class in header", map[string]string{"x-duet-priority": "vip"}, "m", "p", 0, ""},
		{"header beats api key", map[string]string{"x-duet-priority": "batch", "authorization": "Bearer sk-gold"}, "m", "p", 0, gold[:16]},
		{"api key", map[string]string{"authorization": "bearer sk-gold"}, "chat-model", "p", 2, gold[:16]},
		{"model", nil, "chat-model", "p", 1, ""},
		{"pool", nil, "m", "fast", 1, ""},
		{"tenant header beats key", map[string]string{"x-duet-tenant": "acme", "authorization": "Bearer sk-gold"}, "m", "p", 2, "acme"},
		{"basic auth is no key", map[string]string{"authorization": "Basic c2stZ29sZA=="}, "m", "p", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class, tenant := c.Classify(func(k string) string { return tt.headers[k] }, tt.model, tt.pool)
			if class != tt.wantClass || tenant != tt.wantTenant {
				t.Errorf("got %d %q, want %d %q", class, tenant, tt.wantClass, tt.wantTenant)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name  string
		rules Rules
	}{
		{"no classes", Rules{}},
		{"unknown default", Rules{Classes: []string{"a"}, Default: "b"}},
		{"unknown model class", Rules{Classes: []string{"a"}, Models: map[string]string{"m": "b"}}},
		{"bad key hash", Rules{Classes: []string{"a"}, APIKeys: map[string]string{"sk-plain": "a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.rules.Compile(); err == nil {
				t.Error("compiled")
			}
		})
	}
}
