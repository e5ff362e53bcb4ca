package gateway

import (
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/worker"
)

// ReplicaSync is what the gateway shares with its peer replicas over the replica sync plane
// (replicasync.Node implements it): every answer's end, the response id → worker table of the
// Responses API, and the peers' part of S for /get_loads. Config.Sync nil shares nothing.
type ReplicaSync interface {
	// Finished tells the peers a request this replica sent worker ended.
	Finished(model, worker, reqID string)
	// Bound tells the peers that key of namespace ns is held by worker.
	Bound(ns byte, key, model, worker string)
	// Affinity returns the worker a peer bound key to.
	Affinity(ns byte, key string) (worker string, ok bool)
	// SentSince returns what peers sent worker since t.
	SentSince(worker string, t time.Time) (tokens, requests float64)
}

var _ ReplicaSync = (*replicasync.Node)(nil)

// finishedOn tells the peers a request this replica sent w ended (no-op without sync).
func (s *Server) finishedOn(model string, w *worker.Worker, id string) {
	if s.cfg.Sync != nil && w != nil {
		s.cfg.Sync.Finished(model, w.ID, id)
	}
}

// rememberResponse records that workerID answered response id, here and at every peer.
func (s *Server) rememberResponse(id, workerID string) {
	s.responses.remember(id, workerID)
	if s.cfg.Sync != nil && id != "" {
		s.cfg.Sync.Bound(replicasync.NSResponse, id, "", workerID)
	}
}

// responseWorker returns the worker that answered response id: this replica's table, else the
// one a peer shared.
func (s *Server) responseWorker(id string) (string, bool) {
	if w, ok := s.responses.lookup(id); ok {
		return w, true
	}
	if s.cfg.Sync != nil && id != "" {
		return s.cfg.Sync.Affinity(replicasync.NSResponse, id)
	}
	return "", false
}

// sentSplit is one worker's S since its report, split into this replica's and its peers'.
type sentSplit struct {
	ID string `json:"id"`
	// OwnTokens is what this replica sent since the report (before any replica scaling).
	OwnTokens float64 `json:"own_tokens"`
	// PeerTokens and PeerRequests are what peers sent since the report, as received here.
	PeerTokens   float64 `json:"peer_tokens"`
	PeerRequests float64 `json:"peer_requests"`
}

// sentSplits returns every worker's S split, for /get_loads; nil without sync.
func (s *Server) sentSplits(rows []loadmon.WorkerLoad) []sentSplit {
	if s.cfg.Sync == nil {
		return nil
	}
	var owners []interface{ OwnSent(string) float64 }
	for _, p := range s.router.Policies() {
		if o, ok := policy.As[interface{ OwnSent(string) float64 }](p.Policy); ok {
			owners = append(owners, o)
		}
	}
	out := make([]sentSplit, 0, len(rows))
	for _, r := range rows {
		sp := sentSplit{ID: r.ID}
		for _, o := range owners {
			sp.OwnTokens += o.OwnSent(r.ID)
		}
		if r.Entry != nil {
			sp.PeerTokens, sp.PeerRequests = s.cfg.Sync.SentSince(r.ID, r.Entry.Report.PolledAt)
		}
		out = append(out, sp)
	}
	return out
}

// writeLoads writes /get_loads: the rows, and with replica sync each worker's S split.
func (s *Server) writeLoads(w http.ResponseWriter, monitor bool, rows []loadmon.WorkerLoad) {
	body := map[string]any{"load_monitor": monitor, "workers": rows}
	if sp := s.sentSplits(rows); sp != nil {
		body["sent_since_report"] = sp
	}
	writeJSON(w, http.StatusOK, body)
}
