package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// fileRef is a file duet reads, by its key.
type fileRef struct {
	field string
	path  *string
	// certs marks the files `duet certs` writes.
	certs bool
}

// files lists the files duet reads (not envoy.duet_tls: Envoy reads those,
// at paths as Envoy sees them).
func (c *Config) files() []fileRef {
	var out []fileRef
	if t := c.Auth.TLS; t != nil {
		out = append(out, fileRef{"auth.tls.cert_file", &t.CertFile, true}, fileRef{"auth.tls.key_file", &t.KeyFile, true},
			fileRef{"auth.tls.client_ca_file", &t.ClientCAFile, true})
	}
	out = append(out, fileRef{"auth.token_file", &c.Auth.TokenFile, true}, fileRef{"auth.admin_token_file", &c.Auth.AdminTokenFile, true})
	if c.Sync != nil {
		n := &c.Sync.NATS
		out = append(out, fileRef{"sync.nats.token_file", &n.TokenFile, false}, fileRef{"sync.nats.creds_file", &n.CredsFile, false},
			fileRef{"sync.nats.ca_file", &n.CAFile, false}, fileRef{"sync.nats.cert_file", &n.CertFile, false},
			fileRef{"sync.nats.key_file", &n.KeyFile, false})
	}
	if c.Kubernetes != nil {
		out = append(out, fileRef{"kubernetes.kubeconfig", &c.Kubernetes.Kubeconfig, false})
	}
	tok := func(field string, t *Tokenizer) {
		if t != nil {
			out = append(out, fileRef{field + ".file", &t.File, false}, fileRef{field + ".config", &t.Config, false},
				fileRef{field + ".chat_template", &t.ChatTemplate, false})
		}
	}
	tok("tokenizer", c.Tokenizer)
	for i := range c.Pools {
		tok(fmt.Sprintf("pools[%d].tokenizer", i), c.Pools[i].Tokenizer)
	}
	return out
}

// resolvePaths makes the relative paths of the files duet reads relative
// to dir, the configuration file's directory.
func (c *Config) resolvePaths(dir string) {
	for _, f := range c.files() {
		if *f.path != "" && !filepath.IsAbs(*f.path) {
			*f.path = filepath.Join(dir, *f.path)
		}
	}
}

// checkFiles reports each file duet reads that it cannot open, naming its
// key and saying what to do; dir is the configuration file's directory,
// which relative paths were resolved against.
func (c *Config) checkFiles(dir string) []error {
	var errs []error
	for _, f := range c.files() {
		if *f.path == "" {
			continue
		}
		file, err := os.Open(*f.path)
		if err == nil {
			file.Close()
			continue
		}
		msg := fmt.Errorf("%s: %w", f.field, err)
		if errors.Is(err, fs.ErrNotExist) {
			where := dir
			if abs, err := filepath.Abs(dir); err == nil {
				where = abs
			}
			fix := fmt.Sprintf("fix the path (a relative one is relative to the configuration file's directory, %s)", where)
			if f.certs {
				fix = `make it with "duet certs -out DIR", which writes it with duet's other credentials (docs/security.md), or ` + fix
			}
			msg = fmt.Errorf("%s: %w: %s", f.field, err, fix)
		}
		errs = append(errs, msg)
	}
	return errs
}
