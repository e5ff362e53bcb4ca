package radix

import "testing"

// TestRouteDepths: every tenant holding a prefix of the text is told, last, how many leading
// characters of it the tenant holds; tenants holding nothing are not reported; choose still
// records the text.
func TestRouteDepths(t *testing.T) {
	tr := New(Options{})
	tr.Insert("system prompt. question one", "a")
	tr.Insert("system prompt. question two", "b")
	tr.Insert("system", "c")
	tr.Insert("another opening", "d")
	got := map[string]int{}
	tr.RouteDepths("system prompt. question one, again", func(tenant string, chars int) {
		got[tenant] = chars // the last report is the depth
	}, func(m *Match) string {
		if m.Chars != len("system prompt. question one") {
			t.Errorf("match %d chars", m.Chars)
		}
		return "e"
	})
	want := map[string]int{"a": len("system prompt. question one"), "b": len("system prompt. question "), "c": len("system")}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("tenant %s: depth %d, want %d", k, got[k], v)
		}
	}
	if _, ok := got["d"]; ok {
		t.Error("a tenant holding no prefix of the text was reported")
	}
	if n, _ := tr.Lookup("system prompt. question one, again"); n != len("system prompt. question one, again") {
		t.Errorf("the text was not recorded for the chosen tenant: lookup %d", n)
	}
}
