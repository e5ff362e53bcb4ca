package gateway

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kvgate/kvgate/internal/netaddr"
)

// hostRules are the hosts workers may be registered at (Config.AllowedWorkerHosts): networks
// (10.0.0.0/8, or one address), exact host names, and name suffixes (".svc.cluster.local"). A
// host name is matched as written and never resolved here: the rules say which names the operator
// trusts, and the operator's DNS says where they point.
type hostRules struct {
	nets     []netip.Prefix
	names    map[string]bool
	suffixes []string
}

func parseHostRules(entries []string) (hostRules, error) {
	h := hostRules{names: map[string]bool{}}
	for _, e := range entries {
		e = strings.ToLower(strings.TrimSpace(e))
		switch {
		case e == "":
			continue
		case strings.Contains(e, "/"):
			p, ok := netaddr.Prefix(e)
			if !ok {
				return h, fmt.Errorf("allowed worker hosts: %q is not a CIDR", e)
			}
			h.nets = append(h.nets, p)
		case isIP(e):
			p, _ := netaddr.Prefix(strings.Trim(e, "[]"))
			h.nets = append(h.nets, p)
		case strings.HasPrefix(e, "*."):
			h.suffixes = append(h.suffixes, e[1:])
		case strings.HasPrefix(e, "."):
			h.suffixes = append(h.suffixes, e)
		case strings.ContainsAny(e, ":@ "):
			return h, fmt.Errorf("allowed worker hosts: %q is neither a CIDR nor a host name", e)
		default:
			h.names[netaddr.Name(e)] = true
		}
	}
	return h, nil
}

func isIP(s string) bool {
	_, ok := netaddr.Prefix(strings.Trim(s, "[]"))
	return ok
}

// anyHost reports whether no rule was given: every host is allowed.
func (h hostRules) anyHost() bool {
	return len(h.nets) == 0 && len(h.names) == 0 && len(h.suffixes) == 0
}

// allows reports whether a worker at host (a URL's Hostname()) may be registered.
func (h hostRules) allows(host string) bool {
	if h.anyHost() {
		return true
	}
	// An address in any spelling (127.1, 0x0a000001, ::ffff:10.0.0.1) is matched as the
	// address it is, never as a name.
	if a, ok := netaddr.Addr(host); ok {
		a = a.WithZone("")
		for _, p := range h.nets {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	host = netaddr.Name(host)
	if h.names[host] {
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}
