package kvevents

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The golden tests replay what a real libzmq PUB socket sent (testdata/libzmq: captured once,
// see its README), carrying vLLM's encodings, into the gateway's ingestion, and check what the
// index believes after the fourth batch (the fifth clears everything).

// goldenWorker is the engine the captured topic names.
const goldenWorker = "http://127.0.0.1:8000"

// run returns n consecutive token ids from first (the capture's token_ids).
func run(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// goldenRig is a Service whose state is snapshotted after the fourth message it handles.
type goldenRig struct {
	svc     *Service
	id      string
	mu      sync.Mutex
	seen    int
	after4  map[uint32]int // first token of a prompt → tokens matched after batch 3
	orphans uint64
	done    chan struct{} // closed after the fifth message
}

// prompts are the captured prompts' first tokens and lengths.
var goldenPrompts = map[uint32]int{1000: 12, 2000: 4, 3000: 8, 4000: 4, 5000: 4, 6000: 8}

func newGoldenRig(t *testing.T, cfg Config) *goldenRig {
	g := &goldenRig{after4: map[uint32]int{}, done: make(chan struct{})}
	cfg.AfterMessage = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.seen++
		switch g.seen {
		case 4:
			for first, n := range goldenPrompts {
				out := []int{0}
				g.svc.idx.Match("golden-model", run(first, n), []string{g.id}, out, time.Now())
				g.after4[first] = out[0]
			}
			g.orphans = g.svc.idx.Stats().Orphans
		case 5:
			close(g.done)
		}
	}
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	g.svc = svc
	return g
}

func (g *goldenRig) check(t *testing.T) {
	t.Helper()
	select {
	case <-g.done:
	case <-time.After(20 * time.Second):
		g.mu.Lock()
		defer g.mu.Unlock()
		t.Fatalf("%d of 5 captured messages handled in 20 s (stats %+v)", g.seen, g.svc.Stats())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	want := map[uint32]int{
		1000: 8, // two chained stores and a third under them, whose last block was removed
		2000: 4, // array form with lora_name, extra_keys and group_idx
		3000: 4, // map form: two blocks stored, the second removed
		4000: 0, // a LoRA adapter's block: not the base model's prefix
		5000: 0, // a copy offloaded to the CPU: not what the GPU holds
		6000: 8, // byte hashes, parent 0 = no parent (llm-d): a chain from the start
	}
	for first, n := range want {
		if g.after4[first] != n {
			t.Errorf("prompt from token %d: %d tokens matched, want %d", first, g.after4[first], n)
		}
	}
	if g.orphans != 0 {
		t.Errorf("%d orphan drops", g.orphans)
	}
	st := g.svc.Stats()
	if st.Batches != 5 || st.Malformed != 0 || st.Gaps != 0 {
		t.Errorf("stats %+v: want 5 batches applied, nothing malformed, no gap", st)
	}
	out := []int{0}
	g.svc.idx.Match("golden-model", run(1000, 12), []string{g.id}, out, time.Now())
	if out[0] != 0 {
		t.Errorf("after AllBlocksCleared: %d tokens matched", out[0])
	}
}

// TestGoldenLibzmqCapture serves each captured byte stream to the gateway as if it were the
// engine's publisher (the gateway dials it, as with --kv-events-port).
func TestGoldenLibzmqCapture(t *testing.T) {
	for _, name := range []string{"pub-bound.bin", "pub-connected.bin"} {
		t.Run(name, func(t *testing.T) {
			stream, err := os.ReadFile(filepath.Join("testdata", "libzmq", name))
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				c.Write(stream)
				io.Copy(io.Discard, c) // until the gateway hangs up
			}()
			g := newGoldenRig(t, Config{})
			w := newWorker(t, goldenWorker, map[string]string{EndpointLabel: "tcp://" + ln.Addr().String()})
			g.id = w.ID
			if err := g.svc.Track(w); err != nil {
				t.Fatal(err)
			}
			g.check(t)
		})
	}
}

// TestLiveLibzmqPublisher has a real libzmq publisher (pyzmq) connect to the gateway's bound
// socket and publish the same batches. It needs python3 with zmq and msgpack (Debian:
// python3-zmq, python3-msgpack; .ci/run installs them) and is skipped without.
func TestLiveLibzmqPublisher(t *testing.T) {
	python := ""
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import zmq, msgpack").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		t.Skip("no python3 with zmq and msgpack")
	}
	g := newGoldenRig(t, Config{Bind: "tcp://127.0.0.1:0"})
	w := newWorker(t, goldenWorker, nil)
	g.id = w.ID
	g.svc.Track(w)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, filepath.Join("testdata", "libzmq", "capture.py"), "--publish", "tcp://"+g.svc.BindAddr)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the libzmq publisher: %v\n%s", err, out)
	}
	g.check(t)
}
