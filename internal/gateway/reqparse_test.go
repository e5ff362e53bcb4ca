package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/policy"
)

func TestParseBody(t *testing.T) {
	cases := []struct {
		name   string
		kind   routeKind
		body   string
		model  string
		stream bool
		text   string
		bad    bool
	}{
		{name: "chat strings", kind: kindChat, body: `{"model":"m","stream":true,"messages":[{"role":"system","content":"sys. "},{"role":"user","content":"hi"}]}`, model: "m", stream: true, text: "sys. hi"},
		{name: "chat parts", kind: kindChat, body: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x"}},{"text":"b","type":"text"}]}]}`, text: "ab"},
		{name: "chat null content", kind: kindChat, body: `{"messages":[{"role":"assistant","content":null,"tool_calls":[]},{"role":"user","content":"q"}]}`, text: "q"},
		{name: "chat escapes", kind: kindChat, body: `{"messages":[{"content":"a\"b\\c\n\u00e9\ud83d\ude00"}]}`, text: "a\"b\\c\né😀"},
		{name: "completion string", kind: kindCompletion, body: `{"model":"m","prompt":"once"}`, model: "m", text: "once"},
		{name: "completion array", kind: kindCompletion, body: `{"prompt":["first","second"]}`, text: "first"},
		{name: "completion tokens", kind: kindCompletion, body: `{"prompt":[1,2,3]}`, text: ""},
		{name: "generate", kind: kindGenerate, body: `{"text":"gen","sampling_params":{"max_new_tokens":8},"stream":false}`, text: "gen"},
		{name: "generate ids", kind: kindGenerate, body: `{"input_ids":[1,2]}`, text: ""},
		{name: "embedding", kind: kindEmbedding, body: `{"input":"emb","model":"e"}`, model: "e", text: "emb"},
		{name: "fields of other routes ignored", kind: kindChat, body: `{"prompt":"p","messages":[{"content":"c"}]}`, text: "c"},
		{name: "messages: system string first", kind: kindMessages, body: `{"messages":[{"role":"user","content":"q"}],"system":"sys. ","max_tokens":4}`, text: "sys. q"},
		{name: "messages: system blocks, tool and image blocks add none", kind: kindMessages, body: `{"system":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"tools":[{"name":"t","description":"not text"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"c"},{"type":"tool_result","tool_use_id":"x","content":"r"}]}]}`, text: "abc"},
		{name: "messages: system not text", kind: kindMessages, body: `{"system":5,"messages":[]}`, bad: true},
		{name: "messages: messages not an array", kind: kindMessages, body: `{"messages":"hi"}`, bad: true},
		{name: "malformed", kind: kindChat, body: `{"messages":[`, bad: true},
		{name: "array body", kind: kindChat, body: `[]`, bad: true},
		{name: "model not string", kind: kindChat, body: `{"model":3}`, bad: true},
		{name: "stream not bool", kind: kindChat, body: `{"stream":"yes"}`, bad: true},
		{name: "messages not array", kind: kindChat, body: `{"messages":{}}`, bad: true},
		{name: "message not object", kind: kindChat, body: `{"messages":["hi"]}`, bad: true},
		{name: "prompt number", kind: kindCompletion, body: `{"prompt":5}`, bad: true},
		{name: "bad escape in the routing text", kind: kindChat, body: `{"messages":[{"content":"a\qb"}]}`, bad: true},
		{name: "control character in the routing text", kind: kindCompletion, body: "{\"prompt\":\"a\x01\"}", bad: true},
		{name: "bad escape in a key", kind: kindChat, body: `{"x\q":1}`, bad: true},
		{name: "bad escape in the model", kind: kindChat, body: `{"model":"\q"}`, bad: true},
		{name: "unterminated string past the cap", kind: kindCompletion, body: `{"prompt":"` + strings.Repeat("x", 2000), bad: true},
		// Left to the worker's parser: faults inside strings the gateway never decodes.
		{name: "bad escape in a skipped member", kind: kindChat, body: `{"tools":"\q","messages":[{"content":"ok"}]}`, text: "ok"},
		{name: "bad escape past the cap", kind: kindCompletion, body: `{"prompt":"` + strings.Repeat("x", 2000) + `\q"}`, text: strings.Repeat("x", 1024)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseBody([]byte(tc.body), nil, tc.kind, 1024)
			if tc.bad {
				if !errors.Is(err, errBadBody) {
					t.Fatalf("err = %v, want a bad-body error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Model != tc.model || p.Stream != tc.stream || p.Text != tc.text {
				t.Errorf("got %+v, want model %q stream %v text %q", p, tc.model, tc.stream, tc.text)
			}
		})
	}
}

func TestParseBodyTruncatesAtRuneBoundary(t *testing.T) {
	body := `{"messages":[{"content":"` + strings.Repeat("é", 100) + `"}]}`
	p, err := parseBody([]byte(body), nil, kindChat, 9)
	if err != nil {
		t.Fatal(err)
	}
	if p.Text != "éééé" || !utf8.ValidString(p.Text) {
		t.Errorf("text %q", p.Text)
	}
}

// refText computes the routing text with encoding/json, the naive model the scanner must match.
func refText(body []byte, kind routeKind) (string, bool) {
	var doc map[string]json.RawMessage
	if json.Unmarshal(body, &doc) != nil {
		return "", false
	}
	first := func(raw json.RawMessage) (string, bool) {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, true
		}
		var arr []json.RawMessage
		if json.Unmarshal(raw, &arr) == nil {
			if len(arr) > 0 && json.Unmarshal(arr[0], &s) == nil {
				return s, true
			}
			return "", true
		}
		return "", string(raw) == "null"
	}
	if kind == kindResponses {
		return refResponsesText(doc)
	}
	if kind == kindMessages {
		sys, ok := refSystem(doc["system"])
		if !ok {
			return "", false
		}
		text, ok := refText(body, kindChat)
		return sys + text, ok
	}
	field := map[routeKind]string{kindCompletion: "prompt", kindGenerate: "text", kindEmbedding: "input"}[kind]
	if kind != kindChat {
		raw, ok := doc[field]
		if !ok {
			return "", true
		}
		return first(raw)
	}
	raw, ok := doc["messages"]
	if !ok {
		return "", true
	}
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil {
		return "", false
	}
	var b strings.Builder
	for _, m := range msgs {
		if m == nil {
			return "", false
		}
		var s string
		if json.Unmarshal(m["content"], &s) == nil {
			b.WriteString(s)
			continue
		}
		var parts []json.RawMessage
		if json.Unmarshal(m["content"], &parts) == nil {
			refParts(&b, parts)
		}
	}
	return b.String(), true
}

// refSystem is the text of a Messages body's "system", by encoding/json: a string, or the text
// of its text blocks.
func refSystem(raw json.RawMessage) (string, bool) {
	if raw == nil || string(raw) == "null" {
		return "", true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return "", false
	}
	var b strings.Builder
	refParts(&b, parts)
	return b.String(), true
}

// refParts appends the text of chat-style content parts: the "text" of each part whose "type",
// when it is a string, is "text" (keys matched exactly, as the gateway matches them).
func refParts(b *strings.Builder, parts []json.RawMessage) {
	for _, pr := range parts {
		var part map[string]json.RawMessage
		if json.Unmarshal(pr, &part) != nil || part == nil {
			continue
		}
		var typ, text string
		if t, ok := part["type"]; ok && json.Unmarshal(t, &typ) == nil && typ != "text" {
			continue
		}
		if tr, ok := part["text"]; ok && json.Unmarshal(tr, &text) == nil {
			b.WriteString(text)
		}
	}
}

// refResponsesText is the routing text of a Responses body, by encoding/json: instructions,
// then the input's text.
func refResponsesText(doc map[string]json.RawMessage) (string, bool) {
	var b strings.Builder
	if raw, ok := doc["instructions"]; ok && string(raw) != "null" {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		b.WriteString(s)
	}
	raw, ok := doc["input"]
	if !ok {
		return b.String(), true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return b.String() + s, true
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return "", false
	}
	for _, it := range items {
		var item map[string]json.RawMessage
		if json.Unmarshal(it, &item) != nil || item == nil {
			continue
		}
		c, ok := item["content"]
		if !ok {
			continue
		}
		if json.Unmarshal(c, &s) == nil {
			b.WriteString(s)
			continue
		}
		var parts []json.RawMessage
		if json.Unmarshal(c, &parts) != nil {
			continue
		}
		for _, pr := range parts {
			var part map[string]json.RawMessage
			if json.Unmarshal(pr, &part) != nil || part == nil {
				continue
			}
			typ, text := "text", "" // a part without a type, or with one not a string, is text
			if t, ok := part["type"]; ok && json.Unmarshal(t, &typ) != nil {
				typ = "text"
			}
			tr, ok := part["text"]
			if !ok || json.Unmarshal(tr, &text) != nil {
				continue
			}
			if typ == "input_text" || typ == "output_text" || typ == "text" {
				b.WriteString(text)
			}
		}
	}
	return b.String(), true
}

func TestParseResponsesBody(t *testing.T) {
	cases := []struct {
		name, body, text, prev string
		bad                    bool
	}{
		{name: "string input", body: `{"model":"m","input":"hello"}`, text: "hello"},
		{name: "instructions first, whatever the order", body: `{"input":"q","instructions":"sys. "}`, text: "sys. q"},
		{name: "items", body: `{"input":[{"role":"user","content":"a"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"b"}]},{"role":"user","content":[{"type":"input_text","text":"c"},{"type":"input_image","image_url":"http://x"}]},{"type":"function_call_output","call_id":"1","output":"o"}]}`, text: "abc"},
		{name: "previous id", body: `{"input":"x","previous_response_id":"resp_9"}`, text: "x", prev: "resp_9"},
		{name: "null previous id and instructions", body: `{"input":"x","previous_response_id":null,"instructions":null}`, text: "x"},
		{name: "input number", body: `{"input":1}`, bad: true},
		{name: "instructions array", body: `{"input":"x","instructions":[]}`, bad: true},
		{name: "previous id number", body: `{"input":"x","previous_response_id":3}`, bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := parseBody([]byte(c.body), nil, kindResponses, 8192)
			if c.bad {
				if err == nil {
					t.Fatalf("accepted %s", c.body)
				}
				return
			}
			if err != nil || p.Text != c.text || p.PreviousResponseID != c.prev {
				t.Fatalf("text %q prev %q err %v; want %q %q", p.Text, p.PreviousResponseID, err, c.text, c.prev)
			}
		})
	}
	// The cap holds across the two members.
	p, err := parseBody([]byte(`{"instructions":"`+strings.Repeat("i", 10)+`","input":"`+strings.Repeat("x", 10)+`"}`), nil, kindResponses, 15)
	if err != nil || p.Text != strings.Repeat("i", 10)+strings.Repeat("x", 5) || p.TextBytes != 20 {
		t.Fatalf("capped text %q (%d bytes in all), err %v", p.Text, p.TextBytes, err)
	}
}

