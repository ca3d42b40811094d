package sim

import (
	"regexp"
	"strings"
	"testing"
)

func TestReplyText(t *testing.T) {
	words := regexp.MustCompile(`^([a-z]{3} )*$`)
	tests := []struct {
		name   string
		seed   int64
		tokens int
	}{
		{name: "empty", seed: 1, tokens: 0},
		{name: "short", seed: 1, tokens: 5},
		{name: "negative seed", seed: -42, tokens: 64},
		{name: "long", seed: 1 << 62, tokens: 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ReplyText(tc.seed, tc.tokens)
			if len(got) != 4*tc.tokens || !words.MatchString(got) || textTokens(got) != tc.tokens {
				t.Fatalf("ReplyText(%d, %d) = %q: want %d three-letter words with a space each", tc.seed, tc.tokens, got, tc.tokens)
			}
			if again := ReplyText(tc.seed, tc.tokens); again != got {
				t.Fatal("not deterministic")
			}
			if longer := ReplyText(tc.seed, tc.tokens+7); !strings.HasPrefix(longer, got) {
				t.Fatal("not a prefix of a longer reply")
			}
			if tc.tokens >= 5 && ReplyText(tc.seed+1, tc.tokens) == got {
				t.Fatal("another seed gives the same reply")
			}
		})
	}
}

func TestSeededOutput(t *testing.T) {
	s := startTest(t, Config{Mode: ModeNull})
	tests := []struct {
		name, path, body string
		want             string // regexp of the body
	}{
		{name: "chat seed", path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"seed":3}`,
			want: `"content":"` + ReplyText(3, 6) + `"`},
		{name: "completions seed", path: "/v1/completions", body: `{"prompt":"hi","max_tokens":4,"seed":-9}`,
			want: `"text":"` + ReplyText(-9, 4) + `"`},
		{name: "generate sampling_seed", path: "/generate",
			body: `{"text":"hi","sampling_params":{"max_new_tokens":5,"sampling_seed":12}}`, want: `"text":"` + ReplyText(12, 5) + `"`},
		{name: "generate seed outside sampling_params is not SGLang's", path: "/generate",
			body: `{"text":"hi","seed":12,"sampling_params":{"max_new_tokens":3}}`, want: `"text":"tok0 tok1 tok2"`},
		{name: "no seed", path: "/v1/completions", body: `{"prompt":"hi","max_tokens":3}`, want: `"text":"tok0 tok1 tok2"`},
		{name: "non-integer seed ignored", path: "/v1/completions", body: `{"prompt":"hi","max_tokens":3,"seed":"x"}`,
			want: `"text":"tok0 tok1 tok2"`},
		{name: "streaming chat seed", path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"seed":3,"stream":true}`,
			want: `"delta":\{"content":"` + replyWord(3, 2) + `"\}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, s.api.URL+tc.path, tc.body)
			if r.status != 200 || !regexp.MustCompile(tc.want).Match(r.body) {
				t.Fatalf("status %d body %s, want a match of %s", r.status, r.body, tc.want)
			}
		})
	}
}
