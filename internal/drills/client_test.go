package drills

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// outcome is what one client request saw.
type outcome struct {
	stream bool
	status int
	// ok: a complete answer (a completion with choices, or a stream ending in [DONE] without an
	// error event).
	ok bool
	// clear: a clear error instead: an OpenAI-shaped error body, or an SSE error event followed
	// by [DONE].
	clear   bool
	message string // the error message, when clear
	err     error  // transport error or malformed answer: neither ok nor clear
	events  int    // SSE data events before the end
}

func (o outcome) String() string {
	switch {
	case o.ok:
		return fmt.Sprintf("ok %d", o.status)
	case o.clear:
		return fmt.Sprintf("clear error %d: %s", o.status, o.message)
	}
	return fmt.Sprintf("BAD %d: %v", o.status, o.err)
}

// chatBody is a chat completion asking for maxTokens tokens; i makes prompts differ.
func chatBody(i, maxTokens int, stream bool) string {
	return fmt.Sprintf(`{"model":"kvgate-sim","stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"drill request %d: tell me something"}]}`, stream, maxTokens, i)
}

// do sends one chat completion and classifies the answer. started, when not nil, is called once
// the first SSE event has arrived.
func (r *rig) do(ctx context.Context, body string, stream bool, started func()) outcome {
	return doChat(ctx, r.client, r.api.URL, body, stream, started)
}

func doChat(ctx context.Context, c *http.Client, base, body string, stream bool, started func()) outcome {
	o := outcome{stream: stream}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			o.err = fmt.Errorf("reading the body: %w", err)
			return o
		}
		classifyJSON(&o, raw)
		return o
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			o.err = fmt.Errorf("%w after %d events: %v", errCut, o.events, err)
			o.ok, o.clear = false, false
			return o
		}
		data, isData := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: ")
		if !isData {
			continue
		}
		if data == "[DONE]" {
			o.ok = !o.clear
			return o
		}
		o.events++
		if o.events == 1 && started != nil {
			started()
		}
		if msg, isErr := errorMessage([]byte(data)); isErr {
			o.clear, o.message = true, msg
		}
	}
}

// classifyJSON sorts a whole (non-SSE) answer into ok, clear or bad.
func classifyJSON(o *outcome, raw []byte) {
	if o.status == http.StatusOK {
		var c struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal(raw, &c); err == nil && len(c.Choices) > 0 {
			o.ok = true
			return
		}
		o.err = fmt.Errorf("200 without choices: %.200s", raw)
		return
	}
	if msg, ok := errorMessage(raw); ok {
		o.clear, o.message = true, msg
		return
	}
	o.err = fmt.Errorf("error without the OpenAI shape: %.200s", raw)
}

// errorMessage reports whether raw is an OpenAI error object with a message, type and code.
func errorMessage(raw []byte) (string, bool) {
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == nil {
		return "", false
	}
	return e.Error.Message, true
}

// tally counts outcomes.
type tally struct {
	mu       sync.Mutex
	all      []outcome
	requests int
	ok       int
	clear    int
	bad      int
}

func (t *tally) add(o outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all = append(t.all, o)
	t.requests++
	switch {
	case o.ok:
		t.ok++
	case o.clear:
		t.clear++
	default:
		t.bad++
	}
}

// failed is how many requests did not succeed.
func (t *tally) failed() int { return t.requests - t.ok }

// wantAllOK fails tb unless every request succeeded, naming the first failures; what names the
// requests ("requests", "completions").
func (t *tally) wantAllOK(tb testing.TB, what string) {
	tb.Helper()
	if t.ok != t.requests {
		tb.Errorf("%d of %d %s failed: %v", t.failed(), t.requests, what, t.failures(5))
	}
}

// failures returns the outcomes that were not ok, for messages.
func (t *tally) failures(max int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, o := range t.all {
		if !o.ok && len(out) < max {
			out = append(out, o.String())
		}
	}
	return out
}

// loader keeps conc non-streaming requests going until stop is called.
type loader struct {
	tally
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// load starts conc clients, each sending short completions back to back (maxTokens tokens each)
// until stop; every request runs to its end.
func (r *rig) load(conc, maxTokens int) *loader {
	l := &loader{}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for c := 0; c < conc; c++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				// Each request gets its own context: stopping the loader never cancels one.
				l.add(r.do(context.Background(), chatBody(c*100000+i, maxTokens, false), false, nil))
			}
		}()
	}
	return l
}

// stop ends the loader once every running request has finished, and returns the tally.
func (l *loader) stop() *tally {
	l.cancel()
	l.wg.Wait()
	return &l.tally
}

// sleepUntil pauses the drill's script (not a wait for a condition: the load runs meanwhile).
func sleepUntil(d time.Duration) { time.Sleep(d) }
