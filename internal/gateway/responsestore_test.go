package gateway

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// The official SDK's stored-response calls (Get, InputItems.List, Delete) reach the worker that
// holds each response through the gateway, whichever worker round_robin would pick next: each
// of the two engines holds only the responses it gave, and answers 404 for the other's. An id
// the gateway never saw, and one deleted, are answered 404 in the OpenAI shape.
func TestStoredResponsesReachTheirWorker(t *testing.T) {
	g, client, ctx := responsesRig(t, 2, 20*time.Second)
	var ids []string
	for _, q := range []string{"first question", "second question", "third question"} {
		ids = append(ids, newTurn(t, ctx, client, q, "").ID)
	}
	for round := range 2 { // every id twice, so round_robin would have sent one of the two to the other engine
		for i, id := range ids {
			got, err := client.Responses.Get(ctx, id, responses.ResponseGetParams{})
			if err != nil {
				t.Fatalf("round %d: get %s: %v", round, id, err)
			}
			if got.ID != id || got.Status != "completed" || got.OutputText() == "" {
				t.Fatalf("get %s: id %q status %q text %q", id, got.ID, got.Status, got.OutputText())
			}
			items, err := client.Responses.InputItems.List(ctx, id, responses.InputItemListParams{})
			if err != nil {
				t.Fatalf("input items of %s: %v", id, err)
			}
			want := []string{"first question", "second question", "third question"}[i]
			if len(items.Data) != 1 {
				t.Fatalf("input items of %s: %d, want 1", id, len(items.Data))
			}
			if c := items.Data[0].AsMessage().Content; len(c) != 1 || c[0].Text != want {
				t.Fatalf("input items of %s: %+v, want the text %q", id, c, want)
			}
		}
	}
	if err := client.Responses.Delete(ctx, ids[0]); err != nil {
		t.Fatalf("delete: %v", err)
	}
	// The gateway forgets the id once the worker's answer is relayed, which the client may read
	// a moment before the handler returns.
	testutil.Until(t, func() bool { _, ok := g.responses.lookup(ids[0]); return !ok }, "the deleted response to be forgotten")
	for _, id := range []string{ids[0], "resp_never_seen"} {
		_, err := client.Responses.Get(ctx, id, responses.ResponseGetParams{})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "response_not_found" {
			t.Fatalf("get %s: %v, want a 404 response_not_found", id, err)
		}
	}
	// A follow-up of a kept response still reaches its worker.
	if _, err := client.Responses.New(ctx, turn("and then?", ids[1])); err != nil {
		t.Fatalf("follow-up after the routes: %v", err)
	}
}

// A stored response whose worker left the pool is forgotten and answered 404 (its memory went
// with it); a malformed id never reaches a worker.
func TestStoredResponseWorkerGone(t *testing.T) {
	g, client, ctx := responsesRig(t, 1, 10*time.Second)
	r := newTurn(t, ctx, client, "hello", "")
	for _, w := range g.reg.View().All {
		if _, err := g.reg.Remove(w.ID); err != nil {
			t.Fatal(err)
		}
	}
	_, err := client.Responses.Get(ctx, r.ID, responses.ResponseGetParams{})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("get after its worker left: %v, want 404", err)
	}
	if _, ok := g.responses.lookup(r.ID); ok {
		t.Fatal("the id of a response whose worker left is still remembered")
	}
	resp, err := http.Get(g.srv.URL + "/v1/responses/bad%01id")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("malformed id: %d, want 404", resp.StatusCode)
	}
}
