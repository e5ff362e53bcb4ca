package drills

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
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
// slot to free. The noisy requests differ in length (noisyTokens), so that slots free one by
// one as real ones do. The engines state their batch (/v1/loads max_running_requests), so the
// gateway holds nothing waiting at them by default; the long run (below) adds a run that lets
// each hold 2 (the default before engines' statements were read), behind which a quiet request
// dispatched later waits.
//
// The yardstick is the quiet tenant's time to first token when the noisy tenant sends only as
// many requests as the fleet has slots, with no queue: the drill reports the quiet tenant's p90
// with the queue over that (issue target 1.15), with and without the two tenants configured,
// and fails if the queue does not beat dispatch on arrival. A quiet request takes about 0.5 s,
// so the few samples a CI run takes (tenantsCISamples a row) measure that inequality and not the
// target; KVGATE_TENANTS_SAMPLES=N takes N a row (60 or more measure the p90; about 0.6 s each).
func TestDrillFlowTwoTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	const (
		slots     = 4
		maxTokens = 64 // the quiet tenant's, and the noisy one's on average: about 0.5 s a request, so a slot of the 8 frees every ~60 ms
	)
	samples, long := tenantsSamples(t)
	checkGoroutines(t)
	bin := buildKvgate(t)
	var urls []string
	for i := range 2 {
		urls = append(urls, startSim(t, bin, i+1, "--max-running", fmt.Sprint(slots)).url)
	}
	quietSent := 0
	// run returns the quiet tenant's TTFT p90 over n samples beside noisy streams.
	run := func(t *testing.T, noisy, n int, flags ...string) time.Duration {
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
					_, err := firstToken(ctx, client, k.base, "noisy", chatBody(c*10000+i, noisyTokens(c, i), true))
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
		// A bound besides the count: a sample takes about 0.6 s with the queue, 3 s on arrival.
		deadline := time.Now().Add(time.Duration(n) * 4 * time.Second)
		for i := 0; i < n && time.Now().Before(deadline); i++ {
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
		q := func(p int) time.Duration { return ttfts[(len(ttfts)*p+99)/100-1] }
		t.Logf("quiet TTFT over %d samples: p50 %v, p90 %v, max %v", len(ttfts), q(50).Round(time.Millisecond), q(90).Round(time.Millisecond), q(100).Round(time.Millisecond))
		return q(90)
	}
	var base, arrival, queued, tenants, waiting time.Duration
	t.Run("yardstick", func(t *testing.T) { base = run(t, 2*slots, samples) })
	// On arrival a quiet request waits behind ~40 noisy ones (seconds, where the others wait
	// tens of milliseconds): a few samples tell it apart.
	t.Run("on arrival", func(t *testing.T) { arrival = run(t, 48, arrivalSamples) })
	t.Run("queue", func(t *testing.T) { queued = run(t, 48, samples, "--queue") })
	t.Run("queue, tenants", func(t *testing.T) {
		tenants = run(t, 48, samples, "--queue", "--tenant", "quiet", "--tenant", "noisy")
	})
	if long {
		t.Run("queue, 2 waiting at each engine", func(t *testing.T) {
			waiting = run(t, 48, samples, "--queue", "--queue-max-engine-waiting", "2")
		})
	}
	if base == 0 || t.Failed() {
		return
	}
	if queued >= arrival || tenants >= arrival {
		t.Errorf("the queue did not protect the quiet tenant: p90 %v with it (%v with tenants) against %v on arrival", queued, tenants, arrival)
	}
	ratio := func(d time.Duration) string { return fmt.Sprintf("%.2f×", float64(d)/float64(base)) }
	note := fmt.Sprintf("quiet TTFT p90 (%d samples a run, %d on arrival) ÷ its p90 beside 8 noisy with no queue (%v): on arrival %s, --queue %s, --queue with both tenants configured %s",
		samples, arrivalSamples, base.Round(time.Millisecond), ratio(arrival), ratio(queued), ratio(tenants))
	if long {
		note += fmt.Sprintf(", --queue --queue-max-engine-waiting 2 %s", ratio(waiting))
	}
	t.Log(note)
	report(row{drill: "flow control, two tenants (2 `kvgate sim` engines × 4 slots; quiet sequential, noisy 48 in flight)", requests: quietSent, note: note})
}

// noisyTokens is the output length of noisy client c's request i: 32 to 96 tokens, 64 on
// average, spread over the clients and their requests. Requests of one length that start
// together end together: every slot of the fleet would free in the same millisecond, twice a
// second, and a quiet request that just missed a wave would wait for the next whole one,
// queue or not; real requests differ in length, and their slots free one by one.
func noisyTokens(c, i int) int { return 32 + (c*37+i*11)%65 }

// tenantsCISamples is the quiet tenant's samples a row of TestDrillFlowTwoTenants takes by
// default: enough to tell the queue from dispatch on arrival (several times apart), within a CI
// run's budget.
const tenantsCISamples = 12

// arrivalSamples is the quiet tenant's samples in the run on arrival.
const arrivalSamples = 6

// tenantsSamples returns the quiet tenant's samples a row, from KVGATE_TENANTS_SAMPLES (10 to
// 1000) or tenantsCISamples, and whether the run is the long one that was asked for.
func tenantsSamples(t *testing.T) (n int, long bool) {
	v := os.Getenv("KVGATE_TENANTS_SAMPLES")
	if v == "" {
		return tenantsCISamples, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 10 || n > 1000 {
		t.Fatalf("KVGATE_TENANTS_SAMPLES=%q: want a count of 10 to 1000", v)
	}
	return n, true
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
