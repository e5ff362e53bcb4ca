package policy

import (
	"context"

	"github.com/kvgate/kvgate/internal/worker"
)

// Precise routing's I/O happens before the decision. Pick runs under no lock that the I/O
// could hold up, but it runs inside the proxy's retry loop, after flow control admitted the
// request, on the loads it reads: a tokenizer that answers slowly there makes every term staler
// and a decision's time unbounded. So the prompt's tokens are fetched by Prepare, which the
// gateway calls once per request with the request's context, before admission (whose BestCost
// reads them) and the first pick; Pick and BestCost only read what it left on the Request, and
// a request nobody prepared is routed by the tree (fallback_tokenizer), never tokenized.

// Preparer is implemented by policies that need I/O before they can decide (precise_prefix:
// the prompt's tokens from an engine's tokenizer). Prepare does it under ctx (the request's:
// it ends when the client leaves) and keeps the result on req for Pick and BestCost; a failure
// is kept too (the pick then takes its fallback). Candidates are those the request may go to.
type Preparer interface {
	Prepare(ctx context.Context, candidates []*worker.Worker, req *Request)
}

// Prepare prepares req for p's decisions if p (or, as a wrapper decides, a policy it wraps)
// needs to; callers call it once per request before Choose, and again only for another policy
// or candidate pool (a disaggregated pair's other side).
func Prepare(ctx context.Context, p Policy, candidates []*worker.Worker, req *Request) {
	if pr, ok := p.(Preparer); ok && req != nil {
		pr.Prepare(ctx, candidates, req)
	}
}

// prepared is what Prepare left on a Request for precise routing.
type prepared struct {
	done   bool
	toks   []uint32 // the prompt's tokens; nil when there are none
	branch int      // the fallback branch when there are none (coNoEvents, coTokenizer)
}

var _ Preparer = (*Cost)(nil)

// Prepare fetches the prompt's tokens for precise_prefix (the other cost policies need none):
// from the engine the prompt's opening names (tokenPlan), under ctx and the tokenizer's own
// deadline. The tokens are kept on req whatever the outcome, with the fallback branch when
// there are none.
func (p *Cost) Prepare(ctx context.Context, candidates []*worker.Worker, req *Request) {
	if p.src != fromEvents || !p.eventsAnswer(req) { // loraevents.go
		return
	}
	via, branch := p.tokenPlan(candidates, req)
	req.prep = prepared{done: true, branch: branch}
	if via == nil {
		return
	}
	toks, err := p.kv.Tokenize(ctx, via, req.Model, req.Chat, req.Body, req.promptText())
	if err != nil || len(toks) == 0 {
		req.prep.branch = coTokenizer
		return
	}
	req.prep.toks, req.prep.branch = toks, -1
}

// preparedTokens returns the tokens Prepare left on req, or nil with the fallback branch: the
// events cannot answer (tokenPlan's verdict, which costs no I/O), or nobody prepared req.
func (p *Cost) preparedTokens(candidates []*worker.Worker, req *Request) ([]uint32, int) {
	if req.prep.done {
		return req.prep.toks, req.prep.branch
	}
	if _, branch := p.tokenPlan(candidates, req); branch == coNoEvents {
		return nil, coNoEvents
	}
	return nil, coTokenizer
}

// tokenPlan returns the worker to tokenize req's prompt by (the available candidate first in
// rendezvous order of the prompt's opening, so the same opening asks the same worker), or nil
// with coNoEvents when the events cannot answer for the candidates whatever the tokens.
func (p *Cost) tokenPlan(candidates []*worker.Worker, req *Request) (*worker.Worker, int) {
	if p.kv == nil || req.Text == "" && !req.Chat {
		return nil, coNoEvents
	}
	var idBuf [64]string
	ids := idBuf[:0]
	key := hashString(prefixChars(req.Text, placementChars))
	var via *worker.Worker
	var viaScore uint64
	for _, w := range candidates {
		if w.Available() {
			ids = append(ids, w.ID)
			if s := score(key, w.ID); via == nil || s > viaScore {
				via, viaScore = w, s
			}
		}
	}
	if _, ok := p.kv.(SaltedMatcher); req.Salted && !ok {
		return nil, coNoEvents
	}
	if via == nil || !p.covers(req.eventsModel(), ids, req.Salted || req.Adapter != "") { // partialkv.go: some engines may not have published; loraevents.go
		return nil, coNoEvents
	}
	return via, -1
}
