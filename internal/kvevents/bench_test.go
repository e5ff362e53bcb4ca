package kvevents_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/worker"
)

// BenchmarkDecision measures what precise routing adds to a routing decision for an 8 KB
// prompt (2,048 tokens) over 8 workers whose index holds 1,000 prompts each: tokenizing by a
// simulated engine's /tokenize on loopback (a new prompt each time, or a repeated one the cache
// answers), matching against the index, and the whole precise_prefix Pick; cache_aware_hash's
// Pick on the same prompts is the baseline.
func BenchmarkDecision(b *testing.B) {
	srv := sim.NewServer(sim.Config{})
	defer srv.Close()
	ts := httptest.NewServer(srv)
	defer ts.Close()
	via, _ := worker.New(worker.Spec{URL: ts.URL}, worker.BreakerConfig{Disabled: true})
	via.SetHealth(worker.Ready)

	const bs = 16
	idx := kvevents.NewIndex(1<<22, 4)
	var ws []*worker.Worker
	var ids []string
	prompt := func(i int) string {
		return fmt.Sprintf("%08d", i) + strings.Repeat("lorem ipsum dolor sit amet ", 310)[:8184]
	}
	for w := range 8 {
		wk, _ := worker.New(worker.Spec{URL: fmt.Sprintf("http://engine-%d:8000", w)}, worker.BreakerConfig{Disabled: true})
		wk.SetHealth(worker.Ready)
		ws, ids = append(ws, wk), append(ids, wk.ID)
		src := kvevents.Source{Worker: wk.ID}
		for p := range 1000 {
			toks := engine.Tokenize(prompt(w*1000 + p))
			n := len(toks) / bs
			hashes := make([]uint64, n)
			for j := range hashes {
				hashes[j] = uint64(w*1000+p)<<20 | uint64(j)
			}
			idx.Apply(src, []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: hashes, Tokens: toks[:n*bs], BlockSize: bs}})
		}
	}
	out := make([]int, len(ids))
	b.Run("tokenize_new", func(b *testing.B) {
		tok := kvevents.NewTokenizer(kvevents.TokenizerConfig{Timeout: time.Second})
		i := 0
		for b.Loop() {
			i++
			if _, err := tok.Tokenize(context.Background(), via, "", false, nil, prompt(100000+i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tokenize_cached", func(b *testing.B) {
		tok := kvevents.NewTokenizer(kvevents.TokenizerConfig{Timeout: time.Second})
		for b.Loop() {
			if _, err := tok.Tokenize(context.Background(), via, "", false, nil, prompt(5)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("match", func(b *testing.B) {
		toks := engine.Tokenize(prompt(3005))
		for b.Loop() {
			if !idx.Match("", toks, ids, out, time.Now()) {
				b.Fatal("no answer")
			}
		}
	})
	// The picks: precise_prefix with a view over this index and a cached tokenizer, against
	// cache_aware_hash, on 8 repeated prompts.
	view := &benchView{idx: idx, tok: kvevents.NewTokenizer(kvevents.TokenizerConfig{Timeout: time.Second}), via: via}
	for name, kv := range map[string]policy.KVView{"pick_cache_aware_hash": nil, "pick_precise_prefix_cached": view} {
		b.Run(name, func(b *testing.B) {
			cfg := policy.DefaultConfig()
			cfg.NoBackground, cfg.KV = true, kv
			pname := "precise_prefix"
			if kv == nil {
				pname = "cache_aware_hash"
			}
			p, _ := policy.New(pname, cfg)
			i := 0
			for b.Loop() {
				i++
				p.Pick(context.Background(), ws, &policy.Request{Text: prompt(1000*(i%8) + 7)})
			}
		})
	}
}

type benchView struct {
	idx *kvevents.Index
	tok *kvevents.Tokenizer
	via *worker.Worker
}

func (v *benchView) Tokenize(ctx context.Context, _ *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	return v.tok.Tokenize(ctx, v.via, model, chat, body, text)
}

func (v *benchView) Covers(model string, ids []string) bool {
	return v.idx.Covers(model, ids, time.Now())
}

func (v *benchView) Match(model string, toks []uint32, ids []string, out []int) bool {
	return v.idx.Match(model, toks, ids, out, time.Now())
}
