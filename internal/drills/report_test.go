package drills

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// row is one line of the drill table.
type row struct {
	drill    string
	requests int
	failures int // client-visible failures the drill did not allow for
	shed     time.Duration
	recover  time.Duration
	note     string
}

var (
	rowsMu sync.Mutex
	rows   []row
)

// report adds a drill's line to the table.
func report(r row) {
	rowsMu.Lock()
	rows = append(rows, r)
	rowsMu.Unlock()
}

func ms(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
}

// table renders the rows as Markdown.
func table() string {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	var b strings.Builder
	b.WriteString("| drill | requests | client-visible failures | time to shed | time to recover | notes |\n")
	b.WriteString("|---|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s |\n", r.drill, r.requests, r.failures, ms(r.shed), ms(r.recover), r.note)
	}
	return b.String()
}

func TestMain(m *testing.M) {
	code := m.Run()
	removeBuilt()
	if len(rows) > 0 {
		t := table()
		fmt.Print("\nDrill table\n\n" + t)
		if path := os.Getenv("KVGATE_DRILL_REPORT"); path != "" {
			if err := os.WriteFile(path, []byte(t), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, "writing the drill report:", err)
			}
		}
	}
	os.Exit(code)
}
