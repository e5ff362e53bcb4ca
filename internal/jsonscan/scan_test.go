package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// walk reads a whole document, skipping every value.
func walk(b []byte) error {
	s := New(b)
	s.Document(s.Skip)
	return s.Err()
}

func TestValidity(t *testing.T) {
	cases := map[string]bool{
		`{}`: true, `[]`: true, `{"a":[1,-2.5e3,true,false,null,"x\u00e9\n"]}`: true, ` 7 `: true,
		`{`: false, `{"a"}`: false, `{"a":1,}`: false, `[1 2]`: false, `"\x"`: false, `01`: false,
		"\"a\x01\"": false, `{} {}`: false, ``: false, `nul`: false, `"\ud800"`: true, `1.`: false,
	}
	for doc, want := range cases {
		if got := walk([]byte(doc)) == nil; got != want || json.Valid([]byte(doc)) != want {
			t.Errorf("%q: valid %v, encoding/json %v, want %v", doc, got, json.Valid([]byte(doc)), want)
		}
	}
}

func TestAppendUnescaped(t *testing.T) {
	raw := []byte(`a\"b\\c\n\u00e9\ud83d\ude00\ud800z`)
	got := string(AppendUnescaped(nil, raw, -1))
	if want := "a\"b\\c\né😀\uFFFDz"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := string(AppendUnescaped([]byte("x"), raw, 4)); got != `xa"b` {
		t.Errorf("capped: %q", got)
	}
}

// FuzzScanner holds the scanner to encoding/json: the same verdict on every document, and the
// same decoded contents for every top-level string.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":null}],"c":"d\u0041"}`, `"\ud83d\ude00"`, `[1e5,-0.0,true]`, `{"a":1,}`, `"x\`,
		`"0123456789abcdef0123456789\n\u00e9\"0123456789abcdef0123"`, "\"0123456789abcdef\x1f0123456789\"",
		`"0123456789abcdef0123456789abcdef\q"`, `"0123456789abcdef0123456789abcdef\u12g4"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if (walk(b) == nil) != json.Valid(b) {
			t.Fatalf("verdict differs from encoding/json for %q", b)
		}
		s := New(b)
		var raw []byte
		s.Document(func() {
			if s.Peek() == '"' {
				raw = s.Str(false)
			} else {
				s.Skip()
			}
		})
		var want string
		if s.Err() == nil && raw != nil && utf8.Valid(raw) && json.Unmarshal(b, &want) == nil {
			if got := string(AppendUnescaped(nil, raw, -1)); got != want {
				t.Fatalf("decoded %q, encoding/json %q", got, want)
			}
		}
	})
}

// TestSpecialAt holds the word-at-a-time search to a byte loop, for every byte value at every
// position of runs long enough to take each of its paths, behind plain bytes of every kind.
func TestSpecialAt(t *testing.T) {
	naive := func(b []byte) int {
		for i, c := range b {
			if c < 0x20 || c == '\\' {
				return i
			}
		}
		return -1
	}
	for _, fill := range []byte{'a', 0x20, 0x7f, 0x80, 0xff, '"'} {
		for n := 0; n <= 40; n++ {
			for pos := 0; pos < n; pos++ {
				for c := 0; c < 256; c++ {
					b := bytes.Repeat([]byte{fill}, n)
					b[pos] = byte(c)
					if got, want := specialAt(b), naive(b); got != want {
						t.Fatalf("fill %#x, %#x at %d of %d: got %d, want %d", fill, c, pos, n, got, want)
					}
				}
			}
		}
	}
}

// FuzzShallow holds the shallow scanner to encoding/json and to the full one: it accepts every
// document encoding/json accepts; it accepts a document encoding/json rejects only when the
// full scanner's first fault lies inside a string's contents; and DecodePrefix, decoding a raw
// string it returned, fails exactly when that string's contents are invalid, else decodes what
// encoding/json decodes.
func FuzzShallow(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":null}],"c":"d\u0041"}`, `"\ud83d\ude00"`, `[1e5,-0.0,true]`, `{"a":1,}`, `"x\`,
		`"a\\"`, `"a\\\"b"`, `["\q",1]`, "[\"\x01\"]", `{"k\q":1}`, `"\u12"`, `"\ud800\u12G4"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sh := NewShallow(b)
		sh.Document(sh.Skip)
		full := New(b)
		full.Document(full.Skip)
		if json.Valid(b) && sh.Err() != nil {
			t.Fatalf("shallow rejects %q, which encoding/json accepts: %v", b, sh.Err())
		}
		if sh.Err() == nil && full.Err() != nil {
			if m := full.Err().(*Error).Msg; m != "control character in string" && m != "invalid escape" {
				t.Fatalf("shallow accepts %q, whose fault is not inside a string: %v", b, full.Err())
			}
		}
		// A top-level string: DecodePrefix on the raw contents against the full scanner.
		sh = NewShallow(b)
		var raw []byte
		sh.Document(func() {
			if sh.Peek() == '"' {
				raw = sh.Str(false)
			} else {
				sh.Skip()
			}
		})
		if sh.Err() != nil || raw == nil {
			return
		}
		got, err := DecodePrefix(nil, raw, -1)
		if (err == nil) != (full.Err() == nil) {
			t.Fatalf("DecodePrefix of %q: %v; the full scanner: %v", b, err, full.Err())
		}
		var want string
		if err == nil && utf8.Valid(raw) && json.Unmarshal(b, &want) == nil && string(got) != want {
			t.Fatalf("decoded %q, encoding/json %q", got, want)
		}
	})
}
