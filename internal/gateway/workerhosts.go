package gateway

import (
	"fmt"
	"net/netip"
	"strings"
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
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return h, fmt.Errorf("allowed worker hosts: %q is not a CIDR", e)
			}
			h.nets = append(h.nets, p.Masked())
		case isIP(e):
			a, _ := netip.ParseAddr(strings.Trim(e, "[]"))
			h.nets = append(h.nets, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		case strings.HasPrefix(e, "*."):
			h.suffixes = append(h.suffixes, e[1:])
		case strings.HasPrefix(e, "."):
			h.suffixes = append(h.suffixes, e)
		case strings.ContainsAny(e, ":@ "):
			return h, fmt.Errorf("allowed worker hosts: %q is neither a CIDR nor a host name", e)
		default:
			h.names[e] = true
		}
	}
	return h, nil
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(strings.Trim(s, "[]"))
	return err == nil
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
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		for _, p := range h.nets {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
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
