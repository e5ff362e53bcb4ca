package drills

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// The kvgate binary the process drills run, built once per test binary.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
	out      []byte
}

// buildKvgate builds the kvgate binary once for every drill of the run and returns its path.
func buildKvgate(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "kvgate-drills-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "kvgate")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		built.out, built.err = exec.CommandContext(ctx, "go", "build", "-o", built.bin, "github.com/kvgate/kvgate/cmd/kvgate").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("building kvgate: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// removeBuilt removes the binary buildKvgate built, at the end of the run.
func removeBuilt() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// simProc is one `kvgate sim` engine running as a process of its own, so that a drill can stop
// it (SIGSTOP: the kernel still accepts its connections, nothing answers) or kill it (SIGKILL).
type simProc struct {
	cmd    *exec.Cmd
	url    string
	exited chan error
}

// startSim runs `bin sim` on a free loopback port with the given seed (and any further flags)
// and returns once it prints its URL. A cleanup resumes and kills it.
func startSim(t *testing.T, bin string, seed int, flags ...string) *simProc {
	t.Helper()
	args := append([]string{"sim", "--host", "127.0.0.1", "--base-port", "0", "--count", "1", "--seed", strconv.Itoa(seed)}, flags...)
	s := &simProc{cmd: exec.Command(bin, args...), exited: make(chan error, 1)}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	url := make(chan string, 1)
	scanLines(t, s.cmd, stdout, func(line string) {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "http://127.0.0.1:") {
			select {
			case url <- line:
			default:
			}
		}
	}, s.exited)
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		testutil.Recv(t, s.exited, "the simulated engine's exit")
	})
	select {
	case s.url = <-url:
	case <-time.After(30 * time.Second):
		t.Fatal("kvgate sim did not start")
	}
	return s
}

func (s *simProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// scanLines starts cmd and hands each line of out (one of its pipes) to line, in a goroutine
// that owns out until the process closes it and then sends the process's exit to exited.
func scanLines(t *testing.T, cmd *exec.Cmd, out io.Reader, line func(string), exited chan<- error) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line(sc.Text())
		}
		_, _ = io.Copy(io.Discard, out)
		exited <- cmd.Wait()
	}()
}
