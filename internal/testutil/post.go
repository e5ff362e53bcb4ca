package testutil

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// NewPost returns a JSON POST of body to url under ctx, with the bearer ("" none) and then the
// header name/value pairs in hdr (which may override it).
func NewPost(ctx context.Context, url, bearer string, body io.Reader, hdr ...string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// PostOK posts the JSON body to url with the bearer ("" none) and the header pairs in hdr,
// reads the answer to its end and returns its header and body. A transport error or a status
// other than 200 is reported with t.Errorf, which is safe off the test's goroutine, and gives a
// nil header: a caller on the test's goroutine that cannot go on stops with t.FailNow (or uses
// MustPostOK).
func PostOK(t testing.TB, url, bearer, body string, hdr ...string) (http.Header, []byte) {
	t.Helper()
	return PostOKVia(t, http.DefaultClient, url, bearer, body, hdr...)
}

// PostOKVia is PostOK through client (a MemNet's, for a test in a synctest bubble).
func PostOKVia(t testing.TB, client *http.Client, url, bearer, body string, hdr ...string) (http.Header, []byte) {
	t.Helper()
	resp, err := client.Do(NewPost(context.Background(), url, bearer, strings.NewReader(body), hdr...))
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return nil, nil
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST %s: status %d: %.200s", url, resp.StatusCode, b)
		return nil, nil
	}
	return resp.Header, b
}

// MustPostOK is PostOK that stops the test on a failure; call it on the test's goroutine only.
func MustPostOK(t testing.TB, url, bearer, body string, hdr ...string) (http.Header, []byte) {
	t.Helper()
	h, b := PostOK(t, url, bearer, body, hdr...)
	if h == nil {
		t.FailNow()
	}
	return h, b
}
