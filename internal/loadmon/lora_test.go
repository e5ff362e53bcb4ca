package loadmon

import (
	"slices"
	"testing"
)

// The latest lora_requests_info sample wins; its lists are read unescaped, sorted and unique.
func TestParseLoraRequestsInfo(t *testing.T) {
	body := []byte(`# TYPE vllm:lora_requests_info gauge
vllm:num_requests_running{model_name="m"} 2
vllm:num_requests_waiting{model_name="m"} 1
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="b,a,b",waiting_lora_adapters="c\"q"} 1.70000001e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="older",waiting_lora_adapters=""} 1.6e9
`)
	r, err := ParsePrometheus(body, RuntimeVLLM)
	if err != nil {
		t.Fatal(err)
	}
	l := r.LoRA
	if l == nil || l.MaxLoras != 4 || !slices.Equal(l.Running, []string{"a", "b"}) || !slices.Equal(l.Waiting, []string{`c"q`}) {
		t.Fatalf("lora %+v", l)
	}
	if !l.Serves("a") || l.Serves("c\"q") {
		t.Error("Serves is not the running list")
	}
	if r2, _ := ParsePrometheus(body[:140], RuntimeVLLM); r2.LoRA != nil {
		t.Errorf("no lora sample, got %+v", r2.LoRA)
	}
}

func FuzzLoraLabels(f *testing.F) {
	f.Add(`{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"}`)
	f.Fuzz(func(t *testing.T, s string) {
		l := parseLoraSample([]byte(s), 1)
		if len(l.Running) > MaxReportedAdapters || len(l.Waiting) > MaxReportedAdapters || l.MaxLoras < 0 || l.MaxLoras > maxLoraSlots {
			t.Fatalf("unbounded %+v", l)
		}
		if !slices.IsSorted(l.Running) {
			t.Fatal("unsorted")
		}
	})
}
