package replicasync

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/nats-io/nats.go"
)

var testKey = []byte("0123456789abcdef-test-key")

// startEmbedded starts an embedded plane on a loopback cluster port, routed to peers.
func startTestPlane(t *testing.T, peers ...string) *Plane {
	t.Helper()
	p, err := Start(context.Background(), Options{Spec: ModeEmbedded, Listen: "127.0.0.1:0", Peers: peers, Key: testKey},
		PlaneConfig{Node: Config{PeerTimeout: 500 * time.Millisecond, Heartbeat: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func clusterURL(p *Plane) string { return "nats://" + p.ClusterAddr().String() }

func waitPeers(t *testing.T, want int, ps ...*Plane) {
	t.Helper()
	testutil.Until(t, func() bool {
		for _, p := range ps {
			if p.Node().Peers() != want {
				return false
			}
		}
		return true
	}, "every replica to hear its peers")
}

// TestEmbeddedClusterSharesDecisions: two replicas, each with its in-process NATS server
// clustered with the other's on loopback, see each other's decisions, and a decision reaches the
// peer within 10 ms (p99).
func TestEmbeddedClusterSharesDecisions(t *testing.T) {
	base := runtime.NumGoroutine()
	a := startTestPlane(t)
	b := startTestPlane(t, clusterURL(a))
	waitPeers(t, 1, a, b)

	// The baseline: a bare NATS message over the same route, measured in the same run, one
	// after each decision (this machine's scheduling, not the plane, sets the absolute figure).
	raw := make(chan struct{}, 1)
	rawSub, err := b.nc.Subscribe("kvgate.test.raw", func(*nats.Msg) { raw <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer rawSub.Unsubscribe()
	_ = b.nc.Flush()
	// The subscription's interest crosses the route asynchronously: publish until one arrives.
	testutil.Until(t, func() bool {
		_ = a.nc.Publish("kvgate.test.raw", []byte("x"))
		select {
		case <-raw:
			return true
		case <-time.After(10 * time.Millisecond):
			return false
		}
	}, "the bare subscription to reach the other server")
	for len(raw) > 0 {
		<-raw
	}
	got := make(chan struct{}, 1024)
	b.node.mu.Lock()
	b.node.applied = func() { got <- struct{}{} }
	b.node.mu.Unlock()
	const n = 200
	lat, bare := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	since := time.Now().Add(-time.Second)
	for i := range n {
		start := time.Now()
		a.Node().Decided("m", "w1", "a prompt", "", 10)
		for {
			testutil.Recv(t, got, "the decision at the peer")
			if tok, _ := b.Node().SentSince("w1", since); tok >= float64(10*(i+1)) {
				break // (a heartbeat may come first)
			}
		}
		lat = append(lat, time.Since(start))
		start = time.Now()
		if err := a.nc.Publish("kvgate.test.raw", []byte("x")); err != nil {
			t.Fatal(err)
		}
		testutil.Recv(t, raw, "the bare message")
		bare = append(bare, time.Since(start))
	}
	slices.Sort(lat)
	slices.Sort(bare)
	p99, b99 := lat[n*99/100], bare[n*99/100]
	t.Logf("decision propagation on loopback: p50 %v, p99 %v; a bare NATS message: p50 %v, p99 %v", lat[n/2], p99, bare[n/2], b99)
	if p99 > 10*time.Millisecond && p99 > 2*b99+2*time.Millisecond {
		t.Errorf("decision propagation p99 %v: target 10 ms, or within twice a bare message's %v", p99, b99)
	}
	if got := b.Node().Stats().Gaps.Load(); got != 0 {
		t.Errorf("%d batches lost on loopback", got)
	}
	a.Node().Bound(NSResponse, "resp_1", "m", "w9")
	testutil.Until(t, func() bool { w, ok := b.Node().Affinity(NSResponse, "resp_1"); return ok && w == "w9" }, "the binding to reach the peer")

	b.Close()
	a.Close()
	testutil.Until(t, func() bool { return runtime.NumGoroutine() <= base }, "every goroutine of the planes to exit")
}

// TestReplicaKilledAndRestarted: a peer that dies stops counting (its silence makes the survivor
// route on estimates again), and its successor is heard and shares again, losing nothing sent
// after it joined.
func TestReplicaKilledAndRestarted(t *testing.T) {
	base := runtime.NumGoroutine()
	a := startTestPlane(t)
	b := startTestPlane(t, clusterURL(a))
	waitPeers(t, 1, a, b)
	if !a.Node().Active() {
		t.Fatal("a is not active with a live peer")
	}
	b.Close() // killed
	testutil.Until(t, func() bool { return a.Node().Peers() == 0 }, "the dead peer to stop counting")
	if a.Node().Active() {
		t.Error("a still reads peers' views with every peer gone: it must route on estimates")
	}
	c := startTestPlane(t, clusterURL(a)) // restarted, on a new port
	waitPeers(t, 1, a, c)
	if !a.Node().Active() {
		t.Error("a does not read its peers again after one returned")
	}
	since := time.Now()
	for range 50 {
		c.Node().Decided("m", "w2", "", "", 1)
	}
	testutil.Until(t, func() bool { tok, _ := a.Node().SentSince("w2", since.Add(-time.Second)); return tok == 50 }, "every decision after the restart")
	c.Close()
	a.Close()
	testutil.Until(t, func() bool { return runtime.NumGoroutine() <= base }, "every goroutine of the planes to exit")
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		ok   bool
	}{
		{"off", Options{Spec: "off"}, true},
		{"embedded loopback without a key", Options{Spec: "embedded", Listen: "127.0.0.1:6222"}, true},
		{"embedded beyond loopback without a key", Options{Spec: "embedded", Listen: "0.0.0.0:6222"}, false},
		{"embedded beyond loopback with a key", Options{Spec: "embedded", Listen: "0.0.0.0:6222", Key: testKey}, true},
		{"embedded with a short key", Options{Spec: "embedded", Listen: "0.0.0.0:6222", Key: []byte("short")}, false},
		{"embedded without listen", Options{Spec: "embedded"}, false},
		{"urls", Options{Spec: "nats://10.0.0.1:4222,tls://nats.example:4222"}, true},
		{"credentials in the url", Options{Spec: "nats://u:p@10.0.0.1:4222"}, false},
		{"another scheme", Options{Spec: "http://10.0.0.1:4222"}, false},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
