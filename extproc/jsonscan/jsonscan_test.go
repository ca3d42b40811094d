package jsonscan

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// cases are documents each function is checked on; the fuzz corpus starts
// from them too.
var cases = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-3`, `-12E+7`, `true`, `false`, `null`,
	` {"a" : [1, 2.0, "x", {"b": null}] } `,
	`{"model":"m","messages":[{"role":"user","content":"hi \"there\" \\ \/ \b\f\n\r\t \u00e9 \uD83D\uDE00"}]}`,
	`{"a":"` + strings.Repeat("lorem ipsum ", 100) + `","b":[true,false]}`,
	`{"a":"é ü 日本"}`,
	// Invalid.
	``, ` `, `{`, `}`, `[`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{"a":1 "b":2}`,
	`01`, `1.`, `.5`, `1e`, `1e+`, `-`, `--1`, `+1`, `0x10`, `1.5.5`,
	`tru`, `nul`, `falsey`, `"abc`, `"a\x"`, `"a\u12"`, `"a\u12g4"`, "\"a\x01b\"", "\"tab\tin\"",
	`{"a":1}{"b":2}`, `[1]x`, `{1:2}`, `{'a':1}`, `"\`, `"a\"`,
	"\"\x7f\"", "\"\xff\xfe\"",
}

func TestValidateMatchesGJSON(t *testing.T) {
	for _, c := range cases {
		for _, doc := range []string{c, " " + c + "\n", "[" + c + "]", `{"k":` + c + `}`} {
			got := Validate([]byte(doc), 1000) == nil
			if want := gjson.Valid(doc); got != want {
				t.Errorf("Validate(%q) ok = %v, gjson.Valid = %v", doc, got, want)
			}
		}
	}
}

func TestValidateDepth(t *testing.T) {
	for _, tc := range []struct {
		doc   string
		limit int
		ok    bool
	}{
		{`{"a":1}`, 1, true},
		{`{"a":[[1]]}`, 3, true},
		{`{"a":[[[1]]]}`, 3, false},
		{`{"a":"[[[[[[{{{{"}`, 1, true},
		{`[[1],[2],[3]]`, 2, true},
		{`1`, 0, true},
		{`[]`, 0, false},
		{strings.Repeat("[", 6<<20), 64, false},
	} {
		err := Validate([]byte(tc.doc), tc.limit)
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%.40q, %d) = %v, want ok %v", tc.doc, tc.limit, err, tc.ok)
		}
		if err != nil && errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%.40q, %d) = %v: a depth error, not ErrInvalid", tc.doc, tc.limit, err)
		}
	}
}

func TestMembersAndElements(t *testing.T) {
	doc := []byte(` { "model" : "m", "a\"b":[1, {"x":"}"}, "]"] ,"n":-1.5e3,"t":true,"z":null, "model":"last"} `)
	if err := Validate(doc, 10); err != nil {
		t.Fatal(err)
	}
	ms, err := Members(nil, doc)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, string(doc[m.Key.Start:m.Key.End])+"="+string(doc[m.Value.Start:m.Value.End]))
	}
	want := []string{`"model"="m"`, `"a\"b"=[1, {"x":"}"}, "]"]`, `"n"=-1.5e3`, `"t"=true`, `"z"=null`, `"model"="last"`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Members:\n got %q\nwant %q", got, want)
	}
	arr := ms[1].Value
	els, err := Elements(nil, doc[arr.Start:arr.End])
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, e := range els {
		got = append(got, string(doc[arr.Start+e.Start:arr.Start+e.End]))
	}
	if want := []string{`1`, `{"x":"}"}`, `"]"`}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Elements: got %q, want %q", got, want)
	}
	for _, empty := range []string{`{}`, ` { } `, `[]`, `[ ]`} {
		if ms, err := Members(nil, []byte(empty)); empty[len(empty)-1] != ']' && (err != nil || len(ms) != 0) {
			t.Errorf("Members(%q) = %v, %v", empty, ms, err)
		}
		if es, err := Elements(nil, []byte(empty)); strings.Contains(empty, "[") && (err != nil || len(es) != 0) {
			t.Errorf("Elements(%q) = %v, %v", empty, es, err)
		}
	}
	if _, err := Members(nil, []byte(`[1]`)); err == nil {
		t.Error("Members of an array: no error")
	}
	if _, err := Elements(nil, []byte(`{}`)); err == nil {
		t.Error("Elements of an object: no error")
	}
}

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{`""`, true}, {`"abc"`, true}, {`"` + strings.Repeat("x", 100) + `"`, true},
		{`"a\nb"`, false}, {`"` + strings.Repeat("x", 20) + `\"` + `"`, false}, {`"`, false},
	} {
		if got := Plain([]byte(tc.s)); got != tc.want {
			t.Errorf("Plain(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

// FuzzValidate holds Validate to gjson's verdict, and checks that Members
// and Elements agree with gjson on every document both accept.
func FuzzValidate(f *testing.F) {
	for _, c := range cases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		err := Validate(doc, 1<<20)
		if got, want := err == nil, gjson.ValidBytes(doc); got != want {
			t.Fatalf("Validate(%q) = %v, gjson.ValidBytes = %v", doc, err, want)
		}
		// The splitters never panic, valid input or not.
		ms, _ := Members(nil, doc)
		es, _ := Elements(nil, doc)
		if err != nil {
			return
		}
		root := gjson.ParseBytes(doc)
		switch {
		case root.IsObject():
			var want []string
			root.ForEach(func(k, v gjson.Result) bool {
				want = append(want, k.Raw+"="+v.Raw)
				return true
			})
			var got []string
			for _, m := range ms {
				got = append(got, string(doc[m.Key.Start:m.Key.End])+"="+string(doc[m.Value.Start:m.Value.End]))
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Fatalf("Members(%q) = %q, gjson %q", doc, got, want)
			}
		case root.IsArray():
			var want []string
			root.ForEach(func(_, v gjson.Result) bool {
				want = append(want, v.Raw)
				return true
			})
			var got []string
			for _, e := range es {
				got = append(got, string(doc[e.Start:e.End]))
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Fatalf("Elements(%q) = %q, gjson %q", doc, got, want)
			}
		case root.Type == gjson.String:
			if Plain(bytes.TrimSpace(doc)) != !bytes.Contains(doc, []byte(`\`)) {
				t.Fatalf("Plain(%q) wrong", doc)
			}
		}
	})
}

func BenchmarkValidate(b *testing.B) {
	const head = `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`
	const tail = `"}]}`
	fill := 32<<10 - len(head) - len(tail)
	doc := []byte(head + strings.Repeat("lorem ipsum ", fill/12+1)[:fill] + tail)
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if err := Validate(doc, 256); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gjson", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if !gjson.ValidBytes(doc) {
				b.Fatal("invalid")
			}
		}
	})
}
