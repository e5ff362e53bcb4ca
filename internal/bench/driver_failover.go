package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The live driver's side of a failover schedule (failover.go): applying each Change through the
// gateway's admin API at its time, and judging the timeline around what was done.

// adminWorker is what the failover driver reads of GET /workers.
type adminWorker struct {
	ID       string `json:"id"`
	URL      string `json:"url"`
	Draining bool   `json:"draining"`
	// AuditID is how the gateway's audit headers name the worker (set while they are on).
	AuditID string `json:"audit_id"`
}

// admin calls the gateway's admin API for live failover runs.
type admin struct {
	base, key string
	client    *http.Client
}

func (a *admin) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body) // a map of strings
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	if a.key != "" {
		req.Header.Set("Authorization", "Bearer "+a.key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: http %d: %s", method, path, resp.StatusCode, shortError(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// apply makes change c and returns the id of the worker removed or added.
func (a *admin) apply(ctx context.Context, c Change) (string, error) {
	if !c.Remove {
		if c.Arg == "" {
			return "", fmt.Errorf("%v: a live run must name the URL to add (add:URL@TIME)", c)
		}
		var w adminWorker
		if err := a.do(ctx, http.MethodPost, "/workers", map[string]string{"url": c.Arg}, &w); err != nil {
			return "", err
		}
		if w.AuditID != "" {
			return w.AuditID, nil // the name the records' x-kvgate-worker carries
		}
		return w.ID, nil
	}
	var list struct {
		Workers []adminWorker `json:"workers"`
	}
	if err := a.do(ctx, http.MethodGet, "/workers", nil, &list); err != nil {
		return "", err
	}
	ws := slices.DeleteFunc(list.Workers, func(w adminWorker) bool { return w.Draining })
	slices.SortFunc(ws, func(x, y adminWorker) int { return strings.Compare(x.URL, y.URL) })
	var pick *adminWorker
	if n, err := strconv.Atoi(c.Arg); c.Arg == "" || err == nil {
		if n < len(ws) {
			pick = &ws[n]
		}
	} else {
		for i := range ws {
			if strings.TrimRight(ws[i].URL, "/") == strings.TrimRight(c.Arg, "/") {
				pick = &ws[i]
			}
		}
	}
	if pick == nil {
		return "", fmt.Errorf("%v: no such worker among %d", c, len(ws))
	}
	return pick.ID, a.do(ctx, http.MethodDelete, "/workers/"+pick.ID, nil, nil)
}

// appliedChange is a change the live driver made, and what came of it.
type appliedChange struct {
	c      Change
	at     time.Duration
	worker string
	err    error
}

// runChanges applies cfg.Failover at their offsets from start until ctx ends, and returns what
// was done on the channel when it exits.
func runChanges(ctx context.Context, cfg LiveConfig, start time.Time) <-chan []appliedChange {
	out := make(chan []appliedChange, 1)
	a := &admin{base: strings.TrimRight(cfg.Admin, "/"), key: cfg.AdminKey, client: cfg.Client}
	go func() {
		var done []appliedChange
		defer func() { out <- done }()
		t := time.NewTimer(0)
		defer t.Stop()
		<-t.C
		for _, c := range cfg.Failover {
			t.Reset(time.Until(start.Add(c.At)))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			id, err := a.apply(ctx, c)
			done = append(done, appliedChange{c: c, at: time.Since(start), worker: id, err: err})
		}
	}()
	return out
}

// liveRecoveries analyses a live timeline around the changes that were made.
func liveRecoveries(points []TimelinePoint, done []appliedChange, warmup time.Duration) ([]Recovery, []string) {
	var out []Recovery
	var warn []string
	from := warmup.Seconds()
	for i, d := range done {
		if d.err != nil {
			warn = append(warn, fmt.Sprintf("failover %v failed: %v", d.c, d.err))
			continue
		}
		at := d.at.Seconds()
		if from == 0 {
			from = at / 2
		}
		until := 0.0
		if i+1 < len(done) {
			until = done[i+1].at.Seconds()
		}
		name, added := "remove "+d.worker, ""
		if !d.c.Remove {
			name, added = "add "+d.worker, d.worker
		}
		out = append(out, RecoveryAfter(points, nil, name, added, from, at, until, 0.02))
		from = at
	}
	return out, warn
}

// auditHeaders fills the worker and the predicted share from a kvgate gateway's audit headers
// (--audit-headers), when present.
func auditHeaders(rec *Record, h http.Header) {
	rec.Worker = h.Get("X-Kvgate-Worker")
	if v := h.Get("X-Kvgate-Predicted-Hit"); v != "" {
		if p, err := strconv.ParseFloat(v, 64); err == nil && p >= 0 && p <= 1 {
			rec.Predicted, rec.HasPrediction = p, true
		}
	}
}
