package loadmon

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/kvgate/kvgate/internal/worker"
)

func TestReadResponse(t *testing.T) {
	const limit = 64
	tests := []struct {
		name     string
		resp     string
		wantBody string
		wantKeep bool
		wantErr  error // nil: none; errAny: any
	}{
		// Bytes after the body are seen only if they arrive with it: otherwise they are the next
		// response's problem (a malformed status line), so that case reads whole only.
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello", "hello", true, nil},
		{"connection close", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: Close\r\n\r\nok", "ok", false, nil},
		{"http/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", false, nil},
		{"empty body", "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", "", true, nil},
		{"chunked with extensions and trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"5;name=value\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n", "hello 0123456789", true, nil},
		{"until EOF", "HTTP/1.1 200 OK\r\n\r\nto the end", "to the end", false, nil},
		{"status 404", "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", "", false, &StatusError{Code: 404}},
		{"1xx is left to net/http", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "", false, errRawUnsupported},
		{"redirect is left to net/http", "HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics/\r\nContent-Length: 0\r\n\r\n", "", false, errRawUnsupported},
		{"gzip is left to net/http", "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx", "", false, errRawUnsupported},
		{"other transfer coding is left to net/http", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "", false, errRawUnsupported},
		{"folded header is left to net/http", "HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 1\r\n\r\nx", "", false, errRawUnsupported},
		{"length over limit", "HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n", "", false, ErrBodyTooLarge},
		{"chunked over limit", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" + strings.Repeat("x", 64) +
			"\r\n1\r\nx\r\n0\r\n\r\n", "", false, ErrBodyTooLarge},
		{"until EOF over limit", "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("x", 65), "", false, ErrBodyTooLarge},
		{"truncated body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", "", false, io.ErrUnexpectedEOF},
		{"truncated chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "", false, io.ErrUnexpectedEOF},
		{"missing last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "", false, io.ErrUnexpectedEOF},
		{"truncated header", "HTTP/1.1 200 OK\r\nContent-Len", "", false, io.ErrUnexpectedEOF},
		{"closed before answering", "", "", false, errStaleConn},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "", false, errAny},
		{"bad chunk end", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n", "", false, errAny},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy", "", false, errAny},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "", false, errAny},
		{"extra data after body", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxy", "", false, errAny},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", "", false, errAny},
		{"bad status code", "HTTP/1.1 2x0 OK\r\n\r\n", "", false, errAny},
	}
	for _, tt := range tests {
		for _, split := range []bool{false, true} {
			if split && tt.name == "extra data after body" {
				continue
			}
			t.Run(fmt.Sprintf("%s/one byte reads %v", tt.name, split), func(t *testing.T) {
				var r io.Reader = strings.NewReader(tt.resp)
				if split {
					r = iotest.OneByteReader(r)
				}
				body, keep, err := readResponse(r, &scratch{}, limit)
				var se *StatusError
				switch {
				case errors.As(tt.wantErr, &se):
					var got *StatusError
					if !errors.As(err, &got) || got.Code != se.Code {
						t.Fatalf("error %v, want status %d", err, se.Code)
					}
				default:
					checkErr(t, err, tt.wantErr)
				}
				if err == nil && (string(body) != tt.wantBody || keep != tt.wantKeep) {
					t.Fatalf("body %q keep %v, want %q %v", body, keep, tt.wantBody, tt.wantKeep)
				}
			})
		}
	}
}

// FuzzReadResponse: arbitrary bytes never panic nor yield more than the limit, and any body
// written with arbitrary chunking reads back intact.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), []byte("hello world"), []byte{3, 0, 7})
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"), []byte{}, []byte{})
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\n\r\n"), []byte("\r\n0\r\n\r\n"), []byte{1})
	f.Fuzz(func(t *testing.T, raw, body, cuts []byte) {
		const limit = 1 << 10
		got, _, err := readResponse(bytes.NewReader(raw), &scratch{}, limit)
		if err == nil && len(got) > limit {
			t.Fatalf("%d-byte body beyond the %d limit", len(got), limit)
		}
		// Round trip: body in chunks whose sizes come from cuts.
		var b bytes.Buffer
		b.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		rest := body
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) && int(cuts[i]) > 0 {
				n = min(n, int(cuts[i]))
			}
			fmt.Fprintf(&b, "%x\r\n%s\r\n", n, rest[:n])
			rest = rest[n:]
		}
		b.WriteString("0\r\n\r\n")
		got, keep, err := readResponse(iotest.HalfReader(&b), &scratch{}, limit)
		switch {
		case len(body) > limit:
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("%d-byte body: err %v, want ErrBodyTooLarge", len(body), err)
			}
		case err != nil || !bytes.Equal(got, body) || !keep:
			t.Fatalf("round trip: got %q keep %v err %v, want %q", got, keep, err, body)
		}
	})
}

