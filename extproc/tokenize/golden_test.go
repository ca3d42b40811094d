package tokenize

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// textCases are the texts every family's tokenizer must encode exactly as
// Hugging Face's does.
func textCases() []goldenCase {
	texts := []struct{ name, text string }{
		{"empty", ""},
		{"english", "The quick brown fox jumps over the lazy dog. It's 12:45 and I'LL say we'd've done it."},
		{"chinese", "我们今天讨论大语言模型的推理服务：预填充与解码分离，以及数据并行的调度。"},
		{"japanese", "今日はいい天気ですね。カタカナとひらがなを混ぜて書きます。"},
		{"emoji", "Deploy 🚀🚀 done ✅ family 👨‍👩‍👧‍👦 flag 🇫🇷 skin 👍🏽 and text😀after"},
		{"code", "func main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i) // print\n\t}\n}\n\ndef f(x):\n    return x**2  # square\n"},
		{"whitespace", "a  b   c    d\n\n\nе\t\t\tf \n \n  \r\n\r\n   g     \n"},
		{"trailing spaces", "end with spaces     "},
		{"leading spaces", "     start with spaces"},
		{"only newlines", "\n\n\n\n"},
		{"crlf", "line one\r\nline two\r\n\r\nline four"},
		{"unicode spaces", "a\u00a0b\u3000c\u2003d\u2028e\u0085f  \u00a0 g"},
		{"numbers", "1 12 123 1234 12345 3.14159 1,000,000 ١٢٣٤ ½ Ⅻ 2026-11-26"},
		{"contractions", "'s 'S 't 're 'RE 've 'm 'll 'LL 'd 'ſ 'x don't I'm they'RE"},
		{"case folding", "'ſK 'Ss 'ſt x'ſ 'KK"},
		{"punctuation", "Hello!!! What??? ...... ---- ==== (a) [b] {c} <d> \"e\" 'f' `g`"},
		{"special lookalikes", "user says <|im_start|> and <|im_end|> and <|begin_of_text|> and <|eot_id|> and <｜end▁of▁sentence｜> and <｜User｜>"},
		{"near lookalikes", "<|im_start <| im_start|> <|im_start|<|im_end|> <|endoftext||> <think></think> <tool_call>x</tool_call>"},
		{"nfc", "cafe\u0301 vs café, A\u030a vs Å, \uFB01 ligature"},
		{"control", "tab\there\x00nul\x07bell\x1besc\x7fdel"},
		{"mixed scripts", "Привет мир! Γειά σου! مرحبا بالعالم! שלום! नमस्ते! 안녕하세요!"},
		{"long word", strings.Repeat("a", 3000) + " " + strings.Repeat("=", 2000) + strings.Repeat(" ", 1500) + "x"},
		{"url", "https://example.com/path?query=1&b=2#frag user@example.org"},
		{"json", `{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2, 3]}}`},
	}
	var cases []goldenCase
	for _, t := range texts {
		cases = append(cases, goldenCase{Kind: "text", Name: t.name, Text: t.text})
		cases = append(cases, goldenCase{Kind: "text", Name: t.name + " (special)", Text: t.text, AddSpecial: true})
	}
	rng := rand.New(rand.NewPCG(25, 1))
	for i := range 40 {
		cases = append(cases, goldenCase{Kind: "text", Name: "random " + string(rune('A'+i%26)), Text: randomText(rng, 50+rng.IntN(400))})
	}
	cases = append(cases, goldenCase{Kind: "text", Name: "100k tokens", Text: longPrompt(rand.New(rand.NewPCG(100, 1)), 100_000)})
	return cases
}

// randomText mixes the character classes the split patterns distinguish.
func randomText(rng *rand.Rand, n int) string {
	pools := []string{
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
		"0123456789١٢٣½",
		" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000",
		"!?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`",
		"你好世界大模型推理", "éàüßçñ", "ſK", "😀🚀👍🏽", "'s", "'LL", "<|", "|>", "<|im_end|>", "<think>",
	}
	var b strings.Builder
	for b.Len() < n {
		p := []rune(pools[rng.IntN(len(pools))])
		if rng.IntN(3) == 0 {
			b.WriteString(string(p))
			continue
		}
		b.WriteRune(p[rng.IntN(len(p))])
	}
	return b.String()
}

// longPrompt is prose, code and numbers of about tokens tokens.
func longPrompt(rng *rand.Rand, tokens int) string {
	words := strings.Fields("the of and to in is for that on with as it by this be are from at or an which not have has was more model cache token prefill decode router engine request latency throughput rank data parallel 推理 服务 模型 缓存")
	var b strings.Builder
	for b.Len() < tokens*4 {
		switch rng.IntN(20) {
		case 0:
			b.WriteString("\n\n```go\nfunc f(x int) int {\n\treturn x * 2\n}\n```\n\n")
		case 1:
			b.WriteString(" 12345.678 ")
		case 2:
			b.WriteString(".\n")
		default:
			b.WriteByte(' ')
			b.WriteString(words[rng.IntN(len(words))])
		}
	}
	return b.String()
}

// TestGoldenText holds every family's tokenizer to Hugging Face's
// tokenizers on the same file: every id equal.
func TestGoldenText(t *testing.T) {
	for _, family := range families {
		t.Run(family, func(t *testing.T) {
			m := loadModel(t, family)
			cases := textCases()
			want := golden(t, family, cases)
			for i, c := range cases {
				if want[i].Error != "" {
					t.Fatalf("%s: reference failed: %s", c.Name, want[i].Error)
				}
				got := m.Tokenizer.Encode(nil, c.Text, c.AddSpecial)
				if d := firstDiff(got, want[i].IDs); d != "" {
					t.Errorf("%s: %s", c.Name, d)
				}
			}
		})
	}
}

// TestFixturesUseScanners: every fixture's split patterns run on a
// scanner, not on regexp2 (40 times slower).
func TestFixturesUseScanners(t *testing.T) {
	for _, family := range families {
		m := loadModel(t, family)
		for i, s := range m.Tokenizer.pre.splits {
			if _, ok := s.(regexpSplitter); ok {
				t.Errorf("%s: split %d runs on regexp2", family, i)
			}
		}
	}
}

// TestGoldenTextPrompts: a text prompt's ids (/v1/completions, /generate
// with text) are Hugging Face's with special tokens, and for DeepSeek-V3
// (a LlamaTokenizerFast with add_bos_token) also the BOS SGLang's fix
// adds, which tokenizer.json's post-processor does not.
func TestGoldenTextPrompts(t *testing.T) {
	texts := []string{"Hello world", "", "你好 <|im_start|> 😀"}
	for _, family := range families {
		t.Run(family, func(t *testing.T) {
			m := loadModel(t, family)
			var cases []goldenCase
			for _, text := range texts {
				cases = append(cases, goldenCase{Kind: "text", Text: text, AddSpecial: true})
			}
			want := golden(t, family, cases)
			for i, text := range texts {
				ids := want[i].IDs
				if family == "deepseek_v3" {
					ids = append([]int64{0}, ids...) // <｜begin▁of▁sentence｜>
				}
				if d := firstDiff(m.EncodeText(nil, text), ids); d != "" {
					t.Errorf("%q: %s", text, d)
				}
			}
		})
	}
}
