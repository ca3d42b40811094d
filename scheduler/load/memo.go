package load

import (
	"sync"
	"time"
)

// absentMemo remembers which engines answered that /v1/loads does not
// exist, so that they are not asked again until the entry expires. Safe for
// concurrent use.
type absentMemo struct {
	ttl time.Duration

	mu    sync.Mutex
	since map[string]time.Time // base URL -> when /v1/loads was found absent
}

// newAbsentMemo returns an empty memo whose entries last ttl.
func newAbsentMemo(ttl time.Duration) *absentMemo {
	return &absentMemo{ttl: ttl, since: map[string]time.Time{}}
}

// absent reports whether base is known, as of now, to lack /v1/loads.
func (m *absentMemo) absent(base string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.since[base]
	if ok && now.Sub(t) >= m.ttl {
		delete(m.since, base)
		return false
	}
	return ok
}

// markAbsent records that base lacks /v1/loads as of now. Expired entries
// of other engines are dropped at the same time, so that the memo does not
// grow with engines that went away.
func (m *absentMemo) markAbsent(base string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for b, t := range m.since {
		if now.Sub(t) >= m.ttl {
			delete(m.since, b)
		}
	}
	m.since[base] = now
}

// markPresent forgets that base lacked /v1/loads.
func (m *absentMemo) markPresent(base string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.since, base)
}
