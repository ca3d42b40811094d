package tokenize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/tidwall/gjson"
)

// chatBody is a multi-turn chat body of about size bytes: a system
// prompt, then user and assistant turns of prose and code of about 1.5 KiB
// each, ending with a user turn. seed varies the text.
func chatBody(size int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 3))
	msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant. Answer concisely and show code when it helps."}}
	total := len(msgs[0]["content"])
	for i := 0; total < size; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		n := min(1500, size-total)
		text := longPrompt(rng, n/4+1)[:max(n, 1)]
		msgs = append(msgs, map[string]string{"role": role, "content": text})
		total += len(text) + 30
	}
	if msgs[len(msgs)-1]["role"] == "assistant" {
		msgs = append(msgs, map[string]string{"role": "user", "content": "And then?"})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

// withNewTurn appends a user turn to a chat body, as the next request of
// the same conversation sends it.
func withNewTurn(body []byte, turn int) []byte {
	var v map[string]any
	_ = json.Unmarshal(body, &v)
	msgs := v["messages"].([]any)
	msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprintf("Answer number %d about prefill and decode.", turn)},
		map[string]any{"role": "user", "content": fmt.Sprintf("Follow-up question %d: what about data-parallel ranks?", turn)})
	v["messages"] = msgs
	b, _ := json.Marshal(v)
	return b
}

// request is a body's chat request.
func request(body []byte) ChatRequest {
	b := gjson.ParseBytes(body)
	return ChatRequest{Messages: b.Get("messages"), Tools: b.Get("tools")}
}

// BenchmarkEncodeChat is the request path's tokenizing cost: render the
// chat template and tokenize, for chat bodies of 1, 32 and 256 KiB.
//   - new: a prompt never seen (the piece cache off; the word cache warm,
//     as in a running duet);
//   - seen-history: the next turn of a conversation whose history was
//     tokenized before (two short new messages).
func BenchmarkEncodeChat(b *testing.B) {
	for _, family := range families {
		dir := fixtureDir(b, family)
		seen := loadModel(b, family)
		fresh, err := LoadModel(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), "")
		if err != nil {
			b.Fatal(err)
		}
		fresh.Tokenizer.SetPieceCacheBytes(0)
		for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
			body := chatBody(size, 1)
			if _, _, err := fresh.EncodeChat(nil, request(body)); err != nil { // warms the word cache
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/%dKiB/new", family, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				var ids []int64
				for b.Loop() {
					ids, _, _ = fresh.EncodeChat(ids[:0], request(body))
				}
				b.ReportMetric(float64(len(ids)), "tokens")
			})
			if _, _, err := seen.EncodeChat(nil, request(body)); err != nil {
				b.Fatal(err)
			}
			turns := make([][]byte, 64)
			for i := range turns {
				turns[i] = withNewTurn(body, i)
			}
			b.Run(fmt.Sprintf("%s/%dKiB/seen-history", family, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				var ids []int64
				i := 0
				for b.Loop() {
					ids, _, _ = seen.EncodeChat(ids[:0], request(turns[i%len(turns)]))
					i++
				}
			})
		}
	}
}

// BenchmarkRender is the chat template's share of BenchmarkEncodeChat.
func BenchmarkRender(b *testing.B) {
	m := loadModel(b, "qwen3")
	for _, size := range []int{1 << 10, 32 << 10, 256 << 10} {
		body := chatBody(size, 1)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := m.Chat.Render(request(body)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
