package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LiveConfig configures the live driver.
type LiveConfig struct {
	// Target is the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:30000, or
	// several comma-separated URLs (gateway replicas without a load balancer in front), which
	// requests take in turn. Required.
	Target string
	// Model is the model id sent; "" means the first model listed by GET /v1/models.
	Model string
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// API is "chat" (POST /v1/chat/completions, the default when "") or "completions".
	API string
	// Timeout bounds each request. Zero means 5 minutes.
	Timeout time.Duration
	// MaxInflight caps the requests in flight under an open loop; when it is reached the client,
	// not the server, is the bottleneck, and the report says so. Zero means 2048.
	MaxInflight int
	// IgnoreEOS adds "ignore_eos": true so that SGLang/vLLM servers generate exactly max_tokens.
	IgnoreEOS bool
	// SessionHeader sends each session's key as x-session-id.
	SessionHeader bool
	// Progress, when set, receives a progress bar, redrawn every ProgressEvery (zero: 500 ms).
	Progress      io.Writer
	ProgressEvery time.Duration
	// Client is the HTTP client; nil means one sized for MaxInflight.
	Client *http.Client
	// Timeline, when positive, windows the run by send time (Summary.Timeline).
	Timeline time.Duration
	// Failover changes the gateway's workers during the run through its admin API at Admin
	// (bearer AdminKey); the summary then analyses the timeline around each change.
	Failover []Change
	Admin    string
	AdminKey string
}

func (c LiveConfig) withDefaults() (LiveConfig, error) {
	var targets []string
	for _, t := range strings.Split(c.Target, ",") {
		u, err := url.Parse(strings.TrimSpace(t))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, fmt.Errorf("target %q must be an http(s) URL with a host", t)
		}
		targets = append(targets, strings.TrimRight(strings.TrimSpace(t), "/"))
	}
	c.Target = strings.Join(targets, ",")
	switch c.API {
	case "":
		c.API = "chat"
	case "chat", "completions":
	default:
		return c, fmt.Errorf("api %q must be chat or completions", c.API)
	}
	if c.Timeout < 0 || c.MaxInflight < 0 || c.ProgressEvery < 0 {
		return c, errors.New("timeout, max in-flight and progress interval must be >= 0")
	}
	c.Timeout = cmp.Or(c.Timeout, 5*time.Minute)
	c.MaxInflight = cmp.Or(c.MaxInflight, 2048)
	c.ProgressEvery = cmp.Or(c.ProgressEvery, 500*time.Millisecond)
	if c.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = c.MaxInflight
		tr.MaxIdleConnsPerHost = c.MaxInflight
		tr.DisableCompression = true
		c.Client = &http.Client{Transport: tr}
	}
	return c, nil
}

// LiveResult is the outcome of a live run.
type LiveResult struct {
	Summary Summary
	// Warnings say when the figures are suspect, in particular when the client was the bottleneck.
	Warnings []string
}

// live is one run of the driver.
type live struct {
	cfg     LiveConfig
	targets []string
	next    atomic.Uint64 // round-robin index into targets
	sched   *Schedule
	start   time.Time

	mu       sync.Mutex // guards sched, coll, lags, blocked, inflight
	coll     Collector
	lags     []time.Duration
	blocked  int
	inflight int
}

// RunLive runs sched's workload against cfg.Target and summarizes it under label. It returns when
// every started request finished or ctx is done (requests in flight are then cancelled and
// counted as errors).
func RunLive(ctx context.Context, cfg LiveConfig, sched *Schedule, label string) (LiveResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return LiveResult{}, err
	}
	targets := strings.Split(cfg.Target, ",")
	if cfg.Model == "" {
		if cfg.Model, err = FirstModel(ctx, cfg.Client, targets[0], cfg.APIKey); err != nil {
			return LiveResult{}, err
		}
	}
	l := &live{cfg: cfg, targets: targets, sched: sched, start: time.Now()}
	l.coll.Warmup = sched.Limits().Warmup
	if cfg.Timeline > 0 {
		l.coll.Timeline = &Timeline{Bucket: cfg.Timeline}
	}
	var changes <-chan []appliedChange
	cctx, stopChanges := context.WithCancel(ctx)
	defer stopChanges()
	if len(cfg.Failover) > 0 {
		if cfg.Admin == "" {
			return LiveResult{}, errors.New("a live failover run needs the gateway's admin URL")
		}
		changes = runChanges(cctx, cfg, l.start)
	}
	stopProgress := l.progress()
	if sched.Arrivals().Closed() {
		l.closedLoop(ctx)
	} else {
		l.openLoop(ctx)
	}
	stopProgress()
	res := LiveResult{Summary: l.coll.Summarize(label)}
	res.Summary.Arrivals = sched.Arrivals().String()
	res.Warnings = l.warnings()
	if changes != nil {
		stopChanges()
		rec, warn := liveRecoveries(res.Summary.Timeline, <-changes, l.coll.Warmup)
		res.Summary.Recoveries = rec
		res.Warnings = append(res.Warnings, warn...)
	}
	return res, nil
}

