package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/worker"
)

// tokenize calls POST /tokenize.
func tokenize(t *testing.T, url, body string) []uint32 {
	t.Helper()
	res, err := http.Post(url+"/tokenize", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	if res.StatusCode != 200 || json.NewDecoder(res.Body).Decode(&out) != nil || out.Count != len(out.Tokens) || out.MaxModelLen == 0 {
		t.Fatalf("/tokenize %s: status %d, %+v", body, res.StatusCode, out)
	}
	return out.Tokens
}

func TestTokenizeMatchesTheEngine(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	text := strings.Repeat("hello world ", 20)
	want := engine.Tokenize(text)
	got := tokenize(t, ts.URL, `{"model":"`+DefaultModel+`","prompt":"`+text+`"}`)
	if !equalTokens(got, want) {
		t.Fatalf("prompt tokens differ from the engine's")
	}
	half := len(text) / 2
	chat := tokenize(t, ts.URL, `{"messages":[{"role":"system","content":"`+text[:half]+`"},{"role":"user","content":[{"type":"text","text":"`+text[half:]+`"}]}]}`)
	if !equalTokens(chat, want) {
		t.Fatalf("chat tokens differ from the prompt's")
	}
	res, _ := http.Post(ts.URL+"/tokenize", "application/json", strings.NewReader(`{"model":"nope","prompt":"x"}`))
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: status %d", res.StatusCode)
	}
	res.Body.Close()
}

func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A fleet publishing to a gateway-side Service: after a request, the index holds its prompt's
// blocks (keyed from /tokenize's tokens); after an eviction, it no longer does.
func TestFleetPublishesStoresAndEvictions(t *testing.T) {
	handled := make(chan struct{}, 4096)
	svc, err := kvevents.New(kvevents.Config{Bind: "tcp://127.0.0.1:0", AfterMessage: func() { handled <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	cfg := fastConfig()
	cfg.Engine.KVTokens = 64 * 16 // 64 blocks: a few prompts evict each other
	cfg.MaxTokens = 2
	cfg.Events = Events{Dial: []string{"tcp://" + svc.BindAddr}}
	fleet, err := StartFleet(t.Context(), 1, "127.0.0.1", 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	w, _ := worker.New(worker.Spec{URL: fleet.URLs()[0]}, worker.BreakerConfig{})
	svc.Track(w)
	if err := fleet.Servers()[0].WaitEventSubscribers(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	url := fleet.URLs()[0]
	prompt := func(seed string) string { return strings.Repeat(seed, 400) } // 400 tokens: 25 blocks
	holds := func(p string) int {
		out := []int{0}
		toks := tokenize(t, url, `{"prompt":"`+p+`"}`)
		if !svc.Index().Match(DefaultModel, toks, []string{w.ID}, out, time.Now()) {
			return -1
		}
		return out[0]
	}
	complete := func(p string) {
		body := `{"prompt":"` + p + `","max_tokens":2}`
		res, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	// Wait until the index reflects what the engine holds (events are asynchronous).
	settle := func(p string, want func(int) bool) int {
		for {
			if n := holds(p); want(n) {
				return n
			}
			select {
			case <-handled:
			case <-time.After(10 * time.Second):
				t.Fatalf("the index never settled for %.8q… (holds %d)", p, holds(p))
			}
		}
	}
	a := prompt("aaaa")
	complete(a)
	if n := settle(a, func(n int) bool { return n >= 24*16 }); n != 24*16 && n != 25*16 {
		t.Fatalf("after serving a: the index holds %d tokens of it", n)
	}
	// Three more 25-block prompts overflow 64 blocks: a, the least recently used, is evicted.
	for _, s := range []string{"bbbb", "cccc", "dddd"} {
		complete(prompt(s))
	}
	settle(a, func(n int) bool { return n == 0 })
	if st := svc.Stats(); st.Gaps != 0 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
}
