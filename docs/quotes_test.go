// Package docs holds duet's documentation. Its test checks that what the
// pages quote of duet's output (error messages, outcome labels, metric
// names) is what duet's code writes, so that the pages cannot drift from
// it.
//
// A page marks what it quotes with an HTML comment, which Markdown does
// not render:
//
//   - <!-- checked: COLUMN; COLUMN --> before a table: every backticked
//     string in the named columns (a header starting with the name) is
//     checked;
//   - <!-- checked --> before a paragraph or list: every backticked string
//     up to the next blank line is checked.
//
// A backticked string right after "Envoy's ", "SGLang's ", "vLLM's " or
// "Go's " is that program's, not duet's, and is not checked. In a checked
// string, "…" or "..." stands for text the page leaves out; the
// punctuation at either end of the pieces between them is not checked. A metric with labels,
// name{label="value"}, is checked part by part.
//
// A string is duet's when duet's Go source (every package outside e2e/
// and deploy/, tests excluded) can produce it: its string literals, with
// the operands of a + that are not literals and the verbs of a format
// (%s, %d, %q, %v, ...) standing for a value (a word without spaces, such
// as the page's placeholders N, P, C, URL), and where a value is itself a
// message, the message that fills it (e.g. "pool %s is available: %v"
// with "scheduler: pick %s: %w" in the %v). Struct tags add their JSON
// names.
package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// checkedPages are the pages whose marked quotes are checked.
var checkedPages = []string{"troubleshooting.md", "status-page.md", "tracing.md"}

// TestQuotesComeFromTheCode checks every marked quote of checkedPages
// against duet's source.
func TestQuotesComeFromTheCode(t *testing.T) {
	src := loadSource(t, "..")
	for _, page := range checkedPages {
		t.Run(page, func(t *testing.T) {
			data, err := os.ReadFile(page)
			if err != nil {
				t.Fatal(err)
			}
			quotes, err := markedQuotes(string(data))
			if err != nil {
				t.Fatalf("%s: %v", page, err)
			}
			if len(quotes) == 0 {
				t.Fatalf("%s marks no quotes (<!-- checked ... -->)", page)
			}
			for _, q := range quotes {
				for _, part := range q.parts() {
					if !src.produces(part) {
						t.Errorf("%s:%d: `%s`: duet's source cannot produce %q (fix the page, or the code)", page, q.line, q.text, part)
					}
				}
			}
		})
	}
}