// openLoop starts sessions at their scheduled offsets, each in its own goroutine, and waits for
// all of them.
func (l *live) openLoop(ctx context.Context) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, l.cfg.MaxInflight)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		l.mu.Lock()
		sess, at, ok := l.sched.NextSession()
		l.mu.Unlock()
		if !ok {
			break
		}
		if d := time.Until(l.start.Add(at)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-timer.C:
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			l.mu.Lock()
			l.blocked++
			l.mu.Unlock()
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return
			}
		}
		lag := time.Since(l.start) - at
		l.mu.Lock()
		l.lags = append(l.lags, lag)
		l.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			l.runSession(ctx, sess)
		}()
	}
	wg.Wait()
}

// closedLoop keeps Concurrency sessions in progress until the schedule is exhausted.
func (l *live) closedLoop(ctx context.Context) {
	var wg sync.WaitGroup
	for i := 0; i < l.sched.Arrivals().Concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l.mu.Lock()
				done := l.sched.Done(time.Since(l.start))
				sess, _, ok := l.sched.NextSession()
				l.mu.Unlock()
				if done || !ok {
					return
				}
				l.runSession(ctx, sess)
			}
		}()
	}
	wg.Wait()
}

// runSession sends the session's turns in order, waiting each turn's think time.
func (l *live) runSession(ctx context.Context, sess Session) {
	var think *time.Timer
	defer func() {
		if think != nil {
			think.Stop()
		}
	}()
	for i := range sess.Turns {
		t := &sess.Turns[i]
		if t.Think > 0 {
			l.mu.Lock()
			late := l.sched.Done(time.Since(l.start) + t.Think)
			l.mu.Unlock()
			if late {
				return // the turn would come after the run's bounds: do not wait for it
			}
			// Think time is modelled user behaviour, not waiting for an event.
			if think == nil {
				think = time.NewTimer(t.Think)
			} else {
				think.Reset(t.Think)
			}
			select {
			case <-ctx.Done():
				return
			case <-think.C:
			}
		}
		l.mu.Lock()
		sent := time.Since(l.start)
		ok := l.sched.Admit(sent)
		if ok {
			l.inflight++
		}
		l.mu.Unlock()
		if !ok {
			return
		}
		rec := l.do(ctx, sess.Key, t)
		rec.Sent = sent
		l.mu.Lock()
		l.inflight--
		l.coll.Add(rec)
		l.mu.Unlock()
		if rec.Err != "" {
			return // a failed turn ends the conversation: its history is incomplete
		}
	}
}

// body builds the request body of turn t.
func (l *live) body(t *Turn) ([]byte, string) {
	req := map[string]any{
		"model":          l.cfg.Model,
		"max_tokens":     max(t.OutputTokens, 1),
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"temperature":    0,
	}
	if t.Model != "" {
		req["model"] = t.Model
	}
	if l.cfg.IgnoreEOS {
		req["ignore_eos"] = true
	}
	path := "/v1/chat/completions"
	if l.cfg.API == "completions" {
		path = "/v1/completions"
		req["prompt"] = t.Text()
	} else {
		req["messages"] = t.Messages
	}
	b, _ := json.Marshal(req) // maps of strings and ints always marshal
	return b, path
}

