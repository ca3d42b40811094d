// Package tokenize turns a request's prompt into the token ids the model's
// engine computes, as Hugging Face's tokenizers and transformers do: the
// model's chat template (tokenizer_config.json) renders chat messages to
// text, and the model's tokenizer (tokenizer.json) turns text into ids.
//
// # Supported tokenizers
//
// Byte-level BPE, as Llama-3, Qwen2/2.5/3 and DeepSeek-V3 ship it:
//   - normalizer: none, NFC, NFD, NFKC, NFKD, or a Sequence of those;
//   - pre-tokenizer: Split (a regular expression, Isolated behavior), and
//     ByteLevel (with or without its GPT-2 split pattern), alone or in a
//     Sequence;
//   - model: BPE over the byte-level alphabet, with ignore_merges and
//     byte_fallback;
//   - post-processor: ByteLevel, TemplateProcessing (the special tokens
//     around a single sequence), or a Sequence of those;
//   - added tokens, special or not, matched leftmost-longest before
//     anything else, in the raw text or (normalized ones) the normalized
//     text.
//
// Anything else (SentencePiece-style Metaspace, WordPiece, Unigram, added
// tokens with lstrip, rstrip or single_word) is refused by [Load] with an
// error that names the file and the construct: duet never approximates a
// tokenizer it cannot reproduce.
//
// # Split patterns
//
// Go's regexp cannot express the look-ahead of `\s+(?!\S)`. The split
// patterns of Llama-3 and Qwen (digits in runs of one or of up to three)
// and DeepSeek-V3's three have hand-written scanners; any other pattern
// runs on github.com/dlclark/regexp2, a backtracking engine with
// Oniguruma's look-around. Differential tests hold the scanners to
// regexp2 on the same patterns.
//
// # Cost
//
// Text is split on added tokens first, and each piece between them is
// tokenized on its own (as Hugging Face does), so pieces are independent.
// [Tokenizer] caches the ids of whole pieces, keyed by their text and
// bounded in bytes: a chat whose history was seen before costs the
// rendering of its template and the tokenization of its new messages only.
// BPE results of single words are cached too.
package tokenize
