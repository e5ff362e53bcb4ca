package kvevents

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/netaddr"
)

// lookupTimeout bounds one host-name lookup; reresolve is how often names are looked up again.
const (
	lookupTimeout = 2 * time.Second
	reresolve     = time.Minute
)

// supervise runs the sweep until Close.
func (s *Service) supervise() {
	every := min(s.cfg.Resync, s.cfg.SilentAfter) / 4
	tick := time.NewTicker(min(max(every, 100*time.Millisecond), 5*time.Second))
	defer tick.Stop()
	lastResolve := s.cfg.Now()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		s.sweep()
		if now := s.cfg.Now(); now.Sub(lastResolve) >= reresolve {
			lastResolve = now
			s.refreshNames()
		}
	}
}

// sweep drops the streams whose publisher has been gone for Resync, and warns, once per worker,
// of a worker that has had no event stream for SilentAfter since it was tracked.
func (s *Service) sweep() {
	now := s.cfg.Now()
	s.ingest.Lock()
	defer s.ingest.Unlock()
	s.mu.Lock()
	var gone []Source
	has := map[string]bool{}
	for src, st := range s.streams {
		if !st.leftAt.IsZero() && !now.Before(st.leftAt.Add(s.cfg.Resync)) {
			gone = append(gone, src)
			delete(s.streams, src)
			continue
		}
		has[src.Worker] = true
	}
	for _, src := range gone {
		if !has[src.Worker] {
			has[src.Worker] = true // log once per worker
			s.cfg.Logger.Warn("kv events: worker's publisher did not come back: its cache picture is dropped and "+
				"the prefix tree routes its requests until its events return", "worker", src.Worker, "after", s.cfg.Resync)
		}
	}
	for _, t := range s.workers {
		if t.silent || t.heard || now.Sub(t.since) < s.cfg.SilentAfter {
			continue
		}
		t.silent = true
		var where string
		switch {
		case t.endpoint != "":
			where = "its publisher " + t.endpoint
		case s.BindAddr != "":
			where = "this gateway's --kv-events-bind " + s.BindAddr
		default:
			// Nothing was meant to send this worker's events (no --kv-events-bind,
			// --kv-events-port or label): routing on the tree is what was configured.
			continue
		}
		s.cfg.Logger.Warn("kv events: no events from a worker since it was registered: its requests route on the prefix tree "+
			"(fallback_no_events); check that its engine publishes to "+where+" with topic kv@"+t.hostPort+"@<model>",
			"worker", t.id, "after", s.cfg.SilentAfter)
	}
	s.mu.Unlock()
	for _, src := range gone {
		s.idx.Drop(src)
	}
}

// refreshNames looks the allow-list's and the workers' host names up again.
func (s *Service) refreshNames() {
	if s.bind != nil {
		if err := s.refreshAllowed(); err != nil {
			s.warnOnceLocked("allowed hosts", "kv events: --kv-events-allowed-hosts: a name did not resolve; keeping the last list", "err", err)
		}
	}
	s.mu.Lock()
	var names []*tracked
	for _, t := range s.workers {
		if !t.resolvedAt.IsZero() {
			names = append(names, t)
		}
	}
	s.mu.Unlock()
	for _, t := range names {
		s.resolve(t)
	}
}

// resolve looks up the addresses of t's host name.
func (s *Service) resolve(t *tracked) {
	ctx, cancel := context.WithTimeout(s.ctx, lookupTimeout)
	defer cancel()
	addrs, err := s.cfg.Lookup(ctx, t.host)
	s.mu.Lock()
	defer s.mu.Unlock()
	t.resolvedAt = s.cfg.Now()
	if err != nil {
		s.warnOnce("resolve "+t.id, "kv events: a worker's host name did not resolve; only publishers its "+PublisherLabel+
			" label allows may publish for it", "worker", t.id)
		return
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	t.addrs = addrs
}

// refreshAllowed rebuilds who may connect to the bound socket from Config.AllowedHosts:
// loopback only when it is empty.
func (s *Service) refreshAllowed() error {
	if len(s.cfg.AllowedHosts) == 0 {
		p := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
		s.allow.Store(&p)
		return nil
	}
	var out []netip.Prefix
	for _, h := range s.cfg.AllowedHosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if p, err := parsePrefix(h); err == nil {
			out = append(out, p)
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, lookupTimeout)
		addrs, err := s.cfg.Lookup(ctx, h)
		cancel()
		if err != nil || len(addrs) == 0 {
			return fmt.Errorf("%q is neither an address, a CIDR nor a host name that resolves", h)
		}
		for _, a := range addrs {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	s.allow.Store(&out)
	return nil
}

// allowed reports whether a connection from a may reach the bound socket.
func (s *Service) allowed(a netip.Addr) bool {
	for _, p := range *s.allow.Load() {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parsePrefix parses an address (a prefix of its full length) or a CIDR.
func parsePrefix(v string) (netip.Prefix, error) {
	// One parser for every allow-list: 10.1, 0x0a000001 and ::ffff:10.0.0.1 are the address
	// they spell.
	p, ok := netaddr.Prefix(v)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or a CIDR", v)
	}
	return p, nil
}

// parsePrefixes parses a comma-separated list of addresses and CIDRs.
func parsePrefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		p, err := parsePrefix(v)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// maxWarned bounds the one-off warnings remembered; past it they may repeat.
const maxWarned = 4096

// warnOnce logs msg the first time key is seen. Callers hold mu.
func (s *Service) warnOnce(key, msg string, args ...any) {
	if s.warned[key] {
		return
	}
	if len(s.warned) >= maxWarned {
		clear(s.warned)
	}
	s.warned[key] = true
	s.cfg.Logger.Warn(msg, args...)
}

// warnOnceLocked is warnOnce for callers that do not hold mu.
func (s *Service) warnOnceLocked(key, msg string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.warnOnce(key, msg, args...)
}
