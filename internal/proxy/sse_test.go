package proxy

import (
	"bytes"
	"testing"
)

// FuzzLastEventEnd checks the backward scan against the plain definition: the end of the last
// "\n\n" or "\r\n\r\n" in the buffer, whichever ends later.
func FuzzLastEventEnd(f *testing.F) {
	for _, s := range []string{
		"", "\n", "\n\n", "data: a\n\n", "data: a\n\ndata: b", "data: a\r\n\r\ndata: b\r\n",
		"\r\n\r\n\n", "a\n\r\n", "\r\n\n", "x\r\r\n\r\n", "data: a\n\ndata: b\n", "\n\r\n\r\n\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := lastEventEndSearch(b)
		if got := lastEventEnd(b); got != want {
			t.Fatalf("lastEventEnd(%q) = %d, want %d", b, got, want)
		}
	})
}

// lastEventEndSearch is the plain definition FuzzLastEventEnd checks against, and the
// implementation before the backward scan: BenchmarkLastEventEnd compares the two.
func lastEventEndSearch(b []byte) int {
	end := 0
	if i := bytes.LastIndex(b, []byte("\n\n")); i >= 0 {
		end = i + 2
	}
	if i := bytes.LastIndex(b, []byte("\r\n\r\n")); i >= 0 && i+4 > end {
		end = i + 4
	}
	return end
}

// BenchmarkLastEventEnd: a read of one chat-completion chunk event, as the relay sees it.
//
//	go test -run XXX -bench LastEventEnd ./internal/proxy/
func BenchmarkLastEventEnd(b *testing.B) {
	event := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token"},"finish_reason":null}]}` + "\n\n")
	for _, f := range []struct {
		name string
		fn   func([]byte) int
	}{{"search", lastEventEndSearch}, {"backward", lastEventEnd}} {
		b.Run(f.name, func(b *testing.B) {
			for b.Loop() {
				f.fn(event)
			}
		})
	}
}
