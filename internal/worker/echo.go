package worker

// Echo is what a worker was seen to send back of the request id it was sent (X-Request-Id): the
// bits of the ways it echoed it at least once. The proxy binds an answer to its request by that
// id; a worker that echoed it once and then sends an answer without it is answering another
// request (a stray), or was replaced by something else at its address.
type Echo uint32

const (
	// EchoHeader: an answer carried the id in its own X-Request-Id header (vLLM's
	// --enable-request-id-headers, kvgate sim, llm-d-inference-sim's flag of the same name).
	EchoHeader Echo = 1 << iota
	// EchoBody: an answer's "id" held the request id (vLLM's chatcmpl-<id> and cmpl-<id>).
	EchoBody
	// EchoNone: an answer carried neither: the worker is not known to echo (until it does).
	EchoNone
)

// Echo returns the ways w was seen to echo a request id; zero before its first answer.
func (w *Worker) Echo() Echo { return Echo(w.echo.Load()) }

// NoteEcho adds the ways e to what w was seen to echo.
func (w *Worker) NoteEcho(e Echo) {
	for {
		old := w.echo.Load()
		if old&uint32(e) == uint32(e) || w.echo.CompareAndSwap(old, old|uint32(e)) {
			return
		}
	}
}
