package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

const mooncakeSample = `{"timestamp": 0, "input_length": 32, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 250, "input_length": 32, "output_length": 5, "hash_ids": [0, 2]}

{"timestamp": 250, "input_length": 40, "output_length": 0, "hash_ids": [0, 1, 3], "extra": "ignored"}
{"timestamp": 1000, "input_length": 32, "output_length": 7, "hash_ids": [0, 1]}
{"timestamp": 1500.5, "input_length": 10, "output_length": 1, "hash_ids": [5]}
`

func TestParseMooncake(t *testing.T) {
	es, err := ParseMooncake(strings.NewReader(mooncakeSample), 16)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 5 || es[2].InputLength != 40 || len(es[2].HashIDs) != 3 || es[4].Timestamp != 1500.5 {
		t.Fatalf("parsed %+v", es)
	}
}

func TestParseMooncakeRejectsBadLinesWithLineNumber(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 32, "output_length": 5, "hash_ids": [0, 1]}` + "\n"
	for _, tc := range []struct{ line, want string }{
		{`{"timestamp": 0, "input_length": 32`, "bad JSON"},
		{`{"input_length": 32, "hash_ids": [1]}`, `missing "timestamp"`},
		{`{"timestamp": 0, "hash_ids": [1]}`, `missing "input_length"`},
		{`{"timestamp": 0, "input_length": 32}`, `missing "hash_ids"`},
		{`{"timestamp": "0", "input_length": 32, "hash_ids": [1]}`, "bad field"},
		{`{"timestamp": -1, "input_length": 32, "hash_ids": [1]}`, "timestamp"},
		{`{"timestamp": 0, "input_length": 0, "hash_ids": []}`, "input_length 0"},
		{`{"timestamp": 0, "input_length": 32, "output_length": -3, "hash_ids": [1]}`, "output_length"},
		{`{"timestamp": 0, "input_length": 16, "hash_ids": [1, 2]}`, "covers only 1 blocks"},
		{`{"timestamp": 0, "input_length": 16, "hash_ids": [-4]}`, "hash id -4"},
		{`{"timestamp": 0, "input_length": 16, "hash_ids": [1.5]}`, "bad field"},
		{`[1, 2]`, "bad JSON"},
	} {
		_, err := ParseMooncake(strings.NewReader(good+good+tc.line+"\n"), 16)
		if err == nil || !strings.Contains(err.Error(), "line 3:") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want line 3 and %q", tc.line, err, tc.want)
		}
	}
	_, err := ParseMooncake(strings.NewReader(`{"timestamp": 9, "input_length": 1, "hash_ids": [1]}`+"\n"+good), 16)
	if err == nil || !strings.Contains(err.Error(), "line 2:") || !strings.Contains(err.Error(), "before") {
		t.Errorf("decreasing timestamps: %v", err)
	}
	if _, err := ParseMooncake(strings.NewReader("\n\n"), 16); err == nil {
		t.Error("empty trace accepted")
	}
}

func FuzzParseMooncakeLine(f *testing.F) {
	for _, l := range strings.Split(mooncakeSample, "\n") {
		f.Add([]byte(l), 16)
	}
	f.Add([]byte(`{"timestamp": 1e400, "input_length": 1, "hash_ids": []}`), 512)
	f.Add([]byte(`{"timestamp": 0, "input_length": 99999999999, "hash_ids": [9007199254740993]}`), 1)
	f.Fuzz(func(t *testing.T, line []byte, bt int) {
		if bt < 1 || bt > 1<<16 {
			return
		}
		e, err := ParseMooncakeLine(line, bt)
		if err != nil {
			return
		}
		// What the parser accepts, replay must be able to serve.
		if e.InputLength < 1 || e.Timestamp < 0 || math.IsNaN(e.Timestamp) || len(e.HashIDs) > (e.InputLength+bt-1)/bt {
			t.Fatalf("accepted invalid entry %+v", e)
		}
		if bt <= 64 && e.InputLength <= 4096 {
			m, err := NewMooncake([]MooncakeEntry{e}, MooncakeOptions{BlockTokens: bt})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(m.Text(0)); got != 4*e.InputLength {
				t.Fatalf("text of %d bytes for input_length %d", got, e.InputLength)
			}
		}
	})
}

// TestMooncakeText: a hash id is the same text wherever it appears, different ids differ, and
// the last block is cut to input_length.
func TestMooncakeText(t *testing.T) {
	es, err := ParseMooncake(strings.NewReader(mooncakeSample), 16)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMooncake(es, MooncakeOptions{BlockTokens: 16, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	const blk = 16 * 4
	t0, t1, t2, t3 := m.Text(0), m.Text(1), m.Text(2), m.Text(3)
	switch {
	case len(t0) != 32*4 || len(t2) != 40*4:
		t.Fatalf("lengths %d, %d", len(t0), len(t2))
	case t0[:blk] != t1[:blk]:
		t.Error("block 0 differs between requests")
	case t0[blk:] == t1[blk:2*blk]:
		t.Error("blocks 1 and 2 have the same text")
	case t2[:2*blk] != t0 || t3 != t0:
		t.Error("shared blocks [0 1] are not shared text")
	}
	s, ok := m.Session(4)
	if !ok || s.At != 1500500*time.Microsecond || s.Turns[0].OutputTokens != 1 || !s.Timed {
		t.Fatalf("session 4: %+v", s)
	}
	// Window and time scale: [0.25 s, 1.2 s) keeps lines 1–3, starting at zero, twice as slow.
	w, err := NewMooncake(es, MooncakeOptions{BlockTokens: 16, From: 250 * time.Millisecond, To: 1200 * time.Millisecond, TimeScale: 2})
	if err != nil {
		t.Fatal(err)
	}
	if w.Len() != 3 {
		t.Fatalf("window holds %d requests, want 3", w.Len())
	}
	if s, _ := w.Session(2); s.At != 1500*time.Millisecond {
		t.Fatalf("scaled arrival %v, want 1.5s", s.At)
	}
	if _, err := NewMooncake(es, MooncakeOptions{From: time.Hour}); err == nil {
		t.Error("empty window accepted")
	}
}

// TestIdealHandBuilt checks the ideal hit rate of the sample trace against the value worked out
// by hand, with 16-token trace blocks on 16-token engine blocks:
//
//	line 1 [0 1], 32 tokens: nothing seen            → 0
//	line 2 [0 2], 32 tokens: block 0 seen            → 16
//	line 3 [0 1 3], 40 tokens: blocks 0, 1 seen; the cut block 3 (8 tokens) is no full block → 32
//	line 4 [0 1], 32 tokens: both blocks seen, but the last token is always computed → 31
//	line 5 [5], 10 tokens: no full block             → 0
//
// cached 79 of 146 prompt tokens: 0.5411.
func TestIdealHandBuilt(t *testing.T) {
	es, err := ParseMooncake(strings.NewReader(mooncakeSample), 16)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMooncake(es, MooncakeOptions{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	d := NewIdeal(16)
	for k := range m.Len() {
		d.Add(m.Text(k), true)
	}
	if got, want := d.HitRate(), math.Round(79.0/146*1e4)/1e4; got != want {
		t.Fatalf("ideal %v, want %v (79/146)", got, want)
	}
	// Unmeasured requests warm the ideal cache but do not count.
	d = NewIdeal(16)
	d.Add(m.Text(0), false)
	d.Add(m.Text(3), true)
	if got, want := d.HitRate(), math.Round(31.0/32*1e4)/1e4; got != want {
		t.Fatalf("warmed ideal %v, want %v", got, want)
	}
}

func TestMooncakeGen(t *testing.T) {
	g := NewMooncakeGen(7)
	g.Duration, g.ContextTokens = 5*time.Minute, 3000
	es, err := g.Generate()
	if err != nil {
		t.Fatal(err)
	}
	again, _ := g.Generate()
	var a, b bytes.Buffer
	if err := WriteMooncake(&a, es); err != nil {
		t.Fatal(err)
	}
	WriteMooncake(&b, again)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("same seed, different traces")
	}
	parsed, err := ParseMooncake(&a, 512)
	if err != nil {
		t.Fatalf("generated trace does not parse: %v", err)
	}
	if len(parsed) != len(es) {
		t.Fatalf("round trip: %d of %d lines", len(parsed), len(es))
	}
	rate := float64(len(es)) / g.Duration.Seconds()
	if rate < 2.4 || rate > 3.6 {
		t.Errorf("rate %.2f/s, want about 3", rate)
	}
	followUps := 0
	for i, e := range es {
		if e.HashIDs[0] != 0 {
			t.Fatalf("line %d does not open with the shared block", i)
		}
		if len(e.HashIDs) > 2 && e.HashIDs[1] < e.HashIDs[len(e.HashIDs)-1]-int64(len(e.HashIDs)) {
			followUps++ // its opening blocks are older than its tail: a resent history
		}
	}
	if followUps == 0 {
		t.Error("no conversation resent its history")
	}
	// Burstiness raises the variance of arrivals per 10 s, not their mean.
	g.Burstiness = 4
	bursty, _ := g.Generate()
	if cv(counts(es, 10000)) >= cv(counts(bursty, 10000)) {
		t.Errorf("burstiness 4 is not burstier: CV %.2f vs %.2f", cv(counts(es, 10000)), cv(counts(bursty, 10000)))
	}
}

func counts(es []MooncakeEntry, binMS float64) []float64 {
	var out []float64
	for _, e := range es {
		i := int(e.Timestamp / binMS)
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i]++
	}
	return out
}

func cv(xs []float64) float64 {
	m := mean(xs)
	v := 0.0
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	return math.Sqrt(v/float64(len(xs))) / m
}

// TestMooncakeAgentShape measures generated agent traces against the shape they promise: no
// block shared by every request, ideal reuse about 0.65, prompts of 2k to 190k tokens with a
// mean of about 15k, 3.9 req/s, and arrivals burstier than Poisson.
func TestMooncakeAgentShape(t *testing.T) {
	var rates []float64
	for seed := uint64(1); seed <= 3; seed++ {
		es, err := NewMooncakeAgentGen(seed).Generate()
		if err != nil {
			t.Fatal(err)
		}
		s := MeasureMooncake(es, 512)
		t.Log(s)
		if s.SharedByAll != 0 {
			t.Errorf("seed %d: %d blocks shared by every request", seed, s.SharedByAll)
		}
		if s.IdealReuse < 0.62 || s.IdealReuse > 0.68 {
			t.Errorf("seed %d: ideal reuse %.3f, want 0.65 ± 0.03", seed, s.IdealReuse)
		}
		if s.MeanInput < 14000 || s.MeanInput > 17000 || s.MinInput < 2000 || s.MaxInput > 190000 || s.MaxInput < 120000 {
			t.Errorf("seed %d: prompts %d–%d (mean %.0f), want 2k–190k with a mean of about 15k", seed, s.MinInput, s.MaxInput, s.MeanInput)
		}
		if s.GapCV < 1.3 {
			t.Errorf("seed %d: inter-arrival CV %.2f, want bursts (above 1.3; Poisson is 1)", seed, s.GapCV)
		}
		rates = append(rates, s.Rate)
	}
	// Bursts make one hour's rate vary by several per cent; the mean over seeds is close.
	if m := mean(rates); m < 3.9*0.92 || m > 3.9*1.08 {
		t.Errorf("mean rate %.2f/s over seeds %v, want 3.9", m, rates)
	}
	// The text the bench replays has the reuse the hash ids promise (a short window: text is
	// costly to make).
	es, _ := NewMooncakeAgentGen(1).Generate()
	m, err := NewMooncake(es, MooncakeOptions{To: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ideal := NewIdeal(16)
	for k := range m.Len() {
		ideal.Add(m.Text(k), true)
	}
	if want := MeasureMooncake(m.Entries(), 512).IdealReuse; math.Abs(ideal.HitRate()-want) > 0.01 {
		t.Errorf("the replayed text's ideal hit rate %.3f differs from the trace's reuse %.3f", ideal.HitRate(), want)
	}
}

func TestMeasureMooncake(t *testing.T) {
	es := []MooncakeEntry{
		{Timestamp: 0, InputLength: 1024, HashIDs: []int64{1, 2}},
		{Timestamp: 1000, InputLength: 1536, HashIDs: []int64{1, 2, 3}},
		{Timestamp: 3000, InputLength: 600, HashIDs: []int64{1, 4}},
	}
	s := MeasureMooncake(es, 512)
	// Hits: 0, 1024 (two blocks), 512 (one block) over 3160 prompt tokens.
	if s.Requests != 3 || s.SharedByAll != 1 || s.MinInput != 600 || s.MaxInput != 1536 ||
		math.Abs(s.IdealReuse-1536.0/3160) > 1e-9 || math.Abs(s.Rate-2.0/3) > 1e-9 || s.Span != 3*time.Second {
		t.Fatalf("shape = %+v", s)
	}
	// Gaps 1 s and 2 s: mean 1.5, standard deviation 0.5.
	if math.Abs(s.GapCV-1.0/3) > 1e-9 {
		t.Errorf("gap CV %v, want 1/3", s.GapCV)
	}
}

// TestMooncakeSpreadUndoesACoarseClock: three requests on one timestamp and two on the next,
// 3 s later, replayed with Spread 3 s arrive a second apart and 1.5 s apart, in their order;
// a Spread shorter than the gap spreads over the Spread only; the last timestamp spreads over
// the whole Spread; zero Spread keeps the recorded instants.
func TestMooncakeSpreadUndoesACoarseClock(t *testing.T) {
	es := []MooncakeEntry{{Timestamp: 0}, {Timestamp: 0}, {Timestamp: 0}, {Timestamp: 3000}, {Timestamp: 3000}}
	for i := range es {
		es[i].InputLength, es[i].OutputLength, es[i].HashIDs = 16, 1, []int64{int64(i)}
	}
	for _, tt := range []struct {
		spread time.Duration
		want   []time.Duration
	}{
		{0, []time.Duration{0, 0, 0, 3 * time.Second, 3 * time.Second}},
		{3 * time.Second, []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 4500 * time.Millisecond}},
		{300 * time.Millisecond, []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 3 * time.Second, 3150 * time.Millisecond}},
	} {
		m, err := NewMooncake(es, MooncakeOptions{BlockTokens: 16, Spread: tt.spread})
		if err != nil {
			t.Fatal(err)
		}
		for k, want := range tt.want {
			if s, _ := m.Session(k); s.At != want {
				t.Fatalf("spread %v: request %d at %v, want %v", tt.spread, k, s.At, want)
			}
		}
	}
	if _, err := NewMooncake(es, MooncakeOptions{Spread: -time.Second}); err == nil {
		t.Fatal("a negative spread was accepted")
	}
}
