package proxy

import (
	"bytes"
	"io"
	"log/slog"
)

// unsolicited opens the line net/http's Transport writes to the standard logger when a worker
// sends bytes on an idle connection; the line goes on with those bytes, quoted.
var unsolicited = []byte("Unsolicited response received on idle HTTP channel")

// StdLog returns a writer for the standard library's logger (log.SetOutput) that sends each
// line to logger. net/http's Transport logs there, and its line for bytes a worker sent on an
// idle connection quotes them: they may be another request's answer, which a log must not
// hold. That line becomes a warning without the bytes; any other line is logged as it is.
func StdLog(logger *slog.Logger) io.Writer { return stdLog{logger} }

type stdLog struct{ l *slog.Logger }

func (s stdLog) Write(p []byte) (int, error) {
	for line := range bytes.Lines(p) {
		line = bytes.TrimRight(line, "\r\n")
		if bytes.Contains(line, unsolicited) {
			s.l.Warn("a worker sent bytes outside an answer, on an idle connection; the connection was closed")
			continue
		}
		if len(line) > 0 {
			s.l.Info(string(line), "source", "stdlib")
		}
	}
	return len(p), nil
}