// do sends one streaming request and measures it.
func (l *live) do(ctx context.Context, key string, t *Turn) Record {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	body, path := l.body(t)
	target := l.targets[(l.next.Add(1)-1)%uint64(len(l.targets))]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+path, bytes.NewReader(body))
	if err != nil {
		return Record{Err: "request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if l.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+l.cfg.APIKey)
	}
	if l.cfg.SessionHeader && key != "" {
		req.Header.Set("X-Session-Id", key)
	}
	start := time.Now()
	resp, err := l.cfg.Client.Do(req)
	if err != nil {
		return Record{Err: classify(ctx, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return Record{Err: fmt.Sprintf("http %d: %s", resp.StatusCode, shortError(msg))}
	}
	rec, err := readStream(resp.Body, start)
	if err != nil {
		rec.Err = classify(ctx, err)
	}
	auditHeaders(&rec, resp.Header)
	// Read what follows [DONE] (usually nothing but the end of the chunked body) so that the
	// connection goes back to the pool instead of being closed.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return rec
}

// readStream consumes one SSE response and measures it from start.
func readStream(body io.Reader, start time.Time) (Record, error) {
	var rec Record
	sse := NewSSEReader(body)
	var first, last time.Time
	chunks := 0
	var usage *Usage
	for {
		data, err := sse.Next()
		if err == io.EOF {
			return rec, errors.New("stream ended before [DONE]")
		}
		if err != nil {
			return rec, err
		}
		now := time.Now()
		c, err := ParseChunk(data)
		if err != nil {
			return rec, err
		}
		if c.Err != "" {
			return rec, fmt.Errorf("in-stream error: %s", c.Err)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		if c.Content != "" {
			if chunks == 0 {
				first = now
			}
			last = now
			chunks++
		}
		if c.Done {
			break
		}
	}
	rec.E2E = time.Since(start)
	if chunks == 0 {
		return rec, errors.New("no content in the stream")
	}
	rec.TTFT = first.Sub(start)
	rec.OutputTokens = chunks
	if usage != nil {
		rec.PromptTokens, rec.CachedTokens = usage.PromptTokens, usage.Cached()
		if usage.CompletionTokens > 0 {
			rec.OutputTokens = usage.CompletionTokens
		}
	}
	if n := max(rec.OutputTokens, chunks); n > 1 {
		rec.ITL = last.Sub(first) / time.Duration(n-1)
	}
	return rec, nil
}

// classify reduces an error to a short, countable message.
func classify(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(ctx.Err(), context.Canceled):
		return "cancelled"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return "connect: " + op.Err.Error()
	}
	return err.Error()
}

// shortError extracts an OpenAI error message from a response body, or a trimmed prefix of it.
func shortError(body []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		return errorMessage(e.Error)
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// FirstModel returns the first model id listed by target's GET /v1/models.
func FirstModel(ctx context.Context, c *http.Client, target, apiKey string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(target, "/")+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("listing models at %s: %w (pass --model to skip)", target, err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("listing models at %s: http %d (pass --model to skip)", target, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", fmt.Errorf("listing models at %s: no model in the answer (pass --model)", target)
	}
	return list.Data[0].ID, nil
}

// warnings reports what makes the figures suspect.
func (l *live) warnings() []string {
	var out []string
	if l.blocked > 0 {
		out = append(out, fmt.Sprintf("the client was the bottleneck: %d session starts waited for one of the %d in-flight slots (raise --max-inflight)", l.blocked, l.cfg.MaxInflight))
	}
	if len(l.lags) > 0 {
		slices.Sort(l.lags)
		p99 := l.lags[min(len(l.lags)-1, len(l.lags)*99/100)]
		if p99 > 20*time.Millisecond {
			out = append(out, fmt.Sprintf("the client was the bottleneck: p99 lag behind the arrival schedule was %v (the offered rate was not sent on time)", p99.Round(time.Millisecond)))
		}
	}
	s := l.coll.Summarize("")
	if n := s.OK + s.Errors; n > 0 && s.Errors*10 > n {
		out = append(out, fmt.Sprintf("%d of %d requests failed", s.Errors, n))
	}
	if s.OK > 0 && s.PromptTokens == 0 {
		out = append(out, "the server reported no usage: hit rate is unknown (does it honour stream_options.include_usage?)")
	}
	return out
}

// progress draws a progress bar until the returned stop is called; stop waits for the drawing
// goroutine to exit.
func (l *live) progress() (stop func()) {
	if l.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(l.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				l.drawProgress(true)
				return
			case <-t.C:
				l.drawProgress(false)
			}
		}
	}()
	return func() { close(done); <-exited }
}

// drawProgress redraws the bar: progress against the nearer bound (time or requests).
func (l *live) drawProgress(final bool) {
	el := time.Since(l.start)
	l.mu.Lock()
	sent, inflight, lim := l.sched.Sent(), l.inflight, l.sched.Limits()
	ok, errs := l.coll.ok, l.coll.errs
	l.mu.Unlock()
	frac := 0.0
	if lim.Duration > 0 {
		frac = el.Seconds() / lim.Duration.Seconds()
	}
	if lim.Requests > 0 {
		frac = max(frac, float64(sent)/float64(lim.Requests))
	}
	frac = min(frac, 1)
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("=", n) + strings.Repeat(" ", width-n)
	rate := 0.0
	if el > 0 {
		rate = float64(ok+errs) / el.Seconds()
	}
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(l.cfg.Progress, "\r[%s] %3.0f%% sent %d  done %d  err %d  in flight %d  %.1f req/s  %s%s",
		bar, frac*100, sent, ok+errs, errs, inflight, rate, el.Round(time.Second), end)
}
