package sim

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
)

// LoRA adapters, as vLLM serves them with --enable-lora: adapters named at start
// (Config.LoraModules, --lora-modules) or loaded at run time (POST /v1/load_lora_adapter, which
// vLLM allows with VLLM_ALLOW_RUNTIME_LORA_UPDATING; POST /v1/unload_lora_adapter), each listed in
// /v1/models with its base model as parent, requested by its name as the model, and reported in
// vllm:lora_requests_info. The engine's slot model (Config.Engine.MaxLoras) decides when a request
// for an adapter runs.

// Bounds on what a client may load: the simulator is a test server, but a loop that loads
// adapters must not grow it without end.
const (
	// MaxAdapters is the most adapters one server knows at once.
	MaxAdapters = 1024
	// maxAdapterName is the longest adapter name or path accepted, in bytes.
	maxAdapterName = 256
)

// LoraModule is one adapter a server knows: its name (the model id requests use) and its source.
type LoraModule struct {
	Name, Path string
}

// adapters is a server's known adapters; the zero value knows none.
type adapters struct {
	mu     sync.Mutex
	byName map[string]string // name → path
}

func (a *adapters) has(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.byName[name]
	return ok
}

// add records an adapter, reporting false when the name is taken or the table is full.
func (a *adapters) add(m LoraModule) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byName == nil {
		a.byName = map[string]string{}
	}
	if _, ok := a.byName[m.Name]; ok {
		return fmt.Errorf("the lora adapter '%s' has already been loaded", m.Name)
	}
	if len(a.byName) >= MaxAdapters {
		return fmt.Errorf("at most %d adapters may be loaded", MaxAdapters)
	}
	a.byName[m.Name] = m.Path
	return nil
}

func (a *adapters) remove(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.byName[name]
	delete(a.byName, name)
	return ok
}

// list returns the adapters sorted by name.
func (a *adapters) list() []LoraModule {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]LoraModule, 0, len(a.byName))
	for n, p := range a.byName {
		out = append(out, LoraModule{Name: n, Path: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ParseLoraModules parses --lora-modules: comma- or space-separated name=path pairs (vLLM's
// form; a bare name is its own path).
func ParseLoraModules(s string) ([]LoraModule, error) {
	var out []LoraModule
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		name, path, ok := strings.Cut(f, "=")
		if !ok {
			path = name
		}
		m := LoraModule{Name: strings.TrimSpace(name), Path: strings.TrimSpace(path)}
		if err := validAdapter(m); err != nil {
			return nil, fmt.Errorf("--lora-modules %q: %w", f, err)
		}
		if slices.ContainsFunc(out, func(o LoraModule) bool { return o.Name == m.Name }) {
			return nil, fmt.Errorf("--lora-modules: %q named twice", m.Name)
		}
		out = append(out, m)
	}
	if len(out) > MaxAdapters {
		return nil, fmt.Errorf("--lora-modules: %d adapters, at most %d", len(out), MaxAdapters)
	}
	return out, nil
}

// validAdapter checks an adapter's name and path: non-empty, bounded, printable, no comma (the
// metric's label lists adapters comma-separated).
func validAdapter(m LoraModule) error {
	for _, s := range []string{m.Name, m.Path} {
		if s == "" || len(s) > maxAdapterName {
			return fmt.Errorf("adapter names and paths must be 1 to %d bytes", maxAdapterName)
		}
		if strings.ContainsAny(s, ",\"\\") || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("adapter names and paths must not hold commas, quotes, backslashes or control characters")
		}
	}
	return nil
}

// registerLoraFlags defines --lora-modules, --max-loras and --lora-load-time on fs.
func registerLoraFlags(fs *flag.FlagSet, f *Flags) {
	fs.StringVar(&f.loraModules, "lora-modules", "", "LoRA adapters served, comma-separated name=path (vLLM's --lora-modules); each is a model id whose parent is --model")
	fs.IntVar(&f.cfg.Engine.MaxLoras, "max-loras", 0, "adapter slots: most adapters running at once (vLLM's --max-loras); a request for an adapter in no slot waits for one and pays --lora-load-time (0: adapters always run)")
	fs.DurationVar(&f.cfg.Engine.LoraLoad, "lora-load-time", engine.DefaultLoraLoad, "time to load an adapter into a slot")
}

// adapterOf returns the adapter a request's model names, "" for the base model or an empty
// model, and whether the model is served at all.
func (s *Server) adapterOf(model string) (adapter string, ok bool) {
	switch {
	case model == "" || model == s.cfg.Model:
		return "", true
	case s.loras.has(model):
		return model, true
	}
	return "", false
}

// modelEntry is one entry of /v1/models, as vLLM lists it (adapters with root and parent).
type modelEntry struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// models lists the base model and then every adapter, parented to it.
func (s *Server) models() []modelEntry {
	base := modelEntry{ID: s.cfg.Model, Object: "model", Created: s.start.Unix(), OwnedBy: s.cfg.Flavor,
		Root: s.cfg.Model, MaxModelLen: s.cfg.Engine.KVTokens}
	out := []modelEntry{base}
	for _, m := range s.loras.list() {
		parent := s.cfg.Model
		e := base
		e.ID, e.Root, e.Parent = m.Name, m.Path, &parent
		out = append(out, e)
	}
	return out
}

// handleLoadLora serves POST /v1/load_lora_adapter {"lora_name", "lora_path"}: the adapter is
// known from then on, and loads into a slot when a request first needs it.
func (s *Server) handleLoadLora(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if !readJSON(w, r, &b) {
		return
	}
	m := LoraModule{Name: b.Name, Path: b.Path}
	if err := validAdapter(m); err != nil || m.Name == s.cfg.Model {
		writeError(w, http.StatusBadRequest, "BadRequestError", "", "", "both 'lora_name' and 'lora_path' must be valid, and the name not the base model's")
		return
	}
	if err := s.loras.add(m); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "", "", "%v", err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", m.Name)
}

// handleUnloadLora serves POST /v1/unload_lora_adapter {"lora_name"}: the adapter is forgotten
// (its slot is freed once no running request holds it).
func (s *Server) handleUnloadLora(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Name string `json:"lora_name"`
	}
	if !readJSON(w, r, &b) {
		return
	}
	if !s.loras.remove(b.Name) {
		writeError(w, http.StatusNotFound, "NotFoundError", "", "", "The lora adapter '%s' cannot be found.", b.Name)
		return
	}
	s.mu.Lock()
	s.eng.Unload(s.since(), b.Name)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", b.Name)
}

// readJSON reads a bounded JSON body into v; on failure it answers the client (400 or 413) and
// reports false.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, ok := readBody(w, r)
	if !ok {
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "", "", "malformed JSON body")
		return false
	}
	return true
}

// writeLoraMetric appends vLLM's vllm:lora_requests_info: a gauge whose labels list the
// adapters of running and of waiting requests, comma-separated, and the slot count, and whose
// value is the time of the sample (vLLM writes its wall clock).
func writeLoraMetric(sb *strings.Builder, st engine.LoraState, now time.Time) {
	const name = "vllm:lora_requests_info"
	fmt.Fprintf(sb, "# HELP %s Running stats on lora requests.\n# TYPE %s gauge\n", name, name)
	fmt.Fprintf(sb, "%s{max_lora=\"%d\",running_lora_adapters=\"%s\",waiting_lora_adapters=\"%s\"} %s\n",
		name, st.MaxLoras, strings.Join(st.Running, ","), strings.Join(st.Waiting, ","),
		formatFloat(float64(now.UnixMilli())/1000))
}
