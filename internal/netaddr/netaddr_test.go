package netaddr

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestAddrEveryLoopbackSpelling(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	for _, s := range []string{
		"127.0.0.1", "127.1", "127.0.1", "2130706433", "0x7f000001", "0X7F000001", "0x7f.1",
		"0177.0.0.1", "0177.1", "017700000001", "127.0.0.1.", "127.1.", "[::ffff:127.0.0.1]",
		"::ffff:127.0.0.1", "::FFFF:7f00:1", "0x7f.0.0.0x1", "127.00.0.01",
	} {
		a, ok := Addr(s)
		if !ok || a != lo {
			t.Errorf("Addr(%q) = %v, %v; want %v", s, a, ok, lo)
		}
		if !Parse(s).IsLoopback() {
			t.Errorf("Parse(%q) is not loopback", s)
		}
	}
	for _, s := range []string{"localhost", "LOCALHOST.", "LocalHost", "a.localhost", "[::1]", "::1", "0:0:0:0:0:0:0:1", "127.255.255.254"} {
		if !Parse(s).IsLoopback() {
			t.Errorf("Parse(%q) is not loopback", s)
		}
	}
	for _, s := range []string{"", ".", "1.2.3.4.5", "256.1.1.1", "1.256.1.1", "0x1.0x1.0x1.0x100", "08.1.1.1", "0x", "1..1", "+1", "-1",
		"4294967296", "1.16777216", "1_0.0.0.1", "example.com", "localhost.example", "127.0.0.1x", "::ffff:127.0.0.1."} {
		if a, ok := Addr(s); ok && s != "::ffff:127.0.0.1." {
			t.Errorf("Addr(%q) = %v; want no address", s, a)
		}
	}
	if Parse("LOCALHOST.example").IsLoopback() || Parse("10.0.0.1").IsLoopback() {
		t.Error("a foreign host counted as loopback")
	}
}

func TestPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.0/8": "10.0.0.0/8", "10.1.2.3/8": "10.0.0.0/8", "0x0a000000/8": "10.0.0.0/8", "10.1": "10.0.0.1/32",
		"::ffff:10.0.0.0/104": "10.0.0.0/8", "::1": "::1/128", "fd00::/8": "fd00::/8",
	} {
		p, ok := Prefix(in)
		if !ok || p.String() != want {
			t.Errorf("Prefix(%q) = %v, %v; want %s", in, p, ok, want)
		}
	}
	for _, in := range []string{"10.0.0.0/33", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/+8", "x/8", "fe80::1%eth0/64", "::ffff:10.0.0.0/95"} {
		if p, ok := Prefix(in); ok {
			t.Errorf("Prefix(%q) = %v; want none", in, p)
		}
	}
}

// spell writes the IPv4 address n in one of the legacy spellings: parts 1..4, each part in
// decimal, octal or hex by the bits of style.
func spell(n uint32, style uint8) string {
	parts := int(style%4) + 1
	b := [4]uint32{n >> 24, n >> 16 & 0xff, n >> 8 & 0xff, n & 0xff}
	var vals []uint32
	for i := 0; i < parts-1; i++ {
		vals = append(vals, b[i])
	}
	rest := uint32(0)
	for i := parts - 1; i < 4; i++ {
		rest = rest<<8 | b[i]
	}
	vals = append(vals, rest)
	out := make([]string, len(vals))
	for i, v := range vals {
		switch (style >> (2 + uint(i)%3)) & 3 {
		case 1:
			out[i] = fmt.Sprintf("0%o", v)
		case 2:
			out[i] = fmt.Sprintf("0x%x", v)
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	s := strings.Join(out, ".")
	if style&0x80 != 0 {
		s += "."
	}
	return s
}

// FuzzAddrSpellings checks that every legacy spelling of an address reads as that address.
func FuzzAddrSpellings(f *testing.F) {
	f.Add(uint32(0x7f000001), uint8(0))
	f.Add(uint32(0x7f000001), uint8(0xff))
	f.Add(uint32(0x0a000001), uint8(0x26))
	f.Fuzz(func(t *testing.T, n uint32, style uint8) {
		s := spell(n, style)
		want := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
		if a, ok := Addr(s); !ok || a != want {
			t.Fatalf("Addr(%q) = %v, %v; want %v", s, a, ok, want)
		}
	})
}

// FuzzAddr checks that any input parses without panicking, and that what parses prints as
// itself: the canonical form is a fixed point, so two checks of one host cannot disagree.
func FuzzAddr(f *testing.F) {
	for _, s := range []string{"127.1", "0x7f000001", "[::ffff:127.0.0.1]", "LOCALHOST.", "1.2.3.4/8", "fe80::1%eth0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := Parse(s)
		if h.IP.IsValid() {
			if h.IP.Is4In6() {
				t.Fatalf("Parse(%q) kept a mapped address %v", s, h.IP)
			}
			if again := Parse(h.String()); again != h {
				t.Fatalf("Parse(%q) = %v, but Parse(%q) = %v", s, h, h.String(), again)
			}
		} else if h.Name != strings.ToLower(h.Name) {
			t.Fatalf("Parse(%q).Name = %q is not lower case", s, h.Name)
		}
		if p, ok := Prefix(s); ok && p != p.Masked() {
			t.Fatalf("Prefix(%q) = %v is not masked", s, p)
		}
	})
}
