package bench

import "fmt"

// WarmStats counts the warm-up requests a fleet run sent to the engines it added
// (policy.PlanWarm): none of them is a client request, so none is in the run's figures.
type WarmStats struct {
	// Sent counts warm requests sent; Failed those that did not succeed in time (or whose
	// worker left); Recorded the prefixes recorded for their new worker.
	Sent     int `json:"sent"`
	Failed   int `json:"failed"`
	Recorded int `json:"recorded"`
	// PromptTokens and CachedTokens are the engines' counts for the warm requests.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
}

// String summarizes the warm-ups on one line.
func (w WarmStats) String() string {
	return fmt.Sprintf("warm-up: %d requests, %d failed, %d prefixes recorded, %d prompt tokens (%d cached)",
		w.Sent, w.Failed, w.Recorded, w.PromptTokens, w.CachedTokens)
}
