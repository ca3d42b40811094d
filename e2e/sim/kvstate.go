package sim

import (
	"context"
	"sync"
	"time"
)

// KV transfer states of a bootstrap room, as served by GET /sim/kv.
const (
	RoomPending = "pending"
	RoomDone    = "done"
	RoomFailed  = "failed"
	RoomUnknown = "unknown"
)

// roomTTL is how long finished rooms are kept; pruning is lazy.
const (
	roomTTL        = 10 * time.Minute
	roomPruneEvery = 1024
)

// RoomStatus is the prefill-side KV state of one bootstrap room.
type RoomStatus struct {
	// Room is the bootstrap room.
	Room int64 `json:"room"`
	// State is pending, done, failed or unknown.
	State string `json:"state"`
	// DPRank is the prefill DP rank that holds (or would hold) the KV.
	DPRank *int `json:"dp_rank,omitempty"`
	// Error explains a failed room.
	Error string `json:"error,omitempty"`
	// CachedTokens is, for a done room of the engine model, the prompt
	// tokens the prefill found in its own prefix cache (a decode with the
	// decode radix cache reports it in its cached_tokens).
	CachedTokens int `json:"cached_tokens,omitempty"`
}

// roomEntry is a stored room state.
type roomEntry struct {
	state     string
	dpRank    int
	err       string
	cached    int
	updated   time.Time
	delivered bool // a decode polled the room as done: it has the KV
}

// roomStore records, on a prefill server, which rank produced the KV of
// each bootstrap room. The latest write for a room wins.
type roomStore struct {
	mu     sync.Mutex
	rooms  map[int64]roomEntry
	writes int
	now    func() time.Time
	// changed is closed (and replaced) on every write, waking long polls.
	changed chan struct{}
}

// newRoomStore returns an empty store.
func newRoomStore() *roomStore {
	return &roomStore{rooms: make(map[int64]roomEntry), now: time.Now, changed: make(chan struct{})}
}

// set records the state of room on rank.
func (s *roomStore) set(room int64, rank int, state, errMsg string) {
	s.put(room, roomEntry{state: state, dpRank: rank, err: errMsg})
}

// setDone records that room's KV is ready on rank, the prefill having
// found cached of its prompt tokens in its prefix cache.
func (s *roomStore) setDone(room int64, rank, cached int) {
	s.put(room, roomEntry{state: RoomDone, dpRank: rank, cached: cached})
}

// put stores e as room's state (the latest write wins; a room already
// delivered stays delivered while it stays done).
func (s *roomStore) put(room int64, e roomEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	prev := s.rooms[room]
	e.updated = now
	e.delivered = e.state == RoomDone && prev.state == RoomDone && prev.delivered
	s.rooms[room] = e
	close(s.changed)
	s.changed = make(chan struct{})
	s.writes++
	if s.writes%roomPruneEvery == 0 {
		for k, e := range s.rooms {
			if e.state != RoomPending && now.Sub(e.updated) > roomTTL {
				delete(s.rooms, k)
			}
		}
	}
}

// deliver records that a decode took room's KV, if the room is done.
func (s *roomStore) deliver(room int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.rooms[room]
	if !ok || e.state != RoomDone || e.delivered {
		return
	}
	e.delivered = true
	s.rooms[room] = e
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitDelivered waits until a decode took room's KV (true), or d passed,
// the room failed or ctx is done (false).
func (s *roomStore) waitDelivered(ctx context.Context, room int64, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		s.mu.Lock()
		e := s.rooms[room]
		changed := s.changed
		s.mu.Unlock()
		if e.delivered {
			return true
		}
		if e.state == RoomFailed {
			return false
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// status returns the state of room; State is RoomUnknown if never seen.
func (s *roomStore) status(room int64) RoomStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked(room)
}

// wait returns the state of room once it is done or failed, or when d
// passed or ctx is done (a long poll: decode learns of the KV at once
// instead of at its next poll).
func (s *roomStore) wait(ctx context.Context, room int64, d time.Duration) RoomStatus {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		s.mu.Lock()
		st := s.statusLocked(room)
		changed := s.changed
		s.mu.Unlock()
		if st.State == RoomDone || st.State == RoomFailed {
			return st
		}
		select {
		case <-changed:
		case <-timer.C:
			return s.status(room)
		case <-ctx.Done():
			return st
		}
	}
}

// statusLocked is status with s.mu held.
func (s *roomStore) statusLocked(room int64) RoomStatus {
	e, ok := s.rooms[room]
	if !ok {
		return RoomStatus{Room: room, State: RoomUnknown}
	}
	rank := e.dpRank
	return RoomStatus{Room: room, State: e.state, DPRank: &rank, Error: e.err, CachedTokens: e.cached}
}
