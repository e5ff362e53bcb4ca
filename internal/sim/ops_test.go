package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// slowConfig makes a request last long enough to observe it in flight: 1000 output tokens of
// at least 1 ms each.
func slowConfig() Config {
	cfg := fastConfig()
	cfg.MaxTokens = 1000
	return cfg
}

// streamUntilFirstChunk starts a streaming completion and returns once its first chunk arrived;
// cancel drops the client.
func streamUntilFirstChunk(t *testing.T, url string) (cancel context.CancelFunc, body io.ReadCloser) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"prompt":"`+strings.Repeat("abcd", 300)+`","stream":true}`))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		cancel()
		t.Fatalf("first line %q: %v", line, err)
	}
	return cancel, res.Body
}

func TestLoadsWhileBusy(t *testing.T) {
	s, ts := startServer(t, slowConfig())
	cancel, body := streamUntilFirstChunk(t, ts.URL)
	defer cancel()
	defer body.Close()
	res, err := http.Get(ts.URL + "/v1/loads?include=core")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got loadsBody
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.DPRankCount != 1 || len(got.Loads) != 1 || got.Timestamp == "" {
		t.Fatalf("loads = %+v", got)
	}
	l := got.Loads[0]
	if l.NumRunningReqs != 1 || l.NumTotalReqs != 1 || l.NumUsedTokens < 300 || l.MaxTotalNumTokens != 524288 ||
		l.TokenUsage <= 0 || l.MaxRunningRequests != 256 {
		t.Errorf("rank load = %+v", l)
	}
	if s.Load().Running != 1 {
		t.Error("Server.Load disagrees with /v1/loads")
	}
}

func TestClientDisconnectAbortsAndFreesKV(t *testing.T) {
	s, ts := startServer(t, slowConfig())
	aborted := make(chan uint64, 1)
	s.aborted = aborted
	cancel, body := streamUntilFirstChunk(t, ts.URL)
	cancel()
	body.Close()
	select {
	case <-aborted:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine never heard of the disconnect")
	}
	if l := s.Load(); l.Running != 0 || l.Waiting != 0 || l.UsedTokens != 0 || l.Aborted != 1 {
		t.Errorf("after disconnect: %+v", l)
	}
}

var typeLine = regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`)

func TestMetricsParseWithFlavorNames(t *testing.T) {
	for _, tc := range []struct {
		flavor string
		names  []string
	}{
		{FlavorVLLM, []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
			"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds"}},
		{FlavorSGLang, []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
			"sglang:gen_throughput", "sglang:cache_hit_rate"}},
	} {
		t.Run(tc.flavor, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Flavor = tc.flavor
			_, ts := startServer(t, cfg)
			c := sdk(ts)
			for range 2 {
				if _, err := c.Chat.Completions.New(testCtx(t), chatParams(longPrompt, 3)); err != nil {
					t.Fatal(err)
				}
			}
			res, err := http.Get(ts.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			// promlint parses the text with Prometheus's own parser; a malformed exposition is an error.
			problems, err := promlint.New(strings.NewReader(string(raw))).Lint()
			if err != nil {
				t.Fatalf("not Prometheus text: %v\n%s", err, raw)
			}
			// The real servers' names contain ':', which the linter flags; nothing else may be wrong.
			for _, p := range problems {
				if !strings.Contains(p.Text, "should not contain ':'") {
					t.Errorf("lint: %s: %s", p.Metric, p.Text)
				}
			}
			found := map[string]bool{}
			for _, m := range typeLine.FindAllStringSubmatch(string(raw), -1) {
				found[m[1]] = true
			}
			for _, n := range tc.names {
				if !found[n] {
					t.Errorf("metric %s missing", n)
				}
				if !strings.Contains(string(raw), n+`{model_name="kvgate-sim"`) && !strings.Contains(string(raw), n+`_bucket{model_name="kvgate-sim"`) {
					t.Errorf("metric %s has no model_name label", n)
				}
			}
			if tc.flavor == FlavorVLLM && !strings.Contains(string(raw), `vllm:time_to_first_token_seconds_count{model_name="kvgate-sim"} 2`) {
				t.Errorf("TTFT histogram did not count 2 requests:\n%s", raw)
			}
			if tc.flavor == FlavorSGLang && strings.Contains(string(raw), "sglang:cache_hit_rate{model_name=\"kvgate-sim\"} 0\n") {
				t.Error("cache hit rate is 0 after a repeated prompt")
			}
		})
	}
}

