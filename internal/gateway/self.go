package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"

	"github.com/kvgate/kvgate/internal/netaddr"
)

// A gateway must never be its own worker: every request sent to it would come straight back.
// Registration (the admin API, the worker flags and service discovery all go through Register)
// refuses a worker URL in two ways:
//
//   - by address: the URL's host resolves to an address one of this gateway's listeners accepts
//     on the URL's port (ListeningOn tells the gateway where it listens). This works before the
//     gateway listens, and costs one DNS lookup per registration.
//   - by answer: the registration probe carries this gateway's hop id (HopHeader), and every
//     listener of the gateway answers a request carrying its own hop id with 508 and the id
//     (refuseLoops). This catches what no address comparison can: a Service IP, a NAT or a
//     proxy that leads back to this process.

// errSelf is a registration probe that reached this gateway itself.
var errSelf = errors.New("the worker URL leads back to this gateway")

// selfAddrs are the addresses this gateway listens on.
type selfAddrs struct {
	mu    sync.Mutex
	addrs []netip.AddrPort
}

// ListeningOn tells the gateway one address ("host:port", as net.Listen took or gave it) of its
// own listeners, so that registration refuses a worker at it. Call it for each plane, before
// listening with the configured address and after with the one the listener got. Safe for
// concurrent use.
func (s *Server) ListeningOn(hostport string) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return
	}
	var addr netip.Addr
	switch h := netaddr.Parse(host); {
	case host == "":
		addr = netip.IPv4Unspecified() // every address
	case h.IP.IsValid():
		addr = h.IP.WithZone("")
	case h.IsLoopback():
		addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	default:
		return
	}
	ap := netip.AddrPortFrom(addr, urlPort(&url.URL{Host: ":" + port}))
	if ap.Port() == 0 {
		return
	}
	s.self.mu.Lock()
	defer s.self.mu.Unlock()
	for _, a := range s.self.addrs {
		if a == ap {
			return
		}
	}
	s.self.addrs = append(s.self.addrs, ap)
}

// pointsAtSelf reports whether u's host, resolved, and port are one of this gateway's listeners.
// A host that does not resolve is not this gateway (the probe then fails on its own).
func (s *Server) pointsAtSelf(ctx context.Context, u *url.URL) bool {
	s.self.mu.Lock()
	own := append([]netip.AddrPort(nil), s.self.addrs...)
	s.self.mu.Unlock()
	if len(own) == 0 {
		return false
	}
	port := urlPort(u)
	var ips []netip.Addr
	switch h := netaddr.Parse(u.Hostname()); {
	case h.IP.IsValid():
		ips = []netip.Addr{h.IP.WithZone("")}
	case h.IsLoopback():
		// Every spelling of "localhost" (case, a trailing dot, a name under it) is loopback
		// whatever a resolver says of it.
		ips = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}
	default:
		ctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		defer cancel()
		ips, _ = net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	}
	var local []netip.Addr // this machine's interface addresses, read when a wildcard listener needs them
	for _, ip := range ips {
		ip = ip.Unmap()
		for _, l := range own {
			if l.Port() != port {
				continue
			}
			if l.Addr() == ip {
				return true
			}
			if !l.Addr().IsUnspecified() {
				continue
			}
			if ip.IsLoopback() || ip.IsUnspecified() {
				return true
			}
			if local == nil {
				local = interfaceAddrs()
			}
			for _, a := range local {
				if a == ip {
					return true
				}
			}
		}
	}
	return false
}

// urlPort is u's port, or its scheme's default.
func urlPort(u *url.URL) uint16 {
	if p := u.Port(); p != "" {
		ap, err := netip.ParseAddrPort("0.0.0.0:" + p)
		if err == nil {
			return ap.Port()
		}
		return 0
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// interfaceAddrs are the addresses of this machine's network interfaces.
func interfaceAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return []netip.Addr{}
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// refuseLoops answers 508 to a request that carries this gateway's own hop id (or crossed too
// many gateways), on every listener: an inference request that came back, or the registration
// probe of a URL that leads here. The answer names the id the request carried, so that the
// probe knows it reached its own gateway; nothing else learns it, since the request held it.
func (s *Server) refuseLoops(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.looped(r) {
			next.ServeHTTP(w, r)
			return
		}
		lvl, msg := slog.LevelWarn, "request loop: a request came back to this gateway; is its own address registered as a worker?"
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			lvl, msg = slog.LevelDebug, "registration probe reached this gateway itself"
		}
		s.log.Log(r.Context(), lvl, msg, "request_id", requestID(r), "path", r.URL.Path,
			"hops", strings.Join(r.Header.Values(HopHeader), ","))
		if s.carriesOwnHop(r) {
			w.Header().Set(HopHeader, s.hopID)
		}
		writeError(w, http.StatusLoopDetected, "loop_detected", "the request looped back to the gateway that sent it")
	})
}

// carriesOwnHop reports whether r's HopHeader holds this gateway's id.
func (s *Server) carriesOwnHop(r *http.Request) bool {
	for _, v := range r.Header.Values(HopHeader) {
		for _, id := range strings.Split(v, ",") {
			if strings.TrimSpace(id) == s.hopID {
				return true
			}
		}
	}
	return false
}

// answeredBySelf reports whether resp is this gateway's answer to its own probe (refuseLoops).
func (s *Server) answeredBySelf(resp *http.Response) bool {
	return resp.StatusCode == http.StatusLoopDetected && resp.Header.Get(HopHeader) == s.hopID
}
