package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestFlowLiveQueue2000 queues 2,000 requests at once in front of two simulated engines on
// loopback ports (the engine model `kvgate sim` serves), with one in ten clients leaving while
// queued: every other request is answered 200, none is lost, the queue's memory stays bounded
// (entries, bytes, and a live heap of 48 KiB a request), every counter returns to zero and no
// goroutine is left.
func TestFlowLiveQueue2000(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 requests")
	}
	// The heap bound is per request in flight, client and gateway sides together (they share
	// this process): each holds the server's connection buffers, the request, the client's
	// connection and transport state; the queue's own entries are ~100 bytes. Measured: 32–38
	// KiB a request on the live heap (2026-12-06); the bound is 48 KiB.
	const n, heapBound = 2000, 2000 * 48 << 10
	var urls []string
	for range 2 {
		e := sim.NewServer(sim.Config{Model: "m", Engine: engine.Config{MaxRunning: 8, DecodeBase: time.Millisecond}})
		srv := httptest.NewServer(e)
		t.Cleanup(func() { srv.Close(); e.Close() })
		urls = append(urls, srv.URL)
	}
	reg := worker.NewRegistry()
	mon := loadmon.New(reg, loadmon.Config{Interval: 20 * time.Millisecond})
	pcfg := policy.DefaultConfig()
	pcfg.Loads = mon
	router := newRouter(t, "cache_aware_hash", pcfg)
	fc := FlowConfig{Config: flow.Config{Enabled: true, MaxRequests: 4096, Timeout: time.Minute,
		Saturation: flow.Saturation{DefaultSlots: 8, MaxWaiting: -1}}}
	s := New(Config{Logger: slog.New(slog.DiscardHandler), Flow: fc}, reg, router, mon)
	for _, u := range urls {
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: u}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	mon.Start(ctx)
	s.Start(ctx)
	gw := httptest.NewServer(s.Handler())
	// The clients share the process, and so the heap, with the gateway: small buffers keep their
	// share of it small.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, ReadBufferSize: 512, WriteBufferSize: 512}}
	baseline := runtime.NumGoroutine()

	var (
		queued, peakHeap, peakLen, peakBytes atomic.Int64
		cancelOnce                           sync.Once
		cancels                              []context.CancelFunc
		mu                                   sync.Mutex
	)
	cancelAll := make(chan struct{})
	s.flow.onQueued = func() {
		q := queued.Add(1)
		if q%250 == 0 {
			// The live heap: a collection first, so that garbage awaiting the next cycle (which
			// depends on when the collector last ran, not on what the queue holds) is not counted.
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peakHeap.Store(max(peakHeap.Load(), int64(ms.HeapAlloc)))
			s.flow.mu.Lock()
			mf := s.flow.models["m"]
			peakLen.Store(max(peakLen.Load(), int64(mf.q.Len())))
			peakBytes.Store(max(peakBytes.Load(), mf.q.Bytes()))
			s.flow.mu.Unlock()
		}
		if q == n/2 {
			cancelOnce.Do(func() { close(cancelAll) })
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	var ok, failedKept, leftQueued atomic.Int64
	var failures []string // the first few kept requests' failures, for the message
	failed := func(what string) {
		failedKept.Add(1)
		mu.Lock()
		if len(failures) < 5 {
			failures = append(failures, what)
		}
		mu.Unlock()
	}
	for i := range n {
		rctx, cancel := context.WithDeadline(context.Background(), deadline)
		leaves := i%10 == 0
		if leaves {
			mu.Lock()
			cancels = append(cancels, cancel)
			mu.Unlock()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"request %d of the live queue test"}]}`, i)
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				if leaves {
					leftQueued.Add(1)
				} else {
					failed(err.Error())
				}
				return
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok.Add(1)
			} else if !leaves {
				failed(fmt.Sprintf("%d %s", resp.StatusCode, b))
			}
		}()
	}
	select {
	case <-cancelAll:
		mu.Lock()
		for _, c := range cancels {
			c()
		}
		mu.Unlock()
	case <-time.After(time.Until(deadline)):
		t.Fatal("the queue never held half the requests")
	}
	wg.Wait()
	if f := failedKept.Load(); f != 0 {
		t.Errorf("%d requests that stayed were not answered 200: %q", f, failures)
	}
	if got := ok.Load() + leftQueued.Load(); got != n {
		t.Errorf("%d answered + %d left = %d, want %d: requests were lost", ok.Load(), leftQueued.Load(), got, n)
	}
	t.Logf("%d answered 200, %d clients left; queued %d times; peak queue %d entries, %d bytes; peak heap %.1f MiB",
		ok.Load(), leftQueued.Load(), queued.Load(), peakLen.Load(), peakBytes.Load(), float64(peakHeap.Load())/(1<<20))
	if queued.Load() < n/2 {
		t.Errorf("only %d requests were queued", queued.Load())
	}
	if h := peakHeap.Load(); h > heapBound && !raceEnabled { // the race detector's allocations are larger
		t.Errorf("peak heap %d bytes, past the %d bound", h, heapBound)
	}
	if peakLen.Load() > int64(fc.MaxRequests) || peakBytes.Load() > fc.Config.WithDefaults().MaxBytes {
		t.Error("the queue passed its bounds")
	}
	gw.Close() // waits for every handler to return
	// A client that left before its request was read never reached the gateway, and one that
	// left as its answer was written may have missed a 200: every other request is counted,
	// each 200 a client saw as a 200.
	total, _ := metricSum(t, s, "kvgate_requests_total", nil)
	served, _ := metricSum(t, s, "kvgate_requests_total", map[string]string{"status": "200"})
	left := float64(leftQueued.Load())
	if served < float64(ok.Load()) || served > float64(ok.Load())+left || total < served || total-served > left {
		t.Errorf("the gateway counted %g requests, %g answered 200; the clients saw %d answered and %d leave", total, served, ok.Load(), leftQueued.Load())
	}
	if v, _ := metricSum(t, s, "kvgate_queue_shed_total", nil); v != 0 {
		t.Errorf("%g requests shed", v)
	}
	settled(t, &testGateway{Server: s})
	s.Stop()
	stop()
	mon.Stop()
	client.CloseIdleConnections()
	s.client.CloseIdleConnections()
	// Nothing can signal that a goroutine has exited: look, bounded in time.
	testutil.Until(t, func() bool { return runtime.NumGoroutine() <= baseline }, "the load's goroutines to exit")
}
