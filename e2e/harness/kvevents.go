package harness

import (
	"errors"
	"fmt"
	"net"
	"strconv"
)

// kvPorts are one engine's KV event ports (Options.KVEvents): its DP rank
// r publishes on pub+r and answers replays on replay+r. Zero: none.
type kvPorts struct{ pub, replay int }

// args are the duet-sim flags that publish on p: SGLang's
// --kv-events-config with a ZMQ PUB and a replay endpoint on every
// interface (duet-sim binds only wildcard hosts, as SGLang does).
func (p kvPorts) args() []string {
	if p.pub == 0 {
		return nil
	}
	return []string{"--kv-events-config",
		fmt.Sprintf(`{"publisher":"zmq","endpoint":"tcp://*:%d","replay_endpoint":"tcp://*:%d"}`, p.pub, p.replay)}
}

// portRanges holds, while open, the listeners that reserve ranges of
// consecutive ports, so that later ranges and freePorts avoid them.
type portRanges struct{ lis []net.Listener }

// reserve finds n consecutive ports free on every interface, keeps them
// listened on until release, and returns the first.
func (r *portRanges) reserve(n int) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return 0, fmt.Errorf("free port range: %w", err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		held := []net.Listener{l}
		for p := base + 1; p < base+n && p <= 65535; p++ {
			pl, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				break
			}
			held = append(held, pl)
		}
		if len(held) == n {
			r.lis = append(r.lis, held...)
			return base, nil
		}
		for _, h := range held {
			h.Close()
		}
	}
	return 0, errors.New("free port range: no run of free ports found")
}

// release closes every listener.
func (r *portRanges) release() {
	for _, l := range r.lis {
		l.Close()
	}
	r.lis = nil
}

// kvEventPorts reserves, when opts.KVEvents is set, a PUB and a replay
// range of each engine's DP size for every engine of opts (prefill engines
// first, then decode), none overlapping another; the ranges stay
// reserved until the returned portRanges is released. Without
// KVEvents every engine gets zero ports.
func kvEventPorts(opts Options) ([]kvPorts, *portRanges, error) {
	held := &portRanges{}
	specs := append(append([]SimSpec{}, opts.Prefill...), opts.Decode...)
	out := make([]kvPorts, len(specs))
	if !opts.KVEvents {
		return out, held, nil
	}
	for i, spec := range specs {
		dp := max(spec.DPSize, 1)
		pub, err := held.reserve(dp)
		if err != nil {
			held.release()
			return nil, nil, err
		}
		replay, err := held.reserve(dp)
		if err != nil {
			held.release()
			return nil, nil, err
		}
		out[i] = kvPorts{pub: pub, replay: replay}
	}
	return out, held, nil
}
