package gateway

import (
	"bytes"
	"net/http/httptest"
	"testing"
	"time"
)

// TestBigSteps checks the rounding of buffers above the largest class.
func TestBigSteps(t *testing.T) {
	for _, c := range []struct {
		n    int
		size int64
	}{
		{1<<maxClassShift + 1, 2 << bigStepShift},
		{100 << 20, 112 << 20},
		{128 << 20, 128 << 20},
		{maxBigSteps << bigStepShift, maxBigSteps << bigStepShift},
		{maxBigSteps<<bigStepShift + 1, maxBigSteps<<bigStepShift + 1}, // too large to pool: its own length
	} {
		if got := bufferSize(c.n); got != c.size {
			t.Errorf("bufferSize(%d) = %d, want %d", c.n, got, c.size)
		}
	}
}

// TestBigBodyPooledAndCharged reads a body above the largest class: its buffer is a whole number
// of steps, charged to the budget at that size, returned to the step's pool on release (so the
// next body of that size need not allocate one), and its bytes are the body's.
func TestBigBodyPooledAndCharged(t *testing.T) {
	p := &bodyPool{memory: newBodyBudget(BodyBudget{Bytes: 64 << 20, Wait: time.Millisecond})}
	body := bytes.Repeat([]byte("a"), 20<<20)
	r := httptest.NewRequest("POST", "/v1/chat/completions", bytes.NewReader(body))
	b, status, err := p.readBody(r, 32<<20)
	if err != nil {
		t.Fatalf("readBody: %d %v", status, err)
	}
	if !bytes.Equal(b.Bytes(), body) {
		t.Fatal("the body read differs from the body sent")
	}
	if got := len(*b.buf); got != 2<<bigStepShift {
		t.Errorf("buffer of %d bytes, want %d (two steps)", got, 2<<bigStepShift)
	}
	if used, _ := p.memory.held(); used != 2<<bigStepShift {
		t.Errorf("budget charged %d bytes, want %d", used, 2<<bigStepShift)
	}
	b.Release()
	if used, _ := p.memory.held(); used != 0 {
		t.Errorf("%d bytes still charged after release", used)
	}
	two, odd := make([]byte, 2<<bigStepShift), make([]byte, 2<<bigStepShift+1)
	if !p.big.putBig(&two) || p.big.putBig(&odd) {
		t.Error("the pools must take back buffers of whole steps, and only those")
	}
}
