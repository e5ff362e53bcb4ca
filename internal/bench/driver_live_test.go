package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// fakeServer is an OpenAI-compatible streaming server that reports cached_tokens = prompt/2.
type fakeServer struct {
	requests atomic.Int64
	status   int // non-zero: answer every request with it
	keys     atomic.Int64
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","owned_by":"sglang"}]}`)
		return
	}
	f.requests.Add(1)
	if r.Header.Get("X-Session-Id") != "" {
		f.keys.Add(1)
	}
	if f.status != 0 {
		w.WriteHeader(f.status)
		fmt.Fprint(w, `{"error":{"message":"no worker","type":"service_unavailable"}}`)
		return
	}
	var req struct {
		Model         string    `json:"model"`
		Messages      []Message `json:"messages"`
		Prompt        string    `json:"prompt"`
		MaxTokens     int       `json:"max_tokens"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "fake-model" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	prompt := len(strings.Fields(req.Prompt))
	for _, m := range req.Messages {
		prompt += len(strings.Fields(m.Content))
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
	for i := 0; i < req.MaxTokens; i++ {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		fl.Flush()
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", prompt, req.MaxTokens, prompt/2)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func TestLiveReportsServerUsage(t *testing.T) {
	for _, api := range []string{"chat", "completions"} {
		t.Run(api, func(t *testing.T) {
			fs := &fakeServer{}
			srv := httptest.NewServer(fs)
			defer srv.Close()
			w := NewSharedPrefix(1)
			var wantPrompt, wantCached int64
			for k := 0; k < 12; k++ {
				s, _ := w.Session(k)
				n := int64(len(strings.Fields(s.Turns[0].Text())))
				wantPrompt += n
				wantCached += n / 2
			}
			sched, err := NewSchedule(w, Arrivals{Concurrency: 3}, Limits{Requests: 12}, 1)
			if err != nil {
				t.Fatal(err)
			}
			var progress bytes.Buffer
			res, err := RunLive(context.Background(), LiveConfig{Target: srv.URL, API: api, SessionHeader: true, Progress: &progress}, sched, "fake")
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			if s.OK != 12 || s.Errors != 0 {
				t.Fatalf("ok %d errors %d (%v)", s.OK, s.Errors, s.ErrorKinds)
			}
			if s.PromptTokens != wantPrompt || s.CachedTokens != wantCached {
				t.Fatalf("prompt %d cached %d, want %d and %d", s.PromptTokens, s.CachedTokens, wantPrompt, wantCached)
			}
			if s.TTFTP50 <= 0 || s.E2EP99 < s.TTFTP99 || s.OutTokSec <= 0 {
				t.Fatalf("implausible timings %+v", s)
			}
			if fs.keys.Load() != 12 {
				t.Fatalf("%d requests carried a session key, want 12", fs.keys.Load())
			}
			if !strings.Contains(progress.String(), "done 12") {
				t.Fatalf("final progress line missing: %q", progress.String())
			}
		})
	}
}

func TestLiveCountsErrors(t *testing.T) {
	fs := &fakeServer{status: http.StatusServiceUnavailable}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	sched, _ := NewSchedule(NewSharedPrefix(1), Arrivals{Rate: 200}, Limits{Requests: 5}, 1)
	res, err := RunLive(context.Background(), LiveConfig{Target: srv.URL, Model: "fake-model"}, sched, "fake")
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.OK != 0 || res.Summary.Errors != 5 || res.Summary.ErrorKinds["http 503: no worker"] != 5 {
		t.Fatalf("summary %+v", res.Summary)
	}
	if len(res.Warnings) == 0 || !strings.Contains(strings.Join(res.Warnings, ";"), "5 of 5 requests failed") {
		t.Fatalf("warnings %q", res.Warnings)
	}
}

// TestLiveWarnsWhenClientIsBottleneck: three requests all due at once and one in-flight slot:
// the first holds the slot until the run is cancelled, so the second start must wait for it,
// and the report says the client was the bottleneck. The run is cancelled only once the driver
// counts that wait: cancelling when the first request reached the server raced the driver's
// next loop iteration, and a loaded machine that held the driver back while the first request
// crossed loopback, was cancelled and gave its slot back let the second start find the slot
// free and the warning never came.
func TestLiveWarnsWhenClientIsBottleneck(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // stuck until the client gives up or the test ends
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	defer srv.Close()
	defer close(stop)
	es := []TraceEntry{{Prompt: "a", OutputTokens: 1}, {Prompt: "b", OutputTokens: 1}, {Prompt: "c", OutputTokens: 1}}
	sched, err := NewSchedule(NewTrace(es, 1), Arrivals{}, Limits{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LiveConfig{Target: srv.URL, Model: "m", MaxInflight: 1}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// RunLive's open loop, with the run's state in reach of the test.
	l := &live{cfg: cfg, targets: []string{cfg.Target}, sched: sched, start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		l.openLoop(ctx)
	}()
	testutil.Until(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.blocked > 0
	}, "a session start waiting for the in-flight slot")
	cancel()
	testutil.Recv(t, ended, "the open loop's end once cancelled")
	if w := strings.Join(l.warnings(), ";"); !strings.Contains(w, "client was the bottleneck") {
		t.Fatalf("warnings %q, want a client bottleneck warning", w)
	}
}

func TestLiveConfigErrors(t *testing.T) {
	sched, _ := NewSchedule(NewSharedPrefix(1), Arrivals{Rate: 1}, Limits{Requests: 1}, 1)
	cases := []struct {
		name string
		cfg  LiveConfig
		want string
	}{
		{"no scheme", LiveConfig{Target: "localhost:1"}, "http(s) URL"},
		{"bad api", LiveConfig{Target: "http://127.0.0.1:1", API: "embeddings"}, "chat or completions"},
		{"no model server", LiveConfig{Target: "http://127.0.0.1:1", Timeout: time.Second}, "pass --model"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RunLive(context.Background(), tc.cfg, sched, "x")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestReadStreamMeasures(t *testing.T) {
	body := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n" +
		"data: [DONE]\n\n"
	rec, err := readStream(strings.NewReader(body), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rec.PromptTokens != 9 || rec.CachedTokens != 4 || rec.OutputTokens != 2 {
		t.Fatalf("record %+v", rec)
	}
	_, err = readStream(strings.NewReader("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"), time.Now())
	if err == nil || !strings.Contains(err.Error(), "before [DONE]") {
		t.Fatalf("truncated stream: err %v", err)
	}
	_, err = readStream(strings.NewReader("data: {\"error\":{\"message\":\"oom\"}}\n\n"), time.Now())
	if err == nil || !strings.Contains(err.Error(), "oom") {
		t.Fatalf("error event: err %v", err)
	}
}

func TestLiveMultiTurnSendsEveryTurn(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs)
	defer srv.Close()
	w := NewMultiTurn(2)
	w.Think, w.OutMin, w.OutMax = time.Millisecond, 2, 4
	// One conversation at a time: the request limit is exactly the turns of the first five.
	want, prompt := 0, int64(0)
	for k := 0; k < 5; k++ {
		s, _ := w.Session(k)
		want += len(s.Turns)
		for _, tr := range s.Turns {
			prompt += int64(len(strings.Fields(tr.Text())))
		}
	}
	sched, err := NewSchedule(w, Arrivals{Concurrency: 1}, Limits{Requests: want}, 1)
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunLive(context.Background(), LiveConfig{Target: srv.URL, Model: "fake-model"}, sched, "mt")
	if err != nil {
		t.Fatal(err)
	}
	if got := fs.requests.Load(); got != int64(want) || res.Summary.OK != want {
		t.Fatalf("server saw %d requests, summary %d ok; want every turn of five conversations, %d", got, res.Summary.OK, want)
	}
	if res.Summary.PromptTokens != prompt {
		t.Fatalf("prompt tokens %d, want %d: each turn must resend the whole history", res.Summary.PromptTokens, prompt)
	}
}

func TestLiveSpreadsOverTargets(t *testing.T) {
	a, b := &fakeServer{}, &fakeServer{}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	sched, _ := NewSchedule(NewSharedPrefix(1), Arrivals{Concurrency: 2}, Limits{Requests: 10}, 1)
	res, err := RunLive(context.Background(), LiveConfig{Target: sa.URL + "," + sb.URL + "/"}, sched, "two")
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.OK != 10 || a.requests.Load() != 5 || b.requests.Load() != 5 {
		t.Fatalf("ok %d, targets got %d and %d, want 5 each", res.Summary.OK, a.requests.Load(), b.requests.Load())
	}
	if _, err := RunLive(context.Background(), LiveConfig{Target: sa.URL + ",ftp://x"}, sched, "x"); err == nil || !strings.Contains(err.Error(), "ftp://x") {
		t.Fatalf("bad second target: err %v", err)
	}
}
