// Package netaddr is the one parser of the hosts kvgate compares against its own addresses and
// its allow-lists: a worker URL's host, a Host header, a list entry. An address may be written
// in many ways that all reach the same place: the dialer of a C library (inet_aton) reads
// "127.1", "2130706433", "0x7f000001" and "0177.0.0.1" as 127.0.0.1, a resolver drops a
// trailing dot, names ignore case, and "::ffff:127.0.0.1" is an IPv4 address in IPv6 form.
// A check that sees only the canonical spelling is sidestepped by any other, so every check
// reads hosts through Addr and Name.
package netaddr

import (
	"net/netip"
	"strconv"
	"strings"
)

// Host is a host in one canonical form: an address (unmapped from IPv4-in-IPv6), or a name in
// lower case without a trailing dot. Exactly one of IP and Name is set for a non-empty host.
type Host struct {
	// IP is the address, when the host is one in any spelling.
	IP netip.Addr
	// Name is the host name, lower case, with no trailing dot, when the host is not an address.
	Name string
}

// Parse reads host (brackets around an IPv6 literal allowed, no port) in its canonical form.
func Parse(host string) Host {
	if a, ok := Addr(host); ok {
		return Host{IP: a}
	}
	return Host{Name: Name(host)}
}

// String is the host as a URL writes it (an IPv6 address in brackets).
func (h Host) String() string {
	if !h.IP.IsValid() {
		return h.Name
	}
	if h.IP.Is6() {
		return "[" + h.IP.String() + "]"
	}
	return h.IP.String()
}

// IsLoopback reports whether h is this machine's loopback: an address in 127.0.0.0/8 or ::1,
// or the name "localhost" (RFC 6761 reserves it and every name under it for loopback).
func (h Host) IsLoopback() bool {
	if h.IP.IsValid() {
		return h.IP.IsLoopback()
	}
	return h.Name == "localhost" || strings.HasSuffix(h.Name, ".localhost")
}

// Name is host as a name compares: lower case, without brackets and a trailing dot.
func Name(host string) string {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// Addr parses host as an IP address in any spelling a dialer may accept: the standard forms
// (with or without brackets, IPv4-mapped IPv6 unmapped), an IPv4 address of one to four parts
// each decimal, octal (leading 0) or hexadecimal (0x), the last part filling the bytes left
// (inet_aton), and any of these with a trailing dot. An IPv6 zone is kept ("fe80::1%eth0").
func Addr(host string) (netip.Addr, bool) {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if !strings.Contains(host, ":") {
		// A trailing dot is a name's or an IPv4 address's; in IPv6 it can only be part of a
		// zone ("fe80::1%eth0."), which must stay as written or the canonical form would not
		// read back as itself.
		host = strings.TrimSuffix(host, ".")
	}
	if host == "" {
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), true
	}
	return inetAton(host)
}

// maxParts is how many dot-separated parts an IPv4 address has at most.
const maxParts = 4

// inetAton parses the legacy IPv4 spellings: "a", "a.b", "a.b.c" and "a.b.c.d", where each part
// is decimal, octal or hexadecimal and the last one holds all the bytes the others do not.
func inetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > maxParts {
		return netip.Addr{}, false
	}
	var vals [maxParts]uint64
	for i, p := range parts {
		v, ok := atonPart(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	last := len(parts) - 1
	var n uint64
	for i := range last {
		if vals[i] > 0xff {
			return netip.Addr{}, false
		}
		n = n<<8 | vals[i]
	}
	room := uint(8 * (maxParts - last))
	if vals[last] >= 1<<room {
		return netip.Addr{}, false
	}
	n = n<<room | vals[last]
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// atonPart parses one part of a legacy IPv4 spelling; at most 32 bits.
func atonPart(p string) (uint64, bool) {
	base := 10
	switch {
	case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
		base, p = 16, p[2:]
	case len(p) > 1 && p[0] == '0':
		base, p = 8, p[1:]
	}
	if p == "" || p[0] == '+' || p[0] == '-' || p[0] == '_' || strings.Contains(p, "_") {
		return 0, false
	}
	v, err := strconv.ParseUint(p, base, 32)
	return v, err == nil
}

// Prefix parses an allow-list entry that is an address in any spelling Addr reads (a prefix of
// its full length) or a CIDR whose address part is; the prefix is masked and unmapped.
func Prefix(entry string) (netip.Prefix, bool) {
	addr, bits, hasBits := strings.Cut(entry, "/")
	a, ok := Addr(addr)
	if !ok || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	n := a.BitLen()
	if hasBits {
		if bits == "" || len(bits) > 3 || bits[0] == '+' || bits[0] == '-' {
			return netip.Prefix{}, false
		}
		v, err := strconv.Atoi(bits)
		if err != nil {
			return netip.Prefix{}, false
		}
		// A mapped address's prefix counts the 96 bits of its IPv6 form.
		if strings.Contains(addr, ":") && a.Is4() {
			v -= 96
		}
		if v < 0 || v > a.BitLen() {
			return netip.Prefix{}, false
		}
		n = v
	}
	p, err := a.Prefix(n)
	return p, err == nil
}
