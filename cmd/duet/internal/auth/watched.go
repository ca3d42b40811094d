package auth

import (
	"crypto/sha256"
	"fmt"
	"os"
	"sync"
)

// watched remembers a digest of the credential files last loaded, so that
// a periodic reload applies, and reports, only what changed: Kubernetes
// rewrites a mounted Secret in place when cert-manager renews it.
type watched struct {
	mu     sync.Mutex
	digest [sha256.Size]byte
	loaded bool
}

// reload reads paths and, if their contents differ from the last
// successful load (or nothing was loaded yet), calls load. It reports
// whether load ran and succeeded.
func (w *watched) reload(paths []string, load func() error) (changed bool, err error) {
	h := sha256.New()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return false, fmt.Errorf("read %s: %w", p, err)
		}
		fmt.Fprintf(h, "%d:%s:", len(p), p)
		h.Write(b)
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.loaded && d == w.digest {
		return false, nil
	}
	if err := load(); err != nil {
		return false, err
	}
	w.digest, w.loaded = d, true
	return true, nil
}