func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
		`{"messages":[{"content":[{"type":"text","text":"a\u00e9"},{"type":"image_url"}]}]}`,
		`{"prompt":["x","y"],"stream":true}`,
		`{"text":"t\"q","input":"i"}`,
		`{"messages":[{"content":"\ud800x"}]}`,
		`{"a":[{"b":"}"}],"prompt":"z"}`,
		`not json`,
		`{"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"q"}]}]}`,
		`{"cache_salt":"s1","prompt_cache_key":"k","conversation":{"id":"c"},"messages":[{"content":"x"}]}`,
		`{"cache_salt":"s1","cache_salt":3,"conversation":"c","conversation":{"id":1}}`,
		`{"instructions":"s","input":[{"content":[{"type":"input_text","text":"t"}]},{"content":"u"}],"previous_response_id":"r"}`,
	} {
		f.Add([]byte(s), uint8(0), uint16(64))
		f.Add([]byte(s), uint8(kindResponses), uint16(64))
		f.Add([]byte(s), uint8(kindMessages), uint16(64))
	}
	f.Fuzz(func(t *testing.T, body []byte, k uint8, limit uint16) {
		kind := routeKind(k % 6)
		lim := int(limit%2048) + 1
		p, err := parseBody(body, nil, kind, lim)
		// Read through an index of the body's quotes built as its bytes arrive: the same parse.
		var q jsonscan.Quotes
		for n := 0; n < len(body); {
			n = min(n+7, len(body))
			q.Add(body[:n])
		}
		if pq, qerr := parseBody(body, &q, kind, lim); fmt.Sprint(pq, qerr) != fmt.Sprint(p, err) {
			t.Fatalf("%q: with a quote index %v, %v; without %v, %v", body, pq, qerr, p, err)
		}
		if err != nil {
			if json.Valid(body) && strings.Contains(err.Error(), "malformed JSON") {
				t.Fatalf("%q: %v, but encoding/json accepts it", body, err)
			}
			return
		}
		if p.Salted {
			if !strings.HasPrefix(p.Text, "\x00cache_salt:") || len(p.Text) < policy.SaltMarkLen {
				t.Fatalf("a salted text %q does not open with the salt's mark", p.Text)
			}
			p.Text = p.Text[policy.SaltMarkLen:]
		}
		checkAffinity(t, body, &p.Affinity)
		if len(p.Text) > lim {
			t.Fatalf("text of %d bytes over the limit %d", len(p.Text), lim)
		}
		want, ok := refText(body, kind)
		if !ok || !utf8.Valid(body) || strings.Contains(string(body), `\u`) {
			return // invalid UTF-8 and lone surrogates are replaced differently; no panic is enough
		}
		if !strings.HasPrefix(want, p.Text) {
			t.Fatalf("text %q is not a prefix of %q", p.Text, want)
		}
		if len(want) <= lim && p.Text != want {
			t.Fatalf("text %q, want %q", p.Text, want)
		}
	})
}

