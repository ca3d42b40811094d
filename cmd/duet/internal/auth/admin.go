package auth

import (
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
)

// OpenAdminPaths are the admin port's paths anyone who reaches the port may
// read: probes and scrapers carry no credentials, and these show no
// request ids, targets or profiles.
var OpenAdminPaths = []string{"/healthz", "/readyz", "/metrics"}

// Admin guards the admin port. Every path but OpenAdminPaths (the status
// page, /status.json, /debug/*, pprof, and anything added later) needs the
// admin token unless the port listens on loopback only, where just the
// host's own processes reach it.
type Admin struct {
	loopback  bool
	tokenFile string
	files     watched
	tokens    atomic.Pointer[[][]byte]
	refusals  *Refusals
}

// NewAdmin returns the guard of an admin port that listens on loopback only
// (loopback) or beyond, with the token in tokenFile ("" for none).
func NewAdmin(loopback bool, tokenFile string, refusals *Refusals) (*Admin, error) {
	a := &Admin{loopback: loopback, tokenFile: tokenFile, refusals: refusals}
	if _, err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// Reload reads the admin token file again and reports whether it changed;
// on error the old tokens stay.
func (a *Admin) Reload() (changed bool, err error) {
	if a.tokenFile == "" {
		return false, nil
	}
	return a.files.reload([]string{a.tokenFile}, a.load)
}

// load reads and applies the token file.
func (a *Admin) load() error {
	tokens, err := ReadTokens(a.tokenFile)
	if err != nil {
		return fmt.Errorf("auth.admin_token_file: %w", err)
	}
	a.tokens.Store(&tokens)
	return nil
}

// Protected reports whether a path needs the admin token on a port beyond
// loopback.
func Protected(path string) bool { return !slices.Contains(OpenAdminPaths, path) }

// Handler returns next guarded: open paths pass; the others pass on a
// loopback port, or with the admin token as "Authorization: Bearer <token>"
// or as the password of HTTP Basic authentication (any user name), which
// browsers prompt for.
func (a *Admin) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.loopback || !Protected(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		tokens := a.tokens.Load()
		if tokens == nil {
			a.refusals.Refuse(ServiceAdmin, ReasonNoAdminToken, r.RemoteAddr, nil)
			http.Error(w, "duet: "+r.URL.Path+" shows request ids and targets, and this admin port listens beyond loopback: "+
				"set auth.admin_token_file to read it here, or listen.admin on 127.0.0.1 (docs/security.md)", http.StatusForbidden)
			return
		}
		got, ok := "", false
		if _, pass, basic := r.BasicAuth(); basic {
			got, ok = pass, true
		} else if v := r.Header.Get("Authorization"); v != "" {
			got, ok = bearer(v)
		}
		if ok && matchToken(*tokens, []byte(got)) {
			next.ServeHTTP(w, r)
			return
		}
		reason := ReasonNoToken
		if ok {
			reason = ReasonBadToken
		}
		a.refusals.Refuse(ServiceAdmin, reason, r.RemoteAddr, nil)
		w.Header().Set("WWW-Authenticate", `Basic realm="duet admin", charset="UTF-8"`)
		http.Error(w, "duet: "+r.URL.Path+" needs the admin token (auth.admin_token_file), as a bearer token or a Basic password", http.StatusUnauthorized)
	})
}
