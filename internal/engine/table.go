package engine

// table maps block keys to slab indices: open addressing with linear probing, at most 3/4 full,
// deletion by backward shift (no tombstones, so probe runs stay short however many blocks are
// evicted). The keys are already well mixed (see chainKey); a Fibonacci multiply spreads them
// over the slots anyway. The zero value is an empty table.
type table struct {
	slots []slot
	shift uint // 64 - log2(len(slots))
	n     int  // occupied slots
}

// slot is one table entry; id 0 marks an empty slot (slab index 0 is the LRU sentinel).
type slot struct {
	key uint64
	id  blockID
}

const minTableSlots = 64

func (t *table) home(key uint64) int { return int(key * golden >> t.shift) }

// get returns the slab index of key, or 0 when key is absent.
func (t *table) get(key uint64) blockID {
	if t.n == 0 {
		return 0
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.id == 0 || s.key == key {
			return s.id
		}
	}
}

// find returns the slot holding key and true, or the empty slot where key would be inserted and
// false (-1 when the table has no slots yet).
func (t *table) find(key uint64) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.id == 0 {
			return i, false
		}
		if s.key == key {
			return i, true
		}
	}
}

// insertAt stores key → id in slot i, which find(key) returned with false; it grows the table
// first when needed (the slot is then looked up again).
func (t *table) insertAt(i int, key uint64, id blockID) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
		i, _ = t.find(key)
	}
	t.slots[i] = slot{key, id}
	t.n++
}

// grow doubles the table (or creates it) and re-inserts every entry.
func (t *table) grow() {
	old := t.slots
	size := max(minTableSlots, 2*len(old))
	t.slots = make([]slot, size)
	t.shift = 64
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
	mask := size - 1
	for _, s := range old {
		if s.id == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].id != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// remove deletes key, which must be present, shifting back the entries of its probe run that
// would otherwise become unreachable.
func (t *table) remove(key uint64) {
	i, _ := t.find(key)
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].id != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i when i lies on its probe path, between its
		// home and j.
		h := t.home(t.slots[j].key)
		if (i-h)&mask < (j-h)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}
