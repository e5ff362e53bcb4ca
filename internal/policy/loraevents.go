package policy

// LoRA adapters in precise routing. The engines' KV events key an adapter's blocks apart from
// the base model's and from every other adapter's (kvevents seeds a chain by the adapter's
// name), so an adapter's request is credited with exactly its own adapter's blocks, through
// AdapterMatcher. A KVView without it cannot answer for an adapter's request, which then falls
// back to its pool's tree, where the adapter's prefixes live apart too (a pool per model).

// AdapterMatcher is implemented by a KVView that keys chains by LoRA adapter: MatchAdapter is
// Match for a prompt of the adapter named adapter, with the cache salt of digest salt when
// salted. model is the model the engines' event topics name (the adapter's base model).
type AdapterMatcher interface {
	MatchAdapter(model, adapter string, salt uint64, salted bool, toks []uint32, workers []string, out []int) bool
}

// eventsAnswer reports whether the KV view can answer for req at all: an adapter's request
// needs an AdapterMatcher (a salted one a SaltedMatcher, checked by tokenize).
func (p *Cost) eventsAnswer(req *Request) bool {
	if req.Adapter == "" {
		return true
	}
	_, ok := p.kv.(AdapterMatcher)
	return ok
}

// eventsModel is the model whose event streams hold req's blocks: an adapter's base model
// (engines publish one stream per engine, its topic naming the base model), else req.Model.
func (req *Request) eventsModel() string {
	if req.Adapter != "" && req.Parent != "" {
		return req.Parent
	}
	return req.Model
}
