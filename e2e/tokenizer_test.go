package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/tokenize"
)

// TestTokenizerRoutesOnTokenIDs runs duet with Qwen3's tokenizer (the
// fixture `make tokenizers` installs) behind a real Envoy: a three-turn
// chat is routed on the token ids of Qwen3's chat template (duet reserves
// exactly the prompt's tokens on the prefill rank, and the later turns
// find the earlier ones' token blocks in the prefix index), and a body
// SGLang would refuse is answered 400 by duet before any engine sees it.
func TestTokenizerRoutesOnTokenIDs(t *testing.T) {
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make test), which installs the tokenizer fixtures")
	}
	dir := filepath.Join(root, "qwen3")
	model, err := tokenize.LoadModel(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), "")
	if err != nil {
		t.Fatal(err)
	}
	s := startStack(t, harness.Options{
		Prefill:       []harness.SimSpec{{DPSize: 2}},
		Decode:        []harness.SimSpec{{DPSize: 2}},
		PrefillPolicy: "least_cost", // duet's defaults
		DecodePolicy:  "least_cost",
		DuetYAML: fmt.Sprintf("tokenizer:\n  file: %s\n  config: %s\n  page_size: 16\n",
			filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json")),
	})

	history := fmt.Sprintf(`{"role":"system","content":%q}`, strings.Repeat("You are a careful coding agent; 你好. ", 60))
	var prev int64
	for turn := 1; turn <= 3; turn++ {
		history += fmt.Sprintf(`,{"role":"user","content":%q}`, fmt.Sprintf("Question %d: why does the build fail?", turn))
		body := []byte(fmt.Sprintf(`{"model":"sim-model","messages":[%s],"max_tokens":16}`, history))
		ids, _, err := extproc.PromptTokens(model, extproc.RouteChat, body)
		if err != nil {
			t.Fatal(err)
		}
		id := requestID(t, turn)
		resp, out := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, out)
		}
		answer := gjson.GetBytes(out, "choices.0.message.content").String()
		history += fmt.Sprintf(`,{"role":"assistant","content":%q}`, answer)

		// One request at a time: the turn's decision is the turn-th.
		var prefill gjson.Result
		waitStatus(t, s, "the turn's decision", func(st []byte) bool {
			ds := gjson.GetBytes(st, "decisions").Array()
			if len(ds) < turn {
				return false
			}
			latest := ds[0]
			for _, d := range ds {
				if d.Get("time").Time().After(latest.Get("time").Time()) {
					latest = d
				}
			}
			prefill = latest.Get("prefill")
			return true
		})
		if got := prefill.Get("tokens").Int(); got != int64(len(ids)) {
			t.Errorf("turn %d: duet reserved %d prefill tokens, want the prompt's %d token ids", turn, got, len(ids))
		}
		cached := prefill.Get("cached_tokens").Int()
		t.Logf("turn %d: %d tokens, %d believed cached on %s", turn, len(ids), cached, prefill.Get("target"))
		if turn > 1 && cached < prev/16*16-16 {
			t.Errorf("turn %d: %d tokens believed cached, want the previous turn's %d less at most its last page", turn, cached, prev)
		}
		prev = int64(len(ids))
	}

	resp, out := send(t, s, "POST", "/v1/chat/completions", nil, []byte(`{"model":"sim-model","messages":[{"role":"wizard","content":"hi"}]}`))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(gjson.GetBytes(out, "error.message").String(), "unknown role") {
		t.Errorf("unknown role: status %d, body %s: want duet's 400 naming the role", resp.StatusCode, out)
	}
	metrics, err := s.DuetMetrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]float64{}
	for _, m := range metrics["duet_tokenize_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" {
				outcomes[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if outcomes["ok"] != 3 || outcomes["invalid_messages"] != 1 {
		t.Errorf("duet_tokenize_requests_total by outcome: %v, want ok 3 and invalid_messages 1", outcomes)
	}
}
