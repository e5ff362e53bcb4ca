package engine

import (
	"math/rand/v2"
	"testing"
)

// FuzzTable checks the open-addressing table against a map under arbitrary inserts and removes.
// The keys (keyOf) share four home slots, so probe runs are long, wrap around the end of the
// table and get shifted back by removals.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 128, 129, 4, 130, 5})
	f.Add([]byte{7, 7, 135, 7, 6, 134, 5, 133})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var tb table
		ref := map[uint64]blockID{}
		next := blockID(1)
		for _, op := range ops {
			key := keyOf(op & 0x7f)
			if op&0x80 == 0 {
				if i, found := tb.find(key); !found {
					tb.insertAt(i, key, next)
					ref[key] = next
					next++
				}
			} else if _, ok := ref[key]; ok {
				tb.remove(key)
				delete(ref, key)
			}
			checkTable(t, &tb, ref)
		}
	})
}

// keyOf maps a small number to a key whose home slot, in a table of any size, is one of four:
// the quarter boundaries of the table (key·golden has b%4 in its top two bits and nothing else
// above bit 6). So the keys build long probe runs, the last of which wraps around the end.
func keyOf(b byte) uint64 {
	return (uint64(b%4)<<62 | uint64(b)) * goldenInverse()
}

// goldenInverse returns the multiplicative inverse of golden modulo 2^64 (Newton's iteration
// doubles the correct low bits each round).
func goldenInverse() uint64 {
	x := uint64(golden)
	for range 6 {
		x *= 2 - golden*x
	}
	return x
}

func checkTable(t *testing.T, tb *table, ref map[uint64]blockID) {
	t.Helper()
	if tb.n != len(ref) {
		t.Fatalf("table holds %d keys, want %d", tb.n, len(ref))
	}
	for k, id := range ref {
		if got := tb.get(k); got != id {
			t.Fatalf("get(%#x) = %d, want %d", k, got, id)
		}
	}
	for b := range 256 {
		if k := keyOf(byte(b) & 0x7f); tb.get(k) != ref[k] {
			t.Fatalf("get(%#x) = %d, want %d", k, tb.get(k), ref[k])
		}
	}
}

func TestTableChurn(t *testing.T) {
	var tb table
	ref := map[uint64]blockID{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200_000 {
		key := rng.Uint64N(3000)
		if _, ok := ref[key]; ok {
			tb.remove(key)
			delete(ref, key)
			continue
		}
		j, _ := tb.find(key)
		tb.insertAt(j, key, blockID(i+1))
		ref[key] = blockID(i + 1)
	}
	checkTable(t, &tb, ref)
}

func TestKeyOfClusters(t *testing.T) {
	var tb table
	tb.grow()
	for b := range 128 {
		if h, want := tb.home(keyOf(byte(b))), b%4*minTableSlots/4; h != want {
			t.Fatalf("home of keyOf(%d) = %d, want %d", b, h, want)
		}
	}
}
