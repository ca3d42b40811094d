package accesslog

import "sync"

// RecentSize is how many completions a Server keeps for [Server.Recent].
const RecentSize = 1024

// recent is a fixed-size ring of the latest completions.
type recent struct {
	mu   sync.Mutex
	buf  []Completion
	next int  // where the next completion goes
	full bool // buf has wrapped at least once
}

func newRecent(n int) *recent { return &recent{buf: make([]Completion, n)} }

// add stores c, replacing the oldest completion when the ring is full.
func (r *recent) add(c Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = c
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
}

// list returns the stored completions, oldest first, keeping those for
// which keep returns true (all when keep is nil).
func (r *recent) list(keep func(Completion) bool) []Completion {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ordered []Completion
	if r.full {
		ordered = append(ordered, r.buf[r.next:]...)
	}
	ordered = append(ordered, r.buf[:r.next]...)
	out := make([]Completion, 0, len(ordered))
	for _, c := range ordered {
		if keep == nil || keep(c) {
			out = append(out, c)
		}
	}
	return out
}
