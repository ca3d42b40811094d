package admit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Rules classify a request into a class and a tenant from its headers,
// model and pool. The first rule that names a known class wins: the class
// header, the API key, the model, the pool, then Default.
type Rules struct {
	// Classes are the classes' names, in Config.Classes order.
	Classes []string
	// Default is the class of a request no rule names.
	Default string
	// ClassHeader names a header whose value is a class name.
	ClassHeader string
	// APIKeys maps the hex SHA-256 of a bearer token (the Authorization
	// header's) to a class name.
	APIKeys map[string]string
	// Models and Pools map a model or pool name to a class name.
	Models, Pools map[string]string
	// TenantHeader names a header whose value is the tenant.
	TenantHeader string
	// TenantFromAPIKey makes the tenant the first 16 hex digits of the
	// bearer token's SHA-256, where TenantHeader gives none.
	TenantFromAPIKey bool
}

// Classifier is compiled Rules.
type Classifier struct {
	byName       map[string]int
	def          int
	classHeader  string
	apiKeys      map[string]int
	models       map[string]int
	pools        map[string]int
	tenantHeader string
	tenantKey    bool
	headers      []string
}

// Compile checks r and returns its Classifier.
func (r Rules) Compile() (*Classifier, error) {
	c := &Classifier{byName: map[string]int{}, classHeader: strings.ToLower(r.ClassHeader),
		tenantHeader: strings.ToLower(r.TenantHeader), tenantKey: r.TenantFromAPIKey}
	for i, n := range r.Classes {
		c.byName[n] = i
	}
	lookup := func(what, name string) (int, error) {
		i, ok := c.byName[name]
		if !ok {
			return 0, fmt.Errorf("admit: %s names class %q, which is not defined", what, name)
		}
		return i, nil
	}
	var err error
	if len(r.Classes) == 0 {
		return nil, fmt.Errorf("admit: no classes")
	}
	if r.Default == "" {
		c.def = 0
	} else if c.def, err = lookup("the default", r.Default); err != nil {
		return nil, err
	}
	compile := func(what string, m map[string]string, norm func(string) (string, error)) (map[string]int, error) {
		out := map[string]int{}
		for k, v := range m {
			i, err := lookup(fmt.Sprintf("%s %q", what, k), v)
			if err != nil {
				return nil, err
			}
			if norm != nil {
				if k, err = norm(k); err != nil {
					return nil, err
				}
			}
			out[k] = i
		}
		return out, nil
	}
	if c.apiKeys, err = compile("api key", r.APIKeys, normKeyHash); err != nil {
		return nil, err
	}
	if c.models, err = compile("model", r.Models, nil); err != nil {
		return nil, err
	}
	if c.pools, err = compile("pool", r.Pools, nil); err != nil {
		return nil, err
	}
	for _, h := range []string{c.classHeader, c.tenantHeader} {
		if h != "" {
			c.headers = append(c.headers, h)
		}
	}
	if len(c.apiKeys) > 0 || c.tenantKey {
		c.headers = append(c.headers, "authorization")
	}
	return c, nil
}

// normKeyHash checks a hex SHA-256 and lowers it.
func normKeyHash(k string) (string, error) {
	k = strings.ToLower(k)
	if b, err := hex.DecodeString(k); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("admit: api key %q is not a hex SHA-256 (64 hex digits)", k)
	}
	return k, nil
}

// Headers lists the request headers (lower case) the classifier reads.
func (c *Classifier) Headers() []string { return c.headers }

// Classify returns the class (its index) and tenant of a request; header
// returns a request header's value by lower-case name ("" when absent).
func (c *Classifier) Classify(header func(string) string, model, pool string) (class int, tenant string) {
	class = -1
	var keyHash string
	if len(c.apiKeys) > 0 || c.tenantKey {
		keyHash = bearerHash(header("authorization"))
	}
	if c.classHeader != "" {
		if i, ok := c.byName[strings.TrimSpace(header(c.classHeader))]; ok {
			class = i
		}
	}
	if class < 0 && keyHash != "" {
		if i, ok := c.apiKeys[keyHash]; ok {
			class = i
		}
	}
	if class < 0 {
		if i, ok := c.models[model]; ok {
			class = i
		} else if i, ok := c.pools[pool]; ok {
			class = i
		} else {
			class = c.def
		}
	}
	if c.tenantHeader != "" {
		tenant = strings.TrimSpace(header(c.tenantHeader))
	}
	if tenant == "" && c.tenantKey && keyHash != "" {
		tenant = keyHash[:16]
	}
	return class, tenant
}

// bearerHash is the hex SHA-256 of an Authorization header's bearer
// token; "" without one.
func bearerHash(auth string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(auth), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