func TestRawFallsBackToNetHTTP(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, logs := testMonitor(t, reg, Config{})
	gz := func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(rw)
		io.WriteString(zw, busyLoads)
		zw.Close()
	}
	w, h := fakeWorker(t, worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/v1/loads": http.HandlerFunc(gz)})
	addWorkers(t, reg, w)
	for range 3 {
		m.PollOnce(t.Context())
		if r, ok := m.Report(w); !ok || r.Backlog() != 10 {
			f, _ := m.Snapshot().Failure(w.ID)
			t.Fatalf("report %+v %v, want backlog 10; failure %+v", r, ok, f)
		}
	}
	// One raw attempt, then net/http for that poll and every later one.
	if got := h.get("/v1/loads"); got != 4 {
		t.Fatalf("/v1/loads hit %d times, want 4", got)
	}
	if got := logs.count("worker's HTTP is outside"); got != 1 {
		t.Fatalf("fallback logged %d times, want 1", got)
	}
}

func TestRedirectedMetrics(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	w, _ := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{
		"/metrics":  http.RedirectHandler("/metrics/", http.StatusTemporaryRedirect),
		"/metrics/": serveBody(200, vllmMetrics),
	})
	addWorkers(t, reg, w)
	for range 2 {
		m.PollOnce(t.Context())
		if r, ok := m.Report(w); !ok || r.Backlog() != 13 {
			f, _ := m.Snapshot().Failure(w.ID)
			t.Fatalf("report %+v %v, want backlog 13; failure %+v", r, ok, f)
		}
	}
}

// TestPollWithNetHTTP runs the failure cases through a caller-supplied net/http client too.
func TestPollWithNetHTTP(t *testing.T) {
	reg := worker.NewRegistry()
	client := NewClient()
	t.Cleanup(client.CloseIdleConnections)
	m, _, _ := testMonitor(t, reg, Config{Client: client, MaxBody: 2 << 10})
	ok, _ := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{"/metrics": serveBody(200, vllmMetrics)})
	huge, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/": serveBody(200, strings.Repeat(" ", 4<<10))})
	truncated, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/": http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Length", "100")
		io.WriteString(rw, `{"loads":[]}`)
	})})
	addWorkers(t, reg, ok, huge, truncated)
	m.PollOnce(t.Context())
	s := m.Snapshot()
	if e, got := s.Entry(ok.ID); !got || e.Report.Backlog() != 13 {
		t.Fatalf("healthy vLLM worker: entry %+v %v", e, got)
	}
	for name, w := range map[string]*worker.Worker{"huge": huge, "truncated": truncated} {
		if _, got := s.Entry(w.ID); got {
			t.Errorf("%s worker has an entry", name)
		}
	}
}

// TestAPIKeyCannotInjectHeaders: a worker's api key with CR/LF in it never becomes header lines
// of a poll request; the worker is polled without it and the poll fails.
func TestAPIKeyCannotInjectHeaders(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	injected := make(chan string, 8)
	w, _ := fakeWorker(t, worker.Spec{Runtime: "sglang"}, map[string]http.Handler{
		"/": http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if v := r.Header.Get("X-Evil"); v != "" {
				injected <- v
			}
			io.WriteString(rw, busyLoads)
		}),
	})
	w.Spec.APIKey = "key\r\nX-Evil: 1"
	addWorkers(t, reg, w)
	m.PollOnce(t.Context())
	select {
	case v := <-injected:
		t.Fatalf("the api key injected a header line: X-Evil: %s", v)
	default:
	}
	if _, ok := m.Report(w); ok {
		t.Error("a worker whose api key cannot be sent was polled as if it could")
	}
}
