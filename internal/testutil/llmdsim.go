package testutil

// LLMDSim starts llm-d-inference-sim, the llm-d project's vLLM simulator, for tests that check
// kvgate against an engine nobody here wrote. The binary is found at $KVGATE_LLMD_SIM, or at
// ../shared/tools/llm-d-inference-sim/llm-d-inference-sim beside the repository root; where it
// is absent the test is skipped, and says why.

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// LLMDSimEnv names the environment variable that points at an llm-d-inference-sim binary.
const LLMDSimEnv = "KVGATE_LLMD_SIM"

// LLMDSimBinary returns the path of the llm-d-inference-sim binary, or skips t when there is
// none.
func LLMDSimBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(LLMDSimEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", LLMDSimEnv, p, err)
		}
		return p
	}
	root, err := repoRoot()
	if err == nil {
		p := filepath.Join(root, "..", "shared", "tools", "llm-d-inference-sim", "llm-d-inference-sim")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	t.Skipf("llm-d-inference-sim not found (set %s, or place it at ../shared/tools/llm-d-inference-sim/ beside the repository): skipping the foreign-engine test", LLMDSimEnv)
	return ""
}

// repoRoot is the nearest directory at or above the working directory holding go.mod with no
// go.mod further up that belongs to the same checkout (the gateway's module root).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	found := ""
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			found = d
		}
		if _, err := os.Stat(filepath.Join(d, ".git")); err == nil {
			if found == "" {
				found = d
			}
			return found, nil
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	if found == "" {
		return "", fmt.Errorf("no go.mod above %s", dir)
	}
	return found, nil
}

// LLMDSim is one running llm-d-inference-sim engine on a loopback port.
type LLMDSim struct {
	// URL is the engine's base URL, http://127.0.0.1:PORT.
	URL string
	// Port is its port.
	Port int

	cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
	once sync.Once
}

// Output returns what the engine has written to stdout and stderr so far (for failure messages).
func (s *LLMDSim) Output() string { return s.out.String() }

// Stop kills the engine and waits for it to exit. Cleanup calls it too; calling it twice is safe.
func (s *LLMDSim) Stop() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
}

// StartLLMDSim starts one engine serving model on a free loopback port with the given extra
// flags (the port, --model and --force-dummy-tokenizer are set here; pass --zmq-endpoint ""
// unless the test wants KV events). It waits until /health answers 200, and stops the engine
// when t ends. It skips t when the binary is absent.
func StartLLMDSim(t testing.TB, model string, args ...string) *LLMDSim {
	t.Helper()
	bin := LLMDSimBinary(t)
	var last string
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		s, err := startLLMDSim(bin, port, model, args)
		if err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		last = err.Error()
	}
	t.Fatalf("llm-d-inference-sim did not start: %s", last)
	return nil
}

func startLLMDSim(bin string, port int, model string, args []string) (*LLMDSim, error) {
	all := append([]string{"--port", strconv.Itoa(port), "--model", model, "--force-dummy-tokenizer"}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
	out := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &LLMDSim{URL: "http://127.0.0.1:" + strconv.Itoa(port), Port: port, cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(Deadline)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return nil, fmt.Errorf("exited at start: %s", tail(out.String()))
		default:
		}
		resp, err := client.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return nil, fmt.Errorf("no healthy answer within %v: %s", Deadline, tail(out.String()))
}

func tail(s string) string {
	b := []byte(s)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// freePort asks the kernel for a free loopback port. Another process may take it before the
// engine binds it; StartLLMDSim tries again then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
