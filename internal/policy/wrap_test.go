package policy

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/radix"
	"github.com/kvgate/kvgate/internal/worker"
)

// everything implements every optional interface of the package and records which of its
// methods were called.
type everything struct{ called map[string]bool }

func (e *everything) hit(name string) { e.called[name] = true }

func (e *everything) Name() string { return "everything" }
func (e *everything) Pick(_ context.Context, c []*worker.Worker, _ *Request) *worker.Worker {
	e.hit("Pick")
	return c[0]
}
func (e *everything) Forget(string)                   { e.hit("Forget") }
func (e *everything) Observed(float64, float64)       { e.hit("Observed") }
func (e *everything) Evict()                          { e.hit("Evict") }
func (e *everything) Decisions() map[string]uint64    { e.hit("Decisions"); return map[string]uint64{} }
func (e *everything) TreeSizes() map[string]int64     { e.hit("TreeSizes"); return nil }
func (e *everything) Opening(string) int              { e.hit("Opening"); return 0 }
func (e *everything) Record(*Request, *worker.Worker) { e.hit("Record") }
func (e *everything) HotPrefixes(radix.HotOptions) []radix.HotPrefix {
	e.hit("HotPrefixes")
	return nil
}
func (e *everything) RecordWarm(string, string) { e.hit("RecordWarm") }
func (e *everything) BestCost(context.Context, []*worker.Worker, *Request) (float64, bool) {
	e.hit("BestCost")
	return 1, true
}
func (e *everything) DecisionTime() (int64, time.Duration)                { e.hit("DecisionTime"); return 1, 1 }
func (e *everything) Close() error                                        { e.hit("Close"); return nil }
func (e *everything) Learn(*Request, Answer)                              { e.hit("Learn") }
func (e *everything) Calibration() map[string]float64                     { e.hit("Calibration"); return nil }
func (e *everything) Capacities() map[string]float64                      { e.hit("Capacities"); return nil }
func (e *everything) Rates() map[string]float64                           { e.hit("Rates"); return nil }
func (e *everything) Drifts() map[string]Drift                            { e.hit("Drifts"); return nil }
func (e *everything) WorkerDrift(string) Drift                            { e.hit("WorkerDrift"); return Drift{} }
func (e *everything) Prepare(context.Context, []*worker.Worker, *Request) { e.hit("Prepare") }

// TestWrappersForwardEveryInterface reads the package's source for every interface it declares
// and checks that the sticky wrapper implements each optional one and that calling it reaches
// the wrapped policy. A new interface fails this test until it is listed here, as forwarded or
// as not a policy's (an input such as Loads).
func TestWrappersForwardEveryInterface(t *testing.T) {
	notOptional := map[string]bool{
		"Policy": true, "Loads": true, "LazyLoads": true, "KVView": true, "SaltedMatcher": true, "AdapterMatcher": true, "Peers": true, "SessionShare": true, "PartialKVView": true, // the interface itself and inputs
		"SessionReporter": true, // the wrapper's own
		"Unwrapper":       true, // the wrapper's own
	}
	calls := map[string]func(p Policy){
		"Forgetter":        func(p Policy) { p.(Forgetter).Forget("w") },
		"CacheObserver":    func(p Policy) { p.(CacheObserver).Observed(0.5, 0.5) },
		"Evicter":          func(p Policy) { p.(Evicter).Evict() },
		"DecisionReporter": func(p Policy) { p.(DecisionReporter).Decisions() },
		"TreeReporter":     func(p Policy) { p.(TreeReporter).TreeSizes() },
		"Opener":           func(p Policy) { p.(Opener).Opening("t") },
		"Recorder":         func(p Policy) { p.(Recorder).Record(&Request{}, nil) },
		"Warmer": func(p Policy) {
			p.(Warmer).HotPrefixes(radix.HotOptions{})
			p.(Warmer).RecordWarm("w", "t")
		},
		"Coster":           func(p Policy) { p.(Coster).BestCost(context.Background(), nil, &Request{}) },
		"DecisionTimer":    func(p Policy) { p.(DecisionTimer).DecisionTime() },
		"AnswerLearner":    func(p Policy) { p.(AnswerLearner).Learn(&Request{}, Answer{}) },
		"Calibrator":       func(p Policy) { p.(Calibrator).Calibration() },
		"CapacityReporter": func(p Policy) { p.(CapacityReporter).Capacities() },
		"RateReporter":     func(p Policy) { p.(RateReporter).Rates() },
		"DriftReporter": func(p Policy) {
			p.(DriftReporter).Drifts()
			p.(DriftReporter).WorkerDrift("w")
		},
		"Preparer": func(p Policy) { p.(Preparer).Prepare(context.Background(), nil, &Request{}) },
	}
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.IsExported() {
					if _, ok := ts.Type.(*ast.InterfaceType); ok {
						found = append(found, ts.Name.Name)
					}
				}
				return true
			})
		}
	}
	if len(found) < 10 {
		t.Fatalf("found only %v: the source scan is broken", found)
	}
	for _, name := range found {
		if notOptional[name] {
			continue
		}
		call, ok := calls[name]
		if !ok {
			t.Errorf("interface %s is neither forwarded by the wrappers nor listed as not a policy's", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			inner := &everything{called: map[string]bool{}}
			cfg := DefaultConfig()
			cfg.NoBackground = true
			s := NewSticky(inner, cfg)
			call(s)
			if len(inner.called) == 0 {
				t.Fatalf("Sticky did not forward %s", name)
			}
		})
	}
	// io.Closer too: the router closes policies through it.
	inner := &everything{called: map[string]bool{}}
	var c io.Closer = NewSticky(inner, DefaultConfig())
	c.Close()
	if !inner.called["Close"] {
		t.Fatal("Sticky did not forward Close")
	}
	// As finds an interface through the wrapper.
	if _, ok := As[Coster](NewSticky(NewRoundRobin(), DefaultConfig())); !ok {
		t.Fatal("As did not reach through the wrapper") // Sticky itself is a Coster
	}
	if _, ok := As[*RoundRobin](NewSticky(NewRoundRobin(), DefaultConfig())); !ok {
		t.Fatal("As did not unwrap to the inner policy")
	}
}
