package clustersim

import (
	"fmt"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/sim"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/scheduler"
)

// chatPath is the route every simulated request is sent on.
const chatPath = "/v1/chat/completions"

// Prepared is a workload with every request already parsed, by duet
// (extproc.Describe) and by the engines (sim.ParsePrompt). Parsing does not
// depend on routing, so one Prepared serves every policy of a comparison;
// it is read-only and safe to share between concurrent runs.
type Prepared struct {
	// Workload is the workload prepared.
	Workload bench.Workload
	// turns[s][k] is session s's turn k.
	turns [][]preparedTurn
	// blockTokens is the engine block size the prompts were hashed with.
	blockTokens int
}

// preparedTurn is one request, parsed.
type preparedTurn struct {
	req    scheduler.Request // as extproc.Describe returns it
	prompt sim.Prompt
}

// Prepare parses every request of w as a client would send it (the
// benchmark client's chat body, with the session's planned history), for
// engines whose prefix-cache blocks hold blockTokens tokens.
func Prepare(w bench.Workload, model string, blockTokens int) (*Prepared, error) {
	p := &Prepared{Workload: w, blockTokens: blockTokens, turns: make([][]preparedTurn, len(w.Sessions))}
	for i, s := range w.Sessions {
		var history []bench.Message
		if s.System != "" {
			history = append(history, bench.Message{Role: "system", Content: s.System})
		}
		p.turns[i] = make([]preparedTurn, len(s.Turns))
		for k, turn := range s.Turns {
			msgs := append(history, bench.Message{Role: "user", Content: turn.User})
			body, err := bench.ChatRequest{Model: model, Messages: msgs, MaxTokens: turn.OutputTokens, Stream: s.Stream, Seed: turn.Seed}.Body()
			if err != nil {
				return nil, fmt.Errorf("session %d turn %d: %w", s.ID, k, err)
			}
			req, err := extproc.Describe(extproc.RouteChat, body)
			if err != nil {
				return nil, fmt.Errorf("session %d turn %d: duet: %w", s.ID, k, err)
			}
			req.Path = chatPath
			// With stand-in token ids: the token and KV event modes route
			// on them (CacheMode), and they ride the KV events.
			prompt, err := sim.ParsePromptTokens(chatPath, body, blockTokens)
			if err != nil {
				return nil, fmt.Errorf("session %d turn %d: engine: %w", s.ID, k, err)
			}
			p.turns[i][k] = preparedTurn{req: req, prompt: prompt}
			history = append(msgs[:len(msgs):len(msgs)], bench.Message{Role: "assistant", Content: turn.Assistant})
		}
	}
	return p, nil
}
