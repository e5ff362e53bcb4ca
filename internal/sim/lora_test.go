package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
)

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// An adapter named at start and one loaded at run time are listed with their parent, answer
// requests under their own name, show in vLLM's LoRA metric, and an unloaded one is gone.
func TestSimServesLoraAdapters(t *testing.T) {
	cfg := fastConfig()
	cfg.Flavor = FlavorVLLM
	cfg.Engine.MaxLoras = 2
	var err error
	if cfg.LoraModules, err = ParseLoraModules("sql=/adapters/sql"); err != nil {
		t.Fatal(err)
	}
	_, ts := startServer(t, cfg)
	if st, body := postJSON(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/adapters/chat"}`); st != 200 {
		t.Fatalf("load: %d %s", st, body)
	}
	if st, _ := postJSON(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/x"}`); st != 400 {
		t.Errorf("loading a loaded adapter again: %d, want 400", st)
	}
	resp, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	parents := map[string]string{}
	for _, m := range list.Data {
		p := "<nil>"
		if m.Parent != nil {
			p = *m.Parent
		}
		parents[m.ID] = p
	}
	if parents[DefaultModel] != "<nil>" || parents["sql"] != DefaultModel || parents["chat"] != DefaultModel {
		t.Fatalf("models and parents %v", parents)
	}
	c, ctx := sdk(ts), testCtx(t)
	p := chatParams(longPrompt, 3)
	p.Model = "sql"
	got, err := c.Chat.Completions.New(ctx, p)
	if err != nil || got.Model != "sql" {
		t.Fatalf("adapter request: %v, model %q", err, got.Model)
	}
	p.Model = "nope"
	if _, err := c.Chat.Completions.New(ctx, p); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown adapter: %v, want 404", err)
	}
	resp, err = http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}`) {
		t.Errorf("no idle lora_requests_info in:\n%s", body)
	}
	if _, err := loadmon.ParsePrometheus(body, loadmon.RuntimeVLLM); err != nil {
		t.Errorf("metrics do not parse: %v", err)
	}
	if st, _ := postJSON(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); st != 200 {
		t.Errorf("unload: %d", st)
	}
	if st, _ := postJSON(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); st != 404 {
		t.Errorf("unload twice: %d, want 404", st)
	}
	p.Model = "sql"
	if _, err := c.Chat.Completions.New(ctx, p); err == nil {
		t.Error("an unloaded adapter still answers")
	}
}

func TestParseLoraModules(t *testing.T) {
	for _, bad := range []string{"a=", "=b", "a=x,a=y", "a\"b=c", strings.Repeat("n", 300)} {
		if _, err := ParseLoraModules(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	ms, err := ParseLoraModules("a=/p/a b")
	if err != nil || len(ms) != 2 || ms[0] != (LoraModule{"a", "/p/a"}) || ms[1] != (LoraModule{"b", "b"}) {
		t.Errorf("got %v, %v", ms, err)
	}
}

func FuzzParseLoraModules(f *testing.F) {
	f.Add("a=/p/a,b")
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseLoraModules(s)
		if err != nil {
			return
		}
		for _, m := range ms {
			if validAdapter(m) != nil {
				t.Fatalf("accepted invalid %q", m)
			}
		}
	})
}
