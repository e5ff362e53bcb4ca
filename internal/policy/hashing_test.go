package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

func TestConsistentHashingBranches(t *testing.T) {
	ws := testWorkers(t, 5)
	cfg := DefaultConfig()
	cfg.Rand = func(n int) int { return n - 1 }
	p := NewConsistentHashing(cfg)

	t.Run("same key, same worker", func(t *testing.T) {
		first := p.Pick(context.Background(), ws, &Request{Key: "session-42"})
		for range 10 {
			if got := p.Pick(context.Background(), ws, &Request{Key: "session-42"}); got != first {
				t.Fatalf("key moved from %s to %s", first.ID, got.ID)
			}
		}
	})
	t.Run("no key: random available worker", func(t *testing.T) {
		if got := p.Pick(context.Background(), ws, &Request{}); got != ws[4] {
			t.Fatalf("Pick = %s, want the one the injected rand picks", got.ID)
		}
	})
	t.Run("unavailable home: the key moves, then returns", func(t *testing.T) {
		home := p.Pick(context.Background(), ws, &Request{Key: "k"})
		home.SetHealth(worker.NotReady)
		other := p.Pick(context.Background(), ws, &Request{Key: "k"})
		home.SetHealth(worker.Ready)
		if other == home || other == nil {
			t.Fatalf("key stayed on the unavailable worker")
		}
		if got := p.Pick(context.Background(), ws, &Request{Key: "k"}); got != home {
			t.Fatalf("key did not return home")
		}
	})
	t.Run("none available", func(t *testing.T) {
		down := testWorkers(t, 2)
		for _, w := range down {
			w.SetHealth(worker.NotReady)
		}
		if p.Pick(context.Background(), down, &Request{Key: "k"}) != nil || p.Pick(context.Background(), down, &Request{}) != nil {
			t.Fatal("picked an unavailable worker")
		}
	})
	d := p.Decisions()
	if d[BranchHash] != 14 || d[BranchNoKey] != 1 {
		t.Fatalf("Decisions = %v, want 14 hash, 1 no_key", d)
	}
}

// TestConsistentHashingMovesAboutOneNth adds an 11th worker to 10 and checks that about 1/11 of
// the keys move, all of them to the newcomer, and that keys spread evenly.
func TestConsistentHashingMovesAboutOneNth(t *testing.T) {
	ws := testWorkers(t, 11)
	p := NewConsistentHashing(DefaultConfig())
	const keys = 20000
	moved, perWorker := 0, map[*worker.Worker]int{}
	for i := range keys {
		req := &Request{Key: fmt.Sprintf("user-%d", i)}
		before := p.Pick(context.Background(), ws[:10], req)
		after := p.Pick(context.Background(), ws, req)
		perWorker[before]++
		if before != after {
			moved++
			if after != ws[10] {
				t.Fatalf("key %d moved between old workers", i)
			}
		}
	}
	if frac := float64(moved) / keys; frac < 0.07 || frac > 0.115 {
		t.Fatalf("%.3f of keys moved, want about 1/11", frac)
	}
	for w, n := range perWorker {
		if n < keys/10*7/10 || n > keys/10*13/10 {
			t.Fatalf("worker %s got %d of %d keys", w.ID, n, keys)
		}
	}
}

