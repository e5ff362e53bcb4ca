package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// simWorkers starts n simulated engines serving model m and a gateway over them.
func simGateway(t *testing.T, policyName string, n int) (*testGateway, []*httptest.Server) {
	t.Helper()
	g := newTestGateway(t, Config{}, policyName)
	var srvs []*httptest.Server
	for range n {
		s := sim.NewServer(sim.Config{Model: "m", Engine: engine.Config{DecodeBase: time.Millisecond, PrefillTPS: 1e6}})
		ts := httptest.NewServer(s)
		t.Cleanup(func() { ts.Close(); s.Close() })
		g.mustRegister(t, AddWorkerRequest{URL: ts.URL})
		srvs = append(srvs, ts)
	}
	return g, srvs
}

// responsesRig starts n simulated engines behind a round_robin gateway and returns it, an SDK
// client of it, and a context that bounds the test's calls by timeout.
func responsesRig(t *testing.T, n int, timeout time.Duration) (*testGateway, openai.Client, context.Context) {
	t.Helper()
	g, _ := simGateway(t, "round_robin", n)
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return g, sdkClient(g, ""), ctx
}

// newTurn sends a Responses turn (a first one when previous is ""), failing the test on an error.
func newTurn(t *testing.T, ctx context.Context, client openai.Client, input, previous string) *responses.Response {
	t.Helper()
	r, err := client.Responses.New(ctx, turn(input, previous))
	if err != nil {
		t.Fatalf("turn %q: %v", input, err)
	}
	return r
}

func turn(input, previous string) responses.ResponseNewParams {
	p := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)},
		MaxOutputTokens: openai.Int(4)}
	if previous != "" {
		p.PreviousResponseID = openai.String(previous)
	}
	return p
}

// The official SDK's Responses calls work through the gateway, streaming too, and every
// follow-up turn reaches the worker that answered the turn before. round_robin would send every
// other turn to the other engine, which does not hold the conversation and answers 404.
func TestResponsesFollowTheirWorker(t *testing.T) {
	g, client, ctx := responsesRig(t, 2, 20*time.Second)
	r := newTurn(t, ctx, client, "a first question about the sea", "")
	for range 6 {
		r = newTurn(t, ctx, client, "and then?", r.ID)
	}
	rs := testutil.ReadResponseStream(t, client.Responses.NewStreaming(ctx, turn("stream the next one", r.ID)))
	done := rs.Done
	if done.ID == "" || done.OutputText() != rs.Text {
		t.Fatalf("streamed turn: completed %q, deltas %q", done.OutputText(), rs.Text)
	}
	// The streamed response's id was remembered from its first event.
	if _, err := client.Responses.New(ctx, turn("after the stream", done.ID)); err != nil {
		t.Fatalf("the turn after a streamed one: %v", err)
	}
	if n := g.responses.len(); n != 9 {
		t.Errorf("%d response ids remembered, want 9", n)
	}
}

// When the worker that holds the conversation is not available, the follow-up is routed by the
// policy like any request (here to the other engine, which answers 404 for the unknown id: the
// client learns it must start over, instead of a 503 while a worker is free).
func TestResponsesFallBackWhenTheirWorkerIsGone(t *testing.T) {
	g, client, ctx := responsesRig(t, 2, 20*time.Second)
	r := newTurn(t, ctx, client, "hello", "")
	id, ok := g.responses.lookup(r.ID)
	if !ok {
		t.Fatal("the response id was not remembered")
	}
	g.reg.View().Get(id).SetHealth(worker.NotReady)
	_, err := client.Responses.New(ctx, turn("again", r.ID))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("follow-up with its worker down: %v, want the other engine's 404", err)
	}
}

func TestResponseAffinityBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newResponseAffinity(ResponsesConfig{MaxEntries: 3, TTL: time.Minute}, func() time.Time { return now })
	for _, id := range []string{"a", "b", "c"} {
		a.remember(id, "w-"+id)
	}
	if w, ok := a.lookup("a"); !ok || w != "w-a" { // a is now the most recently used
		t.Fatalf("lookup a: %q %v", w, ok)
	}
	a.remember("d", "w-d") // evicts b, the least recently used
	if _, ok := a.lookup("b"); ok {
		t.Error("b survived past the entry bound")
	}
	if a.len() != 3 {
		t.Errorf("%d entries, want 3", a.len())
	}
	now = now.Add(time.Minute)
	if _, ok := a.lookup("a"); ok {
		t.Error("a survived its TTL")
	}
	a.remember("e", "w-e") // drops the expired entries at the back
	if a.len() != 1 {
		t.Errorf("%d entries after expiry, want 1 (e)", a.len())
	}
	a.remember("e", "w-hostile") // another worker claiming e's id does not take it over
	if w, _ := a.lookup("e"); w != "w-e" {
		t.Errorf("e moved to %q", w)
	}
	off := newResponseAffinity(ResponsesConfig{MaxEntries: -1}, time.Now)
	off.remember("x", "w")
	if _, ok := off.lookup("x"); ok || off.len() != 0 {
		t.Error("a memory turned off remembered")
	}
}

func TestResponseID(t *testing.T) {
	cases := []struct{ name, head, want string }{
		{"body", `{"id":"resp_1","object":"response","output":[{"id":"msg_1"}]}`, "resp_1"},
		{"body, id late", `{"object":"response","output":[{"id":"msg_1","content":[{"id":"x"}]}],"id":"resp_2"}`, "resp_2"},
		{"body cut after the id", `{"id":"resp_3","instructions":"` + strings.Repeat("x", 100), "resp_3"},
		{"stream", "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_4\",\"output\":[]}}\n\n", "resp_4"},
		{"stream, data only", "data: {\"type\":\"response.created\",\"response\":{\"object\":\"response\",\"id\":\"resp_5\"}}\n\n", "resp_5"},
		{"stream, nested id first", "data: {\"item\":{\"id\":\"msg\"},\"response\":{\"id\":\"resp_6\"}}\n", "resp_6"},
		{"not a string", `{"id":7}`, ""},
		{"too long", `{"id":"` + strings.Repeat("r", responseIDMax+1) + `"}`, ""},
		{"control byte", `{"id":"a\u0001b"}`, ""},
		{"no id", `{"object":"response"}`, ""},
		{"garbage", `<html>`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := responseID([]byte(c.head)); got != c.want {
				t.Fatalf("responseID = %q, want %q", got, c.want)
			}
		})
	}
}

// FuzzResponseID: any answer head gives a bounded printable id or none, without panicking.
func FuzzResponseID(f *testing.F) {
	f.Add([]byte(`{"id":"resp_1"}`))
	f.Add([]byte("event: x\ndata: {\"response\":{\"id\":\"r\"}}\n\n"))
	f.Add([]byte(`{"a":[{"id":"x"}],"id":"y"}`))
	f.Fuzz(func(t *testing.T, head []byte) {
		if id := responseID(head); id != "" && (len(id) > responseIDMax || !printable(id)) {
			t.Fatalf("responseID gave %q", id)
		}
	})
}

// BenchmarkResponseAffinity: remembering a response id and looking one up, at a full table, and
// the heap one entry holds (B/entry, with ids of 40 bytes, vLLM's length, and 128, the cap).
//
//	go test -run XXX -bench ResponseAffinity -benchmem ./internal/gateway/
func BenchmarkResponseAffinity(b *testing.B) {
	for _, idLen := range []int{40, responseIDMax} {
		b.Run(fmt.Sprintf("id%d", idLen), func(b *testing.B) {
			const n = 65536
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ids := make([]string, n) // the ids' bytes are counted, as a worker's answers bring them
			for i := range ids {
				ids[i] = fmt.Sprintf("resp_%0*d", idLen-5, i)
			}
			a := newResponseAffinity(ResponsesConfig{MaxEntries: n}, time.Now)
			for _, id := range ids {
				a.remember(id, "0123456789ab")
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perEntry := float64(after.HeapAlloc-before.HeapAlloc) / n
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				id := ids[i%n]
				a.remember(id, "0123456789ab")
				if _, ok := a.lookup(id); !ok {
					b.Fatal("lost")
				}
				i++
			}
			b.ReportMetric(perEntry, "B/entry")
			runtime.KeepAlive(ids)
			runtime.KeepAlive(a)
		})
	}
}
