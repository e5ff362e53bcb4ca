package proxy

import (
	"net/http"
	"strings"
)

// HopHeader is the header in which each kvgate lists the gateways a request crossed (see
// Config.HopID).
const HopHeader = "X-Kvgate-Hop"

// setCredentials decides what reaches the worker of an upstream request h, whose client headers
// are already copied: the client's Authorization (a key for this gateway, not for the worker) is
// removed unless forwarded on purpose; the worker's own key, when it has one, is sent instead;
// and this gateway's hop id is appended so that a request coming back to it is recognised.
func (f *Forwarder) setCredentials(h http.Header, workerKey string) {
	if !f.cfg.ForwardClientAuth {
		h.Del("Authorization")
	}
	if workerKey != "" {
		h.Set("Authorization", "Bearer "+workerKey)
	}
	if f.cfg.HopID != "" {
		if prior := h.Values(HopHeader); len(prior) > 0 {
			h.Set(HopHeader, strings.Join(prior, ", ")+", "+f.cfg.HopID)
		} else {
			h.Set(HopHeader, f.cfg.HopID)
		}
	}
}
