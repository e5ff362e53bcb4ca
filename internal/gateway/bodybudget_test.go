package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// Defect: request bodies were bounded only by a worker's own limit (256 MiB each by default, and
// none in all): 8 concurrent 100 MB bodies took the gateway to 1.7 GB. With a budget for every
// body held, 8 concurrent bodies of 3 MiB against a budget of 8 MiB: those that fit are served,
// the others wait briefly and get 503 with Retry-After; none is lost, the bytes held never pass
// the budget, and they are all given back once the requests end.
//
// It runs in a synctest bubble on testutil.MemNet: a refusal comes exactly the budget's wait
// after the request, and the bytes are given back by the time every goroutine is idle.
func TestBodyBudgetBoundsBodiesHeld(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const (
			budget = 8 << 20
			size   = 3 << 20
			users  = 8
			wait   = 100 * time.Millisecond
		)
		f := newFakeWorkerOn(t, mn, "m")
		release := make(chan struct{})
		var peak int64
		var mu sync.Mutex
		var g *testGateway
		f.setHandler(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			used, _ := g.bodies.memory.held()
			mu.Lock()
			peak = max(peak, used)
			mu.Unlock()
			<-release
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","choices":[]}`)
		})
		cfg := Config{MaxPayloadSize: 4 << 20, BodyBudget: BodyBudget{Bytes: budget, Wait: wait}}
		g = newTestGatewayOn(t, mn, cfg, "round_robin", f)
		prompt := strings.Repeat("x", size-100)
		type answer struct {
			status     int
			retryAfter string
			err        error
		}
		answers := make(chan answer, users)
		start := time.Now()
		for range users {
			go func() {
				body := fmt.Sprintf(`{"model":"m","prompt":%q}`, prompt)
				req, _ := http.NewRequest(http.MethodPost, g.srv.URL+"/v1/completions", bytes.NewReader([]byte(body)))
				req.ContentLength = int64(len(body))
				resp, err := g.client.Do(req)
				if err != nil {
					answers <- answer{err: err}
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answers <- answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
			}()
		}
		// The refused answer at the end of the wait while the served ones are held at the worker.
		refused := 0
		for refused < users-budget/size {
			a := testutil.Recv(t, answers, fmt.Sprintf("a refusal (%d so far)", refused))
			if a.err != nil || a.status != http.StatusServiceUnavailable || a.retryAfter == "" {
				t.Fatalf("while the budget is full: %+v, want 503 with Retry-After", a)
			}
			if took := time.Since(start); took != wait {
				t.Errorf("a refusal after %v, want the budget's wait %v", took, wait)
			}
			refused++
		}
		close(release)
		for range users - refused {
			a := <-answers
			if a.err != nil || a.status != http.StatusOK {
				t.Errorf("a request within the budget: %+v", a)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if peak > budget || peak == 0 {
			t.Errorf("peak bytes held %d, want within the budget %d", peak, budget)
		}
		g.waitDone(t, users)
		synctest.Wait()
		if used, n := g.bodies.memory.held(); used != 0 || n != int64(refused) {
			t.Errorf("%d bytes still held, %d refusals counted; want 0 and %d", used, n, refused)
		}
		if m := scrape(t, g); !strings.Contains(m, "kvgate_request_body_budget_refused_total "+fmt.Sprint(refused)) {
			t.Errorf("the metrics lack the %d refused", refused)
		}
	})
}