// checkAffinity holds the parse's affinity fields to encoding/json's reading of a valid body: the
// last member of each name decides.
func checkAffinity(t *testing.T, body []byte, got *Affinity) {
	t.Helper()
	var doc map[string]json.RawMessage
	if !utf8.Valid(body) || strings.Contains(string(body), `\u`) || json.Unmarshal(body, &doc) != nil {
		return
	}
	str := func(raw json.RawMessage) string {
		var s string
		_ = json.Unmarshal(raw, &s)
		return s
	}
	var want Affinity
	want.PromptCacheKey = str(doc["prompt_cache_key"])
	want.Conversation = str(doc["conversation"])
	var obj map[string]json.RawMessage
	if json.Unmarshal(doc["conversation"], &obj) == nil && obj != nil {
		want.Conversation = str(obj["id"])
	}
	if salt := str(doc["cache_salt"]); salt != "" {
		want.Salt, want.Salted = kvevents.SaltDigest([]byte(salt)), true
	}
	if *got != want {
		t.Fatalf("%q: affinity %+v, want %+v", body, *got, want)
	}
}

// BenchmarkParseBody: the one pass over a chat body of 8 KiB of messages, plain and with the
// affinity members (cache_salt digested, prompt_cache_key kept), and a Messages body: the
// affinity members' cost is read as the ratio of the second to the first.
func BenchmarkParseBody(b *testing.B) {
	msgs := `"messages":[{"role":"system","content":"` + strings.Repeat("You are a careful assistant. ", 200) + `"},{"role":"user","content":"` + strings.Repeat("question ", 300) + `"}]`
	for _, tc := range []struct {
		name string
		kind routeKind
		body string
	}{
		{"chat", kindChat, `{"model":"m","stream":true,"max_tokens":64,` + msgs + `}`},
		{"chat+affinity", kindChat, `{"model":"m","stream":true,"max_tokens":64,"cache_salt":"tenant-0042-secret","prompt_cache_key":"conv-7f3a",` + msgs + `}`},
		{"messages", kindMessages, `{"model":"m","stream":true,"max_tokens":64,"system":"` + strings.Repeat("You are a careful assistant. ", 200) + `",` + msgs + `}`},
	} {
		body := []byte(tc.body)
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := parseBody(body, nil, tc.kind, 8192); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
