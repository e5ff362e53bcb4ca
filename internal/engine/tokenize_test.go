package engine

import (
	"reflect"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	for _, tc := range []struct {
		text string
		n    int
	}{
		{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {strings.Repeat("x", 4000), 1000},
	} {
		t.Run(tc.text[:min(len(tc.text), 8)], func(t *testing.T) {
			toks := Tokenize(tc.text)
			if len(toks) != tc.n || TokenCount(tc.text) != tc.n {
				t.Errorf("len = %d, count = %d, want %d", len(toks), TokenCount(tc.text), tc.n)
			}
		})
	}
	if reflect.DeepEqual(Tokenize("abcd"), Tokenize("abce")) {
		t.Error("different text, same tokens")
	}
	if !reflect.DeepEqual(Tokenize("the same text"), Tokenize("the same text")) {
		t.Error("same text, different tokens")
	}
}

func FuzzTokenizePrefix(f *testing.F) {
	for _, s := range []string{"", "a", "hello world", "You are a helpful assistant. ", strings.Repeat("é", 100)} {
		f.Add(s, s+" and more")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tab := Tokenize(a), Tokenize(a+b)
		full := len(a) / BytesPerToken
		if full > 0 && !reflect.DeepEqual(ta[:full], tab[:full]) {
			t.Fatal("a text's whole tokens are not a prefix of a longer text's tokens")
		}
		for _, bs := range []int{1, 3, 4, 16} {
			want := blockKeys(nil, tab, bs)
			if got := blockKeysText(nil, a+b, bs); len(got)+len(want) > 0 && !reflect.DeepEqual(got, want) {
				t.Fatalf("bs %d: text keys %v, token keys %v", bs, got, want)
			}
			ka := blockKeys(nil, ta[:full], bs)
			if len(ka) > 0 && !reflect.DeepEqual(ka, want[:len(ka)]) {
				t.Fatal("block keys of a prefix are not a prefix of the keys")
			}
		}
	})
}
