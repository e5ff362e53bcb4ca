package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
)

var syncTestKey = []byte("gateway-sync-test-key-0123456789")

// syncedPlanes starts two embedded replica sync planes clustered on loopback.
func syncedPlanes(t *testing.T) (*replicasync.Plane, *replicasync.Plane) {
	t.Helper()
	cfg := replicasync.PlaneConfig{Node: replicasync.Config{Heartbeat: 100 * time.Millisecond}}
	a, err := replicasync.Start(context.Background(), replicasync.Options{Spec: "embedded", Listen: "127.0.0.1:0", Key: syncTestKey}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := replicasync.Start(context.Background(), replicasync.Options{Spec: "embedded", Listen: "127.0.0.1:0",
		Peers: []string{"nats://" + a.ClusterAddr().String()}, Key: syncTestKey}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	testutil.Until(t, func() bool { return a.Node().Peers() == 1 && b.Node().Peers() == 1 }, "the replicas to hear each other")
	return a, b
}

// TestResponsesFollowTheirWorkerThroughAnyReplica: two gateway replicas in front of the same two
// kvgate sim engines, sharing their response ids over an embedded sync plane. Every follow-up
// turn, whichever replica it reaches, goes to the engine that holds the turn it follows: 10 of
// 10 (without sharing, a follow-up through the replica that did not see the previous turn is
// routed round-robin and half of them get 404 previous_response_not_found).
func TestResponsesFollowTheirWorkerThroughAnyReplica(t *testing.T) {
	pa, pb := syncedPlanes(t)
	ga := newTestGateway(t, Config{Sync: pa.Node()}, "round_robin")
	gb := newTestGateway(t, Config{Sync: pb.Node()}, "round_robin")
	for range 2 {
		s := sim.NewServer(sim.Config{Model: "m", Engine: engine.Config{DecodeBase: time.Millisecond, PrefillTPS: 1e6}})
		ts := httptest.NewServer(s)
		t.Cleanup(func() { ts.Close(); s.Close() })
		for _, g := range []*testGateway{ga, gb} {
			g.mustRegister(t, AddWorkerRequest{URL: ts.URL})
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	clients := [2]*testGateway{ga, gb}
	planes := [2]*replicasync.Plane{pa, pb}
	ok := 0
	for conv := range 10 {
		// A conversation's first turn through one replica, its follow-up through the other.
		first, second := conv%2, 1-conv%2
		ca, cb := sdkClient(clients[first], ""), sdkClient(clients[second], "")
		r, err := ca.Responses.New(ctx, turn("a first question, number "+string(rune('a'+conv)), ""))
		if err != nil {
			t.Fatal(err)
		}
		// The binding crosses the bus in well under a millisecond; a client reads its answer
		// before it sends the next turn, which this wait stands for.
		testutil.Until(t, func() bool { _, ok := planes[second].Node().Affinity(replicasync.NSResponse, r.ID); return ok },
			"the response id to reach the other replica")
		if _, err := cb.Responses.New(ctx, turn("and then?", r.ID)); err != nil {
			t.Errorf("conversation %d: the follow-up through the other replica: %v", conv, err)
			continue
		}
		ok++
	}
	if ok != 10 {
		t.Errorf("%d of 10 follow-ups through the other replica reached their worker", ok)
	}
}

// TestGetLoadsSplitsS: with replica sync, /get_loads shows each worker's S split into this
// replica's part and its peers'.
func TestGetLoadsSplitsS(t *testing.T) {
	pa, _ := syncedPlanes(t)
	g, _ := simGateway(t, "cache_aware_hash", 1)
	g.cfg.Sync = pa.Node()
	rec := httptest.NewRecorder()
	g.handleGetLoads(rec, httptest.NewRequest(http.MethodGet, "/get_loads", nil))
	var body struct {
		Sent []sentSplit `json:"sent_since_report"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if len(body.Sent) != 1 {
		t.Fatalf("/get_loads sent_since_report = %s, want one row", rec.Body.String())
	}
}