func TestFlushCache(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	c, ctx := sdk(ts), testCtx(t)
	run := func() int64 {
		r, err := c.Chat.Completions.New(ctx, chatParams(longPrompt, 2))
		if err != nil {
			t.Fatal(err)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	run()
	if run() == 0 {
		t.Fatal("repeated prompt missed the cache")
	}
	res := post(t, ts.URL+"/flush_cache", "")
	if res.StatusCode != 200 {
		t.Fatalf("flush status %d", res.StatusCode)
	}
	if got := run(); got != 0 {
		t.Errorf("cached %d tokens after a flush", got)
	}
}

func TestFaults(t *testing.T) {
	t.Run("error status", func(t *testing.T) {
		s, ts := startServer(t, fastConfig())
		s.SetFaults(Faults{ErrorRate: 1, ErrorStatus: 503})
		c := sdk(ts)
		_, err := c.Chat.Completions.New(testCtx(t), chatParams("hi", 1))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
			t.Fatalf("err = %v, want a 503", err)
		}
		s.SetFaults(Faults{})
		if _, err := c.Chat.Completions.New(testCtx(t), chatParams("hi", 1)); err != nil {
			t.Fatalf("after clearing the fault: %v", err)
		}
	})
	t.Run("error rate", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Faults = Faults{ErrorRate: 0.5, ErrorStatus: 500}
		_, ts := startServer(t, cfg)
		fails := 0
		for range 60 {
			res := post(t, ts.URL+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
			io.Copy(io.Discard, res.Body)
			switch res.StatusCode {
			case 500:
				fails++
			case 200:
			default:
				t.Fatalf("status %d", res.StatusCode)
			}
		}
		if fails < 15 || fails > 45 {
			t.Errorf("%d of 60 failed at a 50%% error rate", fails)
		}
	})
	t.Run("hang", func(t *testing.T) {
		s, ts := startServer(t, fastConfig())
		s.SetFaults(Faults{Hang: true})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/health", nil)
		if res, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hung server answered: %v %v", res, err)
		}
	})
	t.Run("die mid-stream", func(t *testing.T) {
		s, ts := startServer(t, fastConfig())
		aborted := make(chan uint64, 1)
		s.aborted = aborted
		s.SetFaults(Faults{DieAfterTokens: 5})
		c := sdk(ts)
		stream := c.Chat.Completions.NewStreaming(testCtx(t), chatParams("hi", 50))
		var content strings.Builder
		for stream.Next() {
			if ch := stream.Current().Choices; len(ch) > 0 {
				content.WriteString(ch[0].Delta.Content)
			}
		}
		if stream.Err() == nil {
			t.Error("a stream cut mid-way ended without error")
		}
		if content.Len() != 5*4 {
			t.Errorf("got %d bytes before the cut, want 5 tokens", content.Len())
		}
		select {
		case <-aborted:
		case <-time.After(10 * time.Second):
			t.Fatal("the dropped request was never aborted")
		}
		if l := s.Load(); l.UsedTokens != 0 {
			t.Errorf("dead request still holds KV: %+v", l)
		}
	})
	t.Run("slow start", func(t *testing.T) {
		s, ts := startServer(t, fastConfig())
		s.SetFaults(Faults{SlowStart: time.Hour})
		for _, path := range []string{"/health", "/v1/models"} {
			res, err := http.Get(ts.URL + path)
			if err != nil || res.StatusCode != 503 {
				t.Fatalf("%s while starting: %v %v", path, res.Status, err)
			}
			res.Body.Close()
		}
		s.SetFaults(Faults{})
		res, err := http.Get(ts.URL + "/health")
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("health after start: %v", err)
		}
		res.Body.Close()
	})
	t.Run("first token delay", func(t *testing.T) {
		s, ts := startServer(t, fastConfig())
		s.SetFaults(Faults{FirstTokenDelay: 200 * time.Millisecond})
		start := time.Now()
		res := post(t, ts.URL+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
		io.Copy(io.Discard, res.Body)
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Errorf("answered in %v despite a 200ms delay", d)
		}
	})
}

func TestFleet(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	f, err := StartFleet(ctx, 3, "", 0, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	urls := f.URLs()
	if len(urls) != 3 || len(f.Servers()) != 3 || urls[0] == urls[1] {
		t.Fatalf("urls = %v", urls)
	}
	get := func(u string) error {
		c := http.Client{Timeout: 5 * time.Second}
		res, err := c.Get(u + "/health")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "http://127.0.0.1:") {
			t.Errorf("url %s is not on loopback", u)
		}
		if err := get(u); err != nil {
			t.Fatal(err)
		}
	}
	f.Kill(1)
	if err := get(urls[1]); err == nil {
		t.Error("killed server still answers")
	}
	if err := get(urls[0]); err != nil {
		t.Errorf("a kill took down its neighbour: %v", err)
	}
	cancel()
	f.Close() // waits for the context's close to finish
	for _, u := range urls {
		if get(u) == nil {
			t.Errorf("%s answers after the fleet's context ended", u)
		}
	}
}

func TestStartFleetErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		port int
		cfg  Config
	}{
		{"no engines", 0, 0, Config{}},
		{"bad flavor", 1, 0, Config{Flavor: "tgi"}},
		{"bad port", 2, 65535, Config{}},
		{"bad fault", 1, 0, Config{Faults: Faults{ErrorRate: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if f, err := StartFleet(t.Context(), tc.n, "127.0.0.1", tc.port, tc.cfg); err == nil {
				f.Close()
				t.Error("no error")
			}
		})
	}
}
