package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is the OpenAI error shape: {"error":{"message","type","param","code"}}.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// StatusClientClosed is the status logged (never sent) when the client went away.
const StatusClientClosed = 499

// errorType names the OpenAI error type for an HTTP status.
func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusRequestEntityTooLarge || status < 500:
		return "invalid_request_error"
	default:
		return "server_error"
	}
}

// writeError writes an OpenAI-shaped error with status. code is a short machine-readable reason.
// A 429 or 503 says when to come back (Retry-After: 1 and 5 seconds), as the SDKs' retry loops
// read it.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	body, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: errorType(status), Code: code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	switch status {
	case http.StatusTooManyRequests:
		h.Set("Retry-After", "1")
	case http.StatusServiceUnavailable:
		h.Set("Retry-After", "5")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
