package proxy

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxLoggedBody bounds how much of a worker's 5xx answer is read for the log.
const maxLoggedBody = 1 << 10

// replaceServerError answers the client in place of the worker's 5xx answer: the worker's status
// and the fields a client may see (Retry-After above all), with a generic OpenAI-shaped error
// that names the request id. The worker's books count it a failure, as any 5xx. The worker's own text (a traceback, a host name, an internal
// address) goes to the log only, cut to maxLoggedBody bytes. A 4xx answer is relayed as it is:
// an engine's validation message is for the client.
func (a *attempt) replaceServerError(rw http.ResponseWriter, req *Request, res *Result) *Error {
	u := a.resp
	code := u.StatusCode
	detail, _ := io.ReadAll(io.LimitReader(u.Body, maxLoggedBody))
	a.drain = true
	a.f.cfg.Logger.Warn("worker answered with a server error; the client gets a generic one",
		"request_id", req.RequestID, "worker", a.w.ID, "status", code, "body", loggable(detail))
	h := rw.Header()
	copyResponseHeader(h, u)
	for _, k := range []string{"Content-Encoding", "Content-Length", "Content-Language", "Etag", "Last-Modified", "Content-Location"} {
		delete(h, k)
	}
	body := serverErrorBody(code, req.RequestID)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	rw.WriteHeader(code)
	res.Status, res.Committed = code, true
	// A client that left meanwhile loses a few bytes it would not read: as with any relayed
	// answer, the worker's books record its own outcome, a failure.
	_, _ = rw.Write(body)
	a.outcome = statusOutcome(code)
	return nil
}

// serverErrorBody is the OpenAI-shaped error a client gets for a worker's 5xx answer. A 508 is
// a request that came back to a gateway it had crossed (a worker URL that is a kvgate in front
// of this one): it keeps that meaning, and the code clients and tests know it by.
func serverErrorBody(code int, requestID string) []byte {
	msg, reason := "the worker failed to process the request", "upstream_server_error"
	if code == http.StatusLoopDetected {
		msg, reason = "the request looped back to a gateway it had crossed", "loop_detected"
	}
	var b bytes.Buffer
	b.WriteString(`{"error":{"message":`)
	b.Write(quoteJSON(msg + " (" + strconv.Itoa(code) + " " + http.StatusText(code) + "; request id " + requestID + ")"))
	b.WriteString(`,"type":"server_error","param":null,"code":`)
	b.Write(quoteJSON(reason))
	b.WriteString("}}\n")
	return b.Bytes()
}

// loggable is a worker's text made safe for one log attribute: valid UTF-8, control characters
// shown as spaces.
func loggable(b []byte) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(b), "\uFFFD"))
}
