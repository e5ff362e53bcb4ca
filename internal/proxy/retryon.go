package proxy

import (
	"fmt"
	"net/http"
	"strings"
)

// RetryOn is the set of failed outcomes a request is retried on (on another worker). The zero
// value means DefaultRetryOn. It is a flag.Value: a comma-separated list of the names below.
//
// Which outcomes to retry is the operator's call because a retry of a request the engine had
// already started duplicates GPU work: by default only outcomes where the engine cannot have
// started work are retried.
type RetryOn uint8

const (
	// RetryConnect ("connect"): the connection failed, or writing the request on it did (a pooled
	// connection the worker had closed); the worker never got the request.
	RetryConnect RetryOn = 1 << iota
	// Retry429 ("429"): the worker answered 429 Too Many Requests (back-pressure, before any work).
	Retry429
	// Retry503 ("503"): the worker answered 503 Service Unavailable (not ready, before any work).
	Retry503
	// Retry5xx ("5xx"): any other 5xx answer. The engine may have started work.
	Retry5xx
	// RetryTimeout ("timeout"): no response headers in time, or a 408 answer. The engine may be
	// working on the request.
	RetryTimeout
	// RetryReset ("reset"): the connection broke after the request was sent, before the
	// response headers. The engine may have started work.
	RetryReset
)

// DefaultRetryOn retries only where the engine cannot have started work.
const DefaultRetryOn = RetryConnect | Retry429 | Retry503

var retryOnNames = []struct {
	name string
	bit  RetryOn
}{
	{"connect", RetryConnect}, {"429", Retry429}, {"503", Retry503}, {"5xx", Retry5xx},
	{"timeout", RetryTimeout}, {"reset", RetryReset},
}

// ParseRetryOn parses a comma-separated list of outcome names (connect, 429, 503, 5xx, timeout,
// reset). "none" or "" retries nothing: a zero-equivalent that still is not the default.
func ParseRetryOn(s string) (RetryOn, error) {
	var r RetryOn
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" || f == "none" {
			continue
		}
		found := false
		for _, n := range retryOnNames {
			if n.name == f {
				r |= n.bit
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown retry-on outcome %q (want a list of connect, 429, 503, 5xx, timeout, reset)", f)
		}
	}
	return r, nil
}

// String lists the outcomes, comma-separated.
func (r RetryOn) String() string {
	var parts []string
	for _, n := range retryOnNames {
		if r&n.bit != 0 {
			parts = append(parts, n.name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// Set implements flag.Value. "none" retries nothing (retryNone), distinct from the zero value.
func (r *RetryOn) Set(s string) error {
	v, err := ParseRetryOn(s)
	if err != nil {
		return err
	}
	if v == 0 {
		v = retryNone
	}
	*r = v
	return nil
}

// retryNone is an explicit empty set: non-zero so that it is not taken for the default.
const retryNone RetryOn = 1 << 7

// status reports whether a worker's answer with code is retried.
func (r RetryOn) status(code int) bool {
	switch {
	case code == http.StatusTooManyRequests:
		return r&Retry429 != 0
	case code == http.StatusServiceUnavailable:
		return r&(Retry503|Retry5xx) != 0
	case code == http.StatusRequestTimeout:
		return r&RetryTimeout != 0
	case code >= 500:
		return r&Retry5xx != 0
	}
	return false
}

// failure reports whether an attempt that failed with kind is retried.
func (r RetryOn) failure(k Kind) bool {
	switch k {
	case KindConnect:
		return r&RetryConnect != 0
	case KindTimeout:
		return r&RetryTimeout != 0
	case KindTransport:
		return r&RetryReset != 0
	}
	return false
}