func TestPrefixHashBranches(t *testing.T) {
	prefix := strings.Repeat("You are a helpful assistant. ", 50) // > 1024 characters
	tests := []struct {
		name   string
		loads  func(home int) []int64
		req    Request
		branch string
		check  func(t *testing.T, got *worker.Worker, home int, ws []*worker.Worker, order []int)
	}{
		{
			name:   "idle pool: the hashed worker",
			loads:  func(int) []int64 { return []int64{0, 0, 0, 0} },
			req:    Request{Text: prefix + "question A"},
			branch: BranchHash,
			check: func(t *testing.T, got *worker.Worker, home int, ws []*worker.Worker, _ []int) {
				if got != ws[home] {
					t.Fatal("not the hashed worker")
				}
			},
		},
		{
			name:   "home within the bound keeps the key",
			loads:  func(home int) []int64 { l := []int64{4, 4, 4, 4}; l[home] = 5; return l },
			req:    Request{Text: prefix + "question B"},
			branch: BranchHash,
			check: func(t *testing.T, got *worker.Worker, home int, ws []*worker.Worker, _ []int) {
				if got != ws[home] { // bound ⌈1.25 × (17+1) / 4⌉ = 6 > 5
					t.Fatal("home within bound lost the key")
				}
			},
		},
		{
			name:   "home over the bound hands the key to the next choice",
			loads:  func(home int) []int64 { l := []int64{1, 1, 1, 1}; l[home] = 10; return l },
			req:    Request{Text: prefix + "question C"},
			branch: BranchHashOverflow,
			check: func(t *testing.T, got *worker.Worker, _ int, ws []*worker.Worker, order []int) {
				if got != ws[order[1]] {
					t.Fatal("overflow did not go to the second choice")
				}
			},
		},
		{
			name:   "no text: the routing key is hashed",
			loads:  func(int) []int64 { return []int64{0, 0, 0, 0} },
			req:    Request{Key: "user-7"},
			branch: BranchHash,
			check:  func(*testing.T, *worker.Worker, int, []*worker.Worker, []int) {},
		},
		{
			name:   "nothing to hash: least loaded",
			loads:  func(int) []int64 { return []int64{3, 1, 2, 5} },
			req:    Request{},
			branch: BranchNoKey,
			check: func(t *testing.T, got *worker.Worker, _ int, ws []*worker.Worker, _ []int) {
				if got != ws[1] {
					t.Fatal("not the least loaded")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, 4)
			order := rendezvousOrder(ws, tt.req.Text, tt.req.Key)
			loads := newFakeLoads()
			for i, l := range tt.loads(order[0]) {
				loads.set(ws[i], l)
			}
			cfg := DefaultConfig()
			cfg.Loads = loads
			p := NewPrefixHash(cfg)
			got := p.Pick(context.Background(), ws, &tt.req)
			tt.check(t, got, order[0], ws, order)
			if d := p.Decisions(); d[tt.branch] != 1 {
				t.Fatalf("Decisions = %v, want one %s", d, tt.branch)
			}
		})
	}
}

// rendezvousOrder returns worker indexes by descending score for what prefix_hash hashes.
func rendezvousOrder(ws []*worker.Worker, text, key string) []int {
	k := prefixChars(text, 1024)
	if k == "" {
		k = key
	}
	h := hashString(k)
	order := make([]int, len(ws))
	for i := range order {
		order[i] = i
	}
	for i := range order { // insertion sort: a handful of workers
		for j := i; j > 0 && score(h, ws[order[j]].ID) > score(h, ws[order[j-1]].ID); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	return order
}

func TestPrefixHashSamePrefixSameWorkerAcrossReplicas(t *testing.T) {
	ws := testWorkers(t, 8)
	a, b := NewPrefixHash(DefaultConfig()), NewPrefixHash(DefaultConfig())
	prefix := strings.Repeat("é日x", 400) // 1200 characters, 2400+ bytes
	home := a.Pick(context.Background(), ws, &Request{Text: prefix + "tail one"})
	for _, tail := range []string{"tail two", "another tail", ""} {
		if got := b.Pick(context.Background(), ws, &Request{Text: prefix + tail}); got != home {
			t.Fatalf("prefix with tail %q went to %s, want %s", tail, got.ID, home.ID)
		}
	}
	seen := map[*worker.Worker]bool{}
	for i := range 64 {
		seen[a.Pick(context.Background(), ws, &Request{Text: fmt.Sprintf("prompt %d", i)})] = true
	}
	if len(seen) < 6 {
		t.Fatalf("64 different prefixes reached only %d of 8 workers", len(seen))
	}
}

func TestPrefixChars(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"日本語です", 2, "日本"},
		{"\xff\xfeabc", 3, "\xff\xfea"},
		{"abcé日x", 5, "abcé日"},
		{"abcé日x", 4, "abcé"},
		{"abc", 3, "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.s, func(t *testing.T) {
			if got := prefixChars(tt.s, tt.n); got != tt.want {
				t.Fatalf("prefixChars(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
		})
	}
}
