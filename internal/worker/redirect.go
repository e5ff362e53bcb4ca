package worker

import (
	"net/http"
	"net/url"
)

// MaxRedirects is how many redirects one request of the gateway's own to a worker (a health
// probe, a load poll, a registration's model probe) follows.
const MaxRedirects = 3

// SameOrigin reports whether a redirect from a to b stays on a's scheme and host and carries no
// credentials: the only redirects the gateway follows for its own requests. Anything else would
// let a worker point the gateway at an address nobody registered (its own network, a metadata
// service), past --allowed-worker-hosts.
func SameOrigin(a, b *url.URL) bool {
	return b.Scheme == a.Scheme && b.Host == a.Host && b.User == nil
}

// CheckRedirect is an http.Client CheckRedirect that follows at most MaxRedirects redirects,
// each on the first request's origin (SameOrigin). Any other redirect's answer is returned as
// it is: a 3xx, which no probe takes for success.
func CheckRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > MaxRedirects || !SameOrigin(via[0].URL, req.URL) {
		return http.ErrUseLastResponse
	}
	return nil
}
