package sim

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestParsePromptTokens: stand-in token ids are shared exactly where two
// chat prompts share text, fill the prompt's whole blocks in order (16 per
// block), and a turn's ids followed by its answer's (what a decode radix
// cache stores) are the next turn's, whose prompt carries the answer back.
func TestParsePromptTokens(t *testing.T) {
	const bt = 16
	body := func(msgs ...map[string]string) []byte {
		b, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	msg := func(role, content string) map[string]string {
		return map[string]string{"role": role, "content": content}
	}
	system := msg("system", ReplyText(1, 300))
	q1 := msg("user", ReplyText(2, 57))
	seed := int64(9)
	answer := answerText(&seed, 41)
	q2 := msg("user", ReplyText(3, 20))

	p1, err := ParsePromptTokens("/v1/chat/completions", body(system, q1), bt)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := ParsePromptTokens("/v1/chat/completions", body(system, q1, msg("assistant", answer), q2), bt)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ParsePromptTokens("/v1/chat/completions", body(msg("system", ReplyText(5, 300)), q1), bt)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := ParsePrompt("/v1/chat/completions", body(system, q1), bt)
	if err != nil {
		t.Fatal(err)
	}
	if plain.TokenIDs != nil || !slices.Equal(plain.Blocks, p1.Blocks) {
		t.Fatalf("ParsePrompt: ids %d, blocks differ %v: want no ids and the same blocks", len(plain.TokenIDs), !slices.Equal(plain.Blocks, p1.Blocks))
	}
	if len(p1.TokenIDs) < len(p1.Blocks)*bt || len(p1.TokenIDs) >= (len(p1.Blocks)+1)*bt {
		t.Fatalf("%d ids for %d blocks of %d", len(p1.TokenIDs), len(p1.Blocks), bt)
	}
	if !slices.Equal(p2.TokenIDs[:len(p1.TokenIDs)], p1.TokenIDs) {
		t.Error("the next turn's ids do not start with the turn's")
	}
	if slices.Equal(other.TokenIDs[:bt], p1.TokenIDs[:bt]) {
		t.Error("prompts with other system prompts share their first block's ids")
	}
	blocks, ids := p1.Tail.answerTokens(answer)
	all := append(slices.Clone(p1.TokenIDs), ids...)
	if len(blocks) == 0 || !slices.Equal(p2.TokenIDs[:len(all)], all) {
		t.Errorf("the turn's ids and its answer's (%d) are not the next turn's", len(ids))
	}
	if !slices.Equal(p2.Blocks[:len(p1.Blocks)+len(blocks)], append(slices.Clone(p1.Blocks), blocks...)) {
		t.Error("the answer's blocks are not the next turn's")
	}
}
