package gateway

import "sync"

// Buffers above the largest pooled class (maxClass) are pooled too, in steps of bigStep bytes:
// a body of 100 MiB gets a 112 MiB buffer, and the next body of that size reuses it. Without
// them every such body left its whole buffer as garbage when it ended, and under a raised
// --max-payload-size the heap held the freed bodies beside the new ones until the collector ran
// (8 concurrent 100 MiB bodies under a 512 MiB budget peaked near 1 GB). The step bounds the
// waste of rounding: at most bigStep per body, and charged to the body budget as the buffer's
// real size. Like the classes', an idle buffer is dropped by the collector (sync.Pool).
const (
	bigStepShift = maxClassShift // 16 MiB steps
	// maxBigSteps is the largest pooled buffer in steps (1 GiB); larger ones are used once.
	maxBigSteps = 64
)

// bigPools holds the free buffers above maxClass, one pool per size in steps.
type bigPools [maxBigSteps + 1]sync.Pool // index k: buffers of k << bigStepShift bytes

// bigSteps returns the steps of the pooled buffer holding n bytes above maxClass, or 0 when n
// is too large to pool.
func bigSteps(n int) int {
	k := (n + 1<<bigStepShift - 1) >> bigStepShift
	if k > maxBigSteps {
		return 0
	}
	return k
}

// getBig returns a buffer of at least n bytes (n above maxClass): pooled when n fits a step.
func (p *bigPools) getBig(n int) *[]byte {
	k := bigSteps(n)
	if k == 0 {
		b := make([]byte, n)
		return &b
	}
	if v := p[k].Get(); v != nil {
		return v.(*[]byte)
	}
	b := make([]byte, k<<bigStepShift)
	return &b
}

// putBig returns buf to its step's pool and reports whether it had one; any other buffer is
// left to the collector.
func (p *bigPools) putBig(buf *[]byte) bool {
	n := len(*buf)
	k := n >> bigStepShift
	if k <= 1 || k > maxBigSteps || n != k<<bigStepShift {
		return false
	}
	p[k].Put(buf)
	return true
}

// bigSize is the size of the buffer getBig returns for n bytes.
func bigSize(n int) int64 {
	if k := bigSteps(n); k > 0 {
		return int64(k) << bigStepShift
	}
	return int64(n)
}