// TestMarkedQuotes checks how quotes are found on a page and split.
func TestMarkedQuotes(t *testing.T) {
	tests := []struct {
		name, page string
		want       []string // the parts of every quote, in order
		wantErr    string
	}{
		{"table columns", "<!-- checked: message; outcome -->\n| status | message starts with | outcome | cause |\n|---|---|---|---|\n" +
			"| 400 | `invalid request body: …` or Envoy's `Payload Too Large` | `invalid_body` | `not checked` |\n",
			[]string{"invalid request body", "invalid_body"}, ""},
		{"double backticks and pipes in quotes", "<!-- checked: message -->\n| message |\n|---|\n| ``the model `X` does not exist; ...`` and `a|b` |\n",
			[]string{"the model `X` does not exist", "a|b"}, ""},
		{"paragraph", "text `not checked`\n\n<!-- checked -->\nstate (`healthy`, `half_open`)\nand `reason`\n\nlater `not checked`\n",
			[]string{"healthy", "half_open", "reason"}, ""},
		{"punctuation next to an ellipsis", "<!-- checked -->\n`(class C)`, `the body is not valid JSON (…)`, `…; docs/x.md)`\n",
			[]string{"(class C)", "the body is not valid JSON", "docs/x.md)"}, ""},
		{"metric with labels", "<!-- checked -->\n`duet_tokenize_requests_total{outcome=\"invalid_messages\"}`\n",
			[]string{"duet_tokenize_requests_total", "outcome", "invalid_messages"}, ""},
		{"unknown column", "<!-- checked: nothing -->\n| status |\n|---|\n| 400 |\n", nil, "no column"},
		{"marker without a table", "<!-- checked: status -->\ntext\n", nil, "no table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			quotes, err := markedQuotes(tt.page)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, q := range quotes {
				got = append(got, q.parts()...)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parts = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestProduces checks the matcher on a small source.
func TestProduces(t *testing.T) {
	src := &source{}
	for _, lit := range []string{
		"no inference endpoint of pool %s is available: %v",
		"scheduler: pick %s: %w: %s",
		"no ready endpoint",
		"%d of %d %s engines not reached by discovery yet",
		" (see duet's /readyz)",
		"request body exceeds the %d-byte limit",
		"invalid_body",
		"retry after %ds",
		", ",
		"%s: %s",
		"duet_%s",
	} {
		src.add(lit)
	}
	tests := []struct {
		text string
		want bool
	}{
		{"no inference endpoint of pool P is available: scheduler: pick decode: no ready endpoint: 1 of 1 decode engines not reached by discovery yet (see duet's /readyz)", true},
		{"request body exceeds the N-byte limit", true},
		{"body exceeds the", true}, // a piece of a message
		{"ody exceeds the", false}, // not from the middle of a word
		{"body exceeds th", false},
		{"invalid_body", true},
		{"request body exceeds the N byte limit", false},
		{"no ready endpoints", false}, // not "retry after %ds"'s "s"
		{"no ready endpoint, no ready endpoint", true},
		{"scheduler: pick decode: no engine", false},
		{"P", false},                 // a value alone is nothing of duet's
		{"zzzz: qqqq", false},        // not "%s: %s" with two values
		{"invalid_bodyx", false},     // a name must be a literal, whole
		{"duet_invalid_body", false}, // not "duet_" + a value
	}
	for _, tt := range tests {
		if got := src.produces(tt.text); got != tt.want {
			t.Errorf("produces(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// quote is a checked backticked string of a page.
type quote struct {
	line int
	text string
}

// metricRE is a metric with labels, name{label="value",...}.
var (
	metricRE = regexp.MustCompile(`^(duet_\w+)\{(.*)\}$`)
	labelRE  = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// parts are the pieces of q that duet's source must produce: the text
// between ellipses, and a metric's name, label names and values.
func (q quote) parts() []string {
	if m := metricRE.FindStringSubmatch(q.text); m != nil {
		out := []string{m[1]}
		for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
			out = append(out, l[1], l[2])
		}
		return out
	}
	var out []string
	pieces := strings.Split(strings.ReplaceAll(q.text, "...", "…"), "…")
	for i, p := range pieces {
		// Punctuation next to an ellipsis belongs to the text left out.
		if i > 0 {
			p = strings.TrimLeft(p, ellipsisPunct)
		}
		if i < len(pieces)-1 {
			p = strings.TrimRight(p, ellipsisPunct)
		}
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ellipsisPunct is the punctuation that parts trims next to an ellipsis.
const ellipsisPunct = " :;,.()"

// markerRE is a checked marker: its columns, or none for a paragraph.
var markerRE = regexp.MustCompile(`^<!-- checked(?::\s*(.*?))?\s*-->$`)

// markedQuotes returns the checked quotes of page.
func markedQuotes(page string) ([]quote, error) {
	lines := strings.Split(page, "\n")
	var out []quote
	for i := 0; i < len(lines); i++ {
		m := markerRE.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		start := i + 1
		if m[1] == "" { // a paragraph or list
			for i = start; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
				for _, s := range spans(lines[i]) {
					out = append(out, quote{i + 1, s})
				}
			}
			continue
		}
		if start >= len(lines) || !strings.HasPrefix(lines[start], "|") {
			return nil, fmt.Errorf("line %d: <!-- checked: %s --> is followed by no table", i+1, m[1])
		}
		header := cells(lines[start])
		var cols []int
		for _, name := range strings.Split(m[1], ";") {
			name = strings.TrimSpace(name)
			found := false
			for c, h := range header {
				if strings.HasPrefix(strings.TrimSpace(h), name) {
					cols, found = append(cols, c), true
				}
			}
			if !found {
				return nil, fmt.Errorf("line %d: the table has no column %q (its columns: %q)", start+1, name, header)
			}
		}
		for i = start + 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
			row := cells(lines[i])
			for _, c := range cols {
				if c < len(row) {
					for _, s := range spans(row[c]) {
						out = append(out, quote{i + 1, s})
					}
				}
			}
		}
	}
	return out, nil
}

// others are the words before a backticked string that make it another
// program's.
var others = []string{"Envoy's ", "SGLang's ", "vLLM's ", "Go's "}

// spans returns the backticked strings of Markdown text, single or
// double backticked, but those that others says are another program's.
func spans(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		fence := strings.Repeat("`", n)
		end := strings.Index(text[i+n:], fence)
		if end < 0 {
			break
		}
		body := text[i+n : i+n+end]
		if n > 1 {
			body = strings.TrimSpace(body)
		}
		other := false
		for _, o := range others {
			other = other || strings.HasSuffix(text[:i], o)
		}
		if !other {
			out = append(out, body)
		}
		i += 2*n + end
	}
	return out
}

// cells splits a Markdown table row into its cells, leaving the | inside
// backticks alone.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	row = strings.TrimSuffix(row, "|")
	var out []string
	var cur strings.Builder
	ticks := 0 // the length of the open backtick run, 0 outside
	for i := 0; i < len(row); i++ {
		c := row[i]
		if c == '`' {
			n := 0
			for i+n < len(row) && row[i+n] == '`' {
				n++
			}
			switch {
			case ticks == 0:
				ticks = n
			case ticks == n:
				ticks = 0
			}
			cur.WriteString(row[i : i+n])
			i += n - 1
			continue
		}
		if c == '|' && ticks == 0 {
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	return append(out, cur.String())
}

// template is a string of duet's source: constant parts between values.
// parts has one more element than there are values; a value sits between
// parts[i] and parts[i+1].
type template struct{ parts []string }

// start is where a piece may begin after the text's start: part k of a
// template at offset 0 (its start when k is 0, else right after a value).
type start struct {
	tp *template
	k  int
}

// source is the templates of duet's Go source, and where pieces may start.
type source struct {
	literals  map[string]bool // every literal and JSON name, whole
	templates []*template
	seen      map[string]bool
	byFirst   map[byte][]start // by the first byte of a non-empty part
	byValue   []start          // empty parts, followed by a value
}

// verbRE is a format verb; %% is a literal percent sign.
var verbRE = regexp.MustCompile(`%[-+# 0]*(?:\[\d+\])?[0-9*]*(?:\.[0-9*]*)?[a-zA-Z%]`)

// value marks a non-literal operand in a concatenation's text.
const value = "\x00"

// add adds a literal (a format, or a concatenation with value marks).
func (s *source) add(lit string) {
	if s.literals == nil {
		s.literals = map[string]bool{}
	}
	s.literals[lit] = true
	var parts []string
	cur := ""
	last := 0
	for _, loc := range verbRE.FindAllStringIndex(lit, -1) {
		cur += lit[last:loc[0]]
		last = loc[1]
		if lit[loc[0]:loc[1]] == "%%" {
			cur += "%"
			continue
		}
		parts = append(parts, cur)
		cur = ""
	}
	cur += lit[last:]
	parts = append(parts, cur)
	var split []string
	for _, p := range parts {
		split = append(split, strings.Split(p, value)...)
	}
	key := strings.Join(split, value)
	if strings.Join(split, "") == "" || s.seen[key] {
		return // values alone, or known
	}
	if s.seen == nil {
		s.seen, s.byFirst = map[string]bool{}, map[byte][]start{}
	}
	s.seen[key] = true
	tp := &template{split}
	s.templates = append(s.templates, tp)
	for k, p := range split {
		switch {
		case p != "":
			s.byFirst[p[0]] = append(s.byFirst[p[0]], start{tp, k})
		case k < len(split)-1:
			s.byValue = append(s.byValue, start{tp, k})
		}
	}
}

// loadSource reads the string literals of every Go file under root
// outside e2e/, deploy/, docs/ and hidden or tool directories, tests
// excluded.
func loadSource(t *testing.T, root string) *source {
	t.Helper()
	s := &source{}
	fset := token.NewFileSet()
	skip := map[string]bool{"e2e": true, "deploy": true, "docs": true, "bin": true, "testdata": true}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skip[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		s.addFile(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.templates) < 100 {
		t.Fatalf("found %d string literals under %s: not duet's source", len(s.templates), root)
	}
	return s
}

// addFile adds the string literals of f: concatenations as one, with
// value marks for their other operands, and struct tags' JSON names.
func (s *source) addFile(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if n.Op == token.ADD {
				if text, ok := concat(n); ok {
					s.add(text)
				}
			}
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				if v, err := strconv.Unquote(n.Value); err == nil {
					s.add(v)
				}
			}
		case *ast.Field:
			if n.Tag != nil {
				if tag, err := strconv.Unquote(n.Tag.Value); err == nil {
					if name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ","); name != "" && name != "-" {
						s.add(name)
					}
				}
			}
			return true
		}
		return true
	})
}

// concat is the text of a + chain that holds a string literal, with value
// marks for its other operands.
func concat(e ast.Expr) (string, bool) {
	var b strings.Builder
	lits := 0
	var walk func(ast.Expr)
	walk = func(e ast.Expr) {
		switch e := e.(type) {
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				walk(e.X)
				walk(e.Y)
				return
			}
		case *ast.ParenExpr:
			walk(e.X)
			return
		case *ast.BasicLit:
			if e.Kind == token.STRING {
				if v, err := strconv.Unquote(e.Value); err == nil {
					b.WriteString(v)
					lits++
					return
				}
			}
		}
		b.WriteString(value)
	}
	walk(e)
	return b.String(), lits > 0
}

// identRE is a name: a label, a label value, a metric or JSON name, which
// duet's source must hold whole, not make up (duet_ + a value is no
// outcome label).
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// minCut is the fewest constant characters of a piece that the start or
// the end of the text cuts out of its template, and minPiece of any piece
// but a whole template: fewer would let a stray letter pass (a plural "s"
// from "retry after %ds").
const (
	minCut      = 4
	minInnerCut = 8
	minPiece    = 2
)

// produces reports whether text is made of duet's templates: a sequence of
// pieces, each a template's constant parts with words for its values. A
// piece begins where its template begins or right after one of its
// values (where the previous piece was written into it), or anywhere at
// the start of text; it ends where its template ends or right before a
// value, or anywhere at the end of text. A piece holds minPiece constant
// characters or is a whole template, minPiece letters or digits when it
// has values (so that no ": " between two values makes any text), and
// minCut constant characters where the text cuts it. A text that is a
// name (identRE) must be a literal of the source, whole.
func (s *source) produces(text string) bool {
	if text == "" {
		return false
	}
	if identRE.MatchString(text) {
		return s.literals[text]
	}
	reach := make([]bool, len(text)+1)
	reach[0] = true
	mark := func(ends []int) {
		for _, end := range ends {
			reach[end] = true
		}
	}
	// The text's start: anywhere in a constant part, or at a value.
	for _, tp := range s.templates {
		for k, part := range tp.parts {
			for o := 0; o < len(part) || o == 0; o++ {
				if o < len(part) && part[o] != text[0] || o > 0 && wordByte(part[o-1]) && wordByte(text[0]) {
					continue // another first byte, or the middle of a word
				}
				mark(tp.match(text, 0, k, o, piece{cut: k > 0 || o > 0, whole: k == 0 && o == 0}, nil))
			}
			if k > 0 {
				for _, j := range words(text, 0) {
					mark(tp.match(text, j, k, 0, piece{cut: true, values: 1}, nil))
				}
			}
		}
	}
	for i := 1; i < len(text) && !reach[len(text)]; i++ {
		if !reach[i] {
			continue
		}
		for _, st := range s.byFirst[text[i]] {
			mark(st.tp.match(text, i, st.k, 0, piece{whole: st.k == 0, inner: st.k > 0}, nil))
		}
		for _, st := range s.byValue {
			mark(st.tp.match(text, i, st.k, 0, piece{whole: st.k == 0, inner: st.k > 0}, nil))
		}
	}
	return reach[len(text)]
}

// piece is what a piece has matched so far.
type piece struct {
	consts int  // constant characters
	alnum  int  // of which letters and digits
	values int  // words in the places of values
	cut    bool // the text's start cut it out of its template
	whole  bool // it began at its template's start
	inner  bool // it began right after a value, inside the text
}

// ends reports whether the piece may end here: at its template's end
// (last) or right before a value.
func (p piece) ends(last bool) bool {
	switch {
	case p.cut && p.consts < minCut:
		return false
	case p.values > 0:
		return p.alnum >= minPiece
	default:
		return p.consts >= minPiece || (p.whole && last && p.consts == 1 && p.alnum == 0)
	}
}

// endsCut reports whether the piece may end where the text ends, inside
// a constant part: it needs minCut constant characters, minInnerCut when
// it began right after a value (the text " body" after any "%s" is no
// evidence), and minPiece letters or digits when it has values.
func (p piece) endsCut() bool {
	switch {
	case p.consts < minCut || (p.inner && p.consts < minInnerCut):
		return false
	case p.values > 0:
		return p.alnum >= minPiece
	}
	return true
}

// match matches tp from part k, offset o, against text[i:], with p
// matched so far, and adds the ends of pieces to ends.
func (tp *template) match(text string, i, k, o int, p piece, ends []int) []int {
	part := tp.parts[k][o:]
	n := 0
	for n < len(part) && i+n < len(text) && text[i+n] == part[n] {
		if c := part[n]; wordByte(c) && c != '_' {
			p.alnum++
		}
		n++
	}
	p.consts += n
	i += n
	last := k == len(tp.parts)-1
	if n < len(part) {
		// The text ended or differs inside a constant part: a piece may
		// end there only at the text's end.
		if i == len(text) && p.endsCut() && !(wordByte(part[n]) && wordByte(text[i-1])) {
			ends = append(ends, i)
		}
		return ends
	}
	if p.ends(last) {
		ends = append(ends, i)
	}
	if last || i == len(text) {
		return ends
	}
	// The value between part k and k+1: a word.
	p.values++
	for _, j := range words(text, i) {
		ends = tp.match(text, j, k+1, 0, p, ends)
	}
	return ends
}

// wordByte reports whether c is a letter, a digit or an underscore: the
// text may not start or end in the middle of a template's word ("body"
// is not in "body_too_large").
func wordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

// words returns the ends of the words (no white space, at least one
// character) that start at text[i].
func words(text string, i int) []int {
	var out []int
	for j := i; j < len(text) && text[j] != ' ' && text[j] != '\n' && text[j] != '\t'; j++ {
		out = append(out, j+1)
	}
	return out
}
