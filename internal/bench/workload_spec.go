package bench

import (
	"errors"
	"fmt"
)

// Spec names a workload and the knobs that shape it: what `kvgate bench` builds from its flags
// and what a suite row is made of. The zero value is the default shared-prefix workload.
type Spec struct {
	// Name is one of WorkloadNames; "" means shared-prefix, or the trace when Trace is set.
	Name string
	// Trace is a trace file to replay (Name must then be "", "trace" or "shared-prefix");
	// TraceFormat is "jsonl" (kvgate's, the default) or "mooncake".
	Trace, TraceFormat string
	// Mooncake are the replay options of Mooncake-format traces, generated ones included. Its
	// Seed is set from Seed.
	Mooncake MooncakeOptions
	// Gen is the generator of mooncake-synth and mooncake-agent; a zero Duration means the
	// named workload's defaults (NewMooncakeGen, NewMooncakeAgentGen). Its Seed is set from Seed.
	Gen MooncakeGen
	// Seed seeds the workload.
	Seed uint64
	// Prefixes, PrefixWords and OutputTokens, when positive, override shared-prefix's (system
	// prompts, words each, output tokens) and long-context's (tenants, words per context,
	// output tokens) defaults.
	Prefixes, PrefixWords, OutputTokens int
}

// Generated reports whether the spec names a generated Mooncake-format trace.
func (s Spec) Generated() bool { return s.Name == "mooncake-synth" || s.Name == "mooncake-agent" }

// Generator returns the generator of a generated trace: Gen, or the named workload's defaults
// when Gen is zero, seeded with Seed.
func (s Spec) Generator() (*MooncakeGen, error) {
	if !s.Generated() {
		return nil, fmt.Errorf("workload %q is not a generated trace", s.Name)
	}
	g := s.Gen
	if g.Duration == 0 {
		g = *DefaultGenerator(s.Name, s.Seed)
	}
	g.Seed = s.Seed
	return &g, nil
}

// DefaultGenerator returns the default generator of a generated workload: NewMooncakeAgentGen
// for mooncake-agent, NewMooncakeGen otherwise.
func DefaultGenerator(name string, seed uint64) *MooncakeGen {
	if name == "mooncake-agent" {
		return NewMooncakeAgentGen(seed)
	}
	return NewMooncakeGen(seed)
}

// Build makes the workload.
func (s Spec) Build() (Workload, error) {
	if s.Prefixes < 0 || s.PrefixWords < 0 || s.OutputTokens < 0 {
		return nil, errors.New("prefixes, prefix words and output tokens must be >= 0")
	}
	mopt := s.Mooncake
	mopt.Seed = s.Seed
	if s.Trace != "" {
		if s.Name != "" && s.Name != "shared-prefix" && s.Name != "trace" {
			return nil, fmt.Errorf("a trace file replays a trace; it cannot be combined with workload %s", s.Name)
		}
		switch s.TraceFormat {
		case "jsonl", "":
			return LoadTrace(s.Trace, s.Seed)
		case "mooncake":
			return LoadMooncake(s.Trace, mopt)
		}
		return nil, fmt.Errorf("trace format %q: want jsonl or mooncake", s.TraceFormat)
	}
	if s.Generated() {
		g, err := s.Generator()
		if err != nil {
			return nil, err
		}
		es, err := g.Generate()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		return NewMooncake(es, mopt)
	}
	name := s.Name
	if name == "" {
		name = "shared-prefix"
	}
	w, err := NewWorkload(name, s.Seed)
	if err != nil {
		return nil, err
	}
	switch w := w.(type) {
	case *SharedPrefix:
		w.Prefixes = positiveOr(s.Prefixes, w.Prefixes)
		w.PrefixWords = positiveOr(s.PrefixWords, w.PrefixWords)
		w.OutputTokens = positiveOr(s.OutputTokens, w.OutputTokens)
		w.Init()
	case *LongContext:
		w.Tenants = positiveOr(s.Prefixes, w.Tenants)
		w.ContextWords = positiveOr(s.PrefixWords, w.ContextWords)
		w.OutputTokens = positiveOr(s.OutputTokens, w.OutputTokens)
		w.Init()
	}
	return w, nil
}

func positiveOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
