package sim

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind apiKind
		body string
		want request
		bad  bool
	}{
		{"chat string", chatAPI, `{"model":"m","messages":[{"role":"system","content":"ab"},{"role":"user","content":"cd"}],"max_tokens":3}`,
			request{model: "m", prompt: "abcd", maxTokens: 3}, false},
		{"chat parts", chatAPI, `{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{}},{"type":"text","text":"y"}]}],"max_completion_tokens":2,"max_tokens":9}`,
			request{prompt: "xy", maxTokens: 2}, false},
		{"chat stream usage", chatAPI, `{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true}}`,
			request{prompt: "q", stream: true, includeUsage: true}, false},
		{"chat null content", chatAPI, `{"messages":[{"role":"assistant","content":null},{"role":"user","content":"z"}]}`,
			request{prompt: "z"}, false},
		{"completion string", completionAPI, `{"prompt":"p","max_tokens":1}`, request{prompt: "p", maxTokens: 1}, false},
		{"completion strings", completionAPI, `{"prompt":["p","q"]}`, request{prompt: "p"}, false},
		{"completion ids", completionAPI, `{"prompt":[5,6]}`, request{tokens: []uint32{5, 6}}, false},
		{"completion id arrays", completionAPI, `{"prompt":[[7],[8]]}`, request{tokens: []uint32{7}}, false},
		{"generate text", generateAPI, `{"text":"t","sampling_params":{"max_new_tokens":4},"stream":true}`,
			request{prompt: "t", maxTokens: 4, stream: true}, false},
		{"generate ids", generateAPI, `{"input_ids":[1]}`, request{tokens: []uint32{1}}, false},
		{"malformed", chatAPI, `{"messages":`, request{}, true},
		{"trailing", chatAPI, `{"messages":[{"content":"a"}]} {}`, request{}, true},
		{"no messages", chatAPI, `{}`, request{}, true},
		{"number content", chatAPI, `{"messages":[{"content":5}]}`, request{}, true},
		{"empty prompt", completionAPI, `{"prompt":""}`, request{}, true},
		{"no prompt", completionAPI, `{"max_tokens":1}`, request{}, true},
		{"object prompt", completionAPI, `{"prompt":{}}`, request{}, true},
		{"negative id", completionAPI, `{"prompt":[-1]}`, request{}, true},
		{"zero max", completionAPI, `{"prompt":"a","max_tokens":0}`, request{}, true},
		{"generate nothing", generateAPI, `{}`, request{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRequest(tc.kind, []byte(tc.body))
			if tc.bad {
				if !errors.Is(err, errBadRequest) {
					t.Errorf("err = %v, want a bad request", err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":3,"stream":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"prompt":["a","b"],"max_tokens":2}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1],[2]]}`,
		`{"text":"t","sampling_params":{"max_new_tokens":4}}`, `{"input_ids":[4294967295]}`,
		`{"messages":null}`, `[]`, `null`, `{"prompt":1e400}`, ``,
	} {
		for k := range 3 {
			f.Add(uint8(k), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		r, err := parseRequest(apiKind(k%3), body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v is not a bad request", err)
			}
			return
		}
		if r.prompt == "" && len(r.tokens) == 0 {
			t.Fatal("accepted an empty prompt")
		}
		if r.maxTokens < 0 {
			t.Fatalf("negative max tokens %d", r.maxTokens)
		}
	})
}
