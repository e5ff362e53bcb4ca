package loadmon

import (
	"slices"
	"strconv"
	"strings"
)

// vLLM reports its LoRA adapters in one gauge, vllm:lora_requests_info, whose labels carry the
// state and whose value is the wall-clock time it was set:
//
//	vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7e9
//
// The gauge keeps every label set it was ever given, so a page holds many samples; the one with
// the latest time is the engine's state now (as llm-d reads it).

// Bounds on what a worker's LoRA report may hold, so that a hostile page cannot make every
// decision scan a long list.
const (
	// MaxReportedAdapters is the most adapter names kept per list (running, waiting).
	MaxReportedAdapters = 64
	// maxAdapterName is the longest adapter name kept, in bytes; longer names are dropped.
	maxAdapterName = 256
	// maxLoraSlots caps a reported max_lora.
	maxLoraSlots = 1 << 16
)

// LoRA is a worker's reported adapter state. The zero value means "not reported".
type LoRA struct {
	// Running lists the adapters of the requests it runs, Waiting those of the requests it
	// queues; each sorted, without repeats, at most MaxReportedAdapters.
	Running []string `json:"running_lora_adapters,omitempty"`
	Waiting []string `json:"waiting_lora_adapters,omitempty"`
	// MaxLoras is the number of adapter slots (vLLM's --max-loras).
	MaxLoras int64 `json:"max_lora"`
	// At is the sample's value: when the engine set it (seconds since the epoch).
	At float64 `json:"at"`
	// Has is set when the worker reported the gauge.
	Has bool `json:"has"`
}

// Serves reports whether adapter is running on the worker: its requests hold a slot.
func (l *LoRA) Serves(adapter string) bool {
	_, ok := slices.BinarySearch(l.Running, adapter)
	return ok
}

// parseLoraSample reads the labels of one lora_requests_info sample (the bytes from its '{',
// which skipLabels has checked is closed) into a LoRA stamped at.
func parseLoraSample(labels []byte, at float64) LoRA {
	l := LoRA{At: at, Has: true}
	eachLabel(labels, func(k, v string) {
		switch k {
		case "max_lora":
			if n, err := strconv.ParseFloat(v, 64); err == nil && n > 0 {
				l.MaxLoras = int64(min(n, maxLoraSlots))
			}
		case "running_lora_adapters":
			l.Running = adapterList(v)
		case "waiting_lora_adapters":
			l.Waiting = adapterList(v)
		}
	})
	return l
}

// adapterList splits a comma-separated label value into sorted, unique, bounded names.
func adapterList(v string) []string {
	var out []string
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if n == "" || len(n) > maxAdapterName || slices.Contains(out, n) {
			continue
		}
		if len(out) == MaxReportedAdapters {
			break
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// eachLabel calls fn with every name and unescaped value of a label set "{k="v",...}"; it stops
// at the first malformed pair.
func eachLabel(b []byte, fn func(k, v string)) {
	i := 1
	for i < len(b) {
		for i < len(b) && (b[i] == ' ' || b[i] == ',') {
			i++
		}
		start := i
		for i < len(b) && isNameByte(b[i], i == start) {
			i++
		}
		if i == start || i+1 >= len(b) || b[i] != '=' || b[i+1] != '"' {
			return
		}
		k := string(b[start:i])
		i += 2
		var v strings.Builder
		for ; i < len(b) && b[i] != '"'; i++ {
			c := b[i]
			if c == '\\' && i+1 < len(b) {
				i++
				c = b[i]
				if c == 'n' {
					c = '\n'
				}
			}
			v.WriteByte(c)
		}
		if i >= len(b) {
			return
		}
		i++ // the closing quote
		fn(k, v.String())
	}
}
