package drills

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDrillFlowTwoTenants is flow control's fairness, live: two `kvgate sim` engines of 4 slots,
// a quiet tenant sending one streamed request at a time and a noisy one keeping 48 in flight.
// On arrival every request goes to an engine at once and the quiet tenant's requests wait behind
// the noisy ones' in the engines' own queues; with --queue the gateway holds the excess and
// gives each freed slot to the tenants in fair share, so a quiet request waits for about one
// slot to free. The yardstick is the quiet tenant's time to first token when the noisy tenant
// sends only as many requests as the fleet has slots, with no queue: the drill reports the
// quiet tenant's p90 with the queue over that (issue target 1.15), with and without the two
// tenants configured, and fails if the queue does not beat dispatch on arrival. A last run
// holds nothing waiting at the engines (--queue-max-engine-waiting -1), which also hides their
// running batch from the gateway: it learns a batch's size from a report with requests waiting.
func TestDrillFlowTwoTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	const (
		slots      = 4
		maxTokens  = 64 // about 0.5 s a request: a slot of the 8 frees every ~60 ms
		quietReqs  = 30
		quietFor   = 6 * time.Second // a bound on the quiet loop besides its count
		minSamples = 10
	)
	checkGoroutines(t)
	bin := buildKvgate(t)
	var urls []string
	for i := range 2 {
		urls = append(urls, startSim(t, bin, i+1, "--max-running", fmt.Sprint(slots)).url)
	}
	quietSent := 0
	run := func(t *testing.T, noisy int, flags ...string) time.Duration {
		k := runKvgate(t, bin, append([]string{"--worker-urls", strings.Join(urls, ","), "--tenant-header", "X-Tenant"}, flags...)...)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}
		defer client.CloseIdleConnections()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var noisyErr error
		var errMu sync.Mutex
		started := make(chan struct{}, noisy)
		for c := range noisy {
			wg.Go(func() {
				for i := 0; i < 1000 && ctx.Err() == nil; i++ {
					_, err := firstToken(ctx, client, k.base, "noisy", chatBody(c*10000+i, maxTokens, true))
					if i == 0 {
						started <- struct{}{}
					}
					if err != nil && ctx.Err() == nil {
						errMu.Lock()
						noisyErr = err
						errMu.Unlock()
					}
				}
			})
		}
		for range noisy { // every noisy client has had an answer: the fleet is full
			<-started
		}
		var ttfts []time.Duration
		deadline := time.Now().Add(quietFor)
		for i := 0; i < quietReqs && (time.Now().Before(deadline) || len(ttfts) < minSamples); i++ {
			d, err := firstToken(context.Background(), client, k.base, "quiet", chatBody(900000+i, maxTokens, true))
			if err != nil {
				t.Fatalf("quiet request %d: %v", i, err)
			}
			ttfts = append(ttfts, d)
		}
		cancel()
		wg.Wait()
		if noisyErr != nil {
			t.Errorf("a noisy request failed: %v", noisyErr)
		}
		quietSent += len(ttfts)
		slices.Sort(ttfts)
		return ttfts[(len(ttfts)*9+9)/10-1]
	}
	var base, arrival, queued, tenants, strict time.Duration
	t.Run("yardstick", func(t *testing.T) { base = run(t, 2*slots) })
	t.Run("on arrival", func(t *testing.T) { arrival = run(t, 48) })
	t.Run("queue", func(t *testing.T) { queued = run(t, 48, "--queue") })
	t.Run("queue, tenants", func(t *testing.T) {
		tenants = run(t, 48, "--queue", "--tenant", "quiet", "--tenant", "noisy")
	})
	t.Run("queue, no engine waiting", func(t *testing.T) {
		strict = run(t, 48, "--queue", "--queue-max-engine-waiting", "-1")
	})
	if base == 0 || t.Failed() {
		return
	}
	if queued >= arrival || tenants >= arrival {
		t.Errorf("the queue did not protect the quiet tenant: p90 %v with it (%v with tenants) against %v on arrival", queued, tenants, arrival)
	}
	ratio := func(d time.Duration) string { return fmt.Sprintf("%.2f×", float64(d)/float64(base)) }
	report(row{drill: "flow control, two tenants (2 `kvgate sim` engines × 4 slots; quiet sequential, noisy 48 in flight)", requests: quietSent,
		note: fmt.Sprintf("quiet TTFT p90 ÷ its p90 beside 8 noisy with no queue (%v): on arrival %s, --queue %s, --queue with both tenants configured %s, --queue --queue-max-engine-waiting -1 %s",
			base.Round(time.Millisecond), ratio(arrival), ratio(queued), ratio(tenants), ratio(strict))})
}

// firstToken sends one streamed chat completion as tenant and returns the time to its first
// data event; it reads the stream to its end.
func firstToken(ctx context.Context, c *http.Client, base, tenant, body string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", tenant)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	var first time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if first == 0 && strings.HasPrefix(line, "data: ") {
			first = time.Since(start)
		}
		if line == "data: [DONE]" {
			return first, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("the stream ended without [DONE]")
}
