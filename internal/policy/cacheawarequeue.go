package policy

// Queue rule of cache_aware_hash's placement behind one gateway (docs/routing.md §8.6, "New
// prompts on a queueing fleet, one gateway"). An engine queues (reports waiting requests) only
// once its batch or its KV cache is full, so on a fleet that queues a new prompt's wait depends
// on which engine frees a slot first, and a rendezvous owner is as likely as any to be the
// fullest. Several replicas need the owner to agree on where a new prompt lives; a replica that
// judges itself the fleet's only gateway (soloReplicas) gains nothing from that agreement, so
// there, while some engine queues, a new prompt goes to the least loaded worker within the
// bounds instead (cache_aware's rule for a miss). Hits are unchanged: a holder, queued or not,
// saves the prefill.
//
// The rule applies only where neither the backlog rule (prefill-bound fleet, cacheawarewait.go)
// nor the rotation (decode-bound fleet, cacheawarerotate.go) places the prompt, and only on a
// uniform fleet (uniformPace) whose measured prefill rates do not differ (cacheawarespeed.go):
// there the request count is a fair measure of an engine's load. Measured on the saturated
// small-batch multi-turn shape (4 engines × 8 slots, 4 conv/s, seeds 1 / 2): TTFT p99 10.9 s /
// 6.90 s → 10.2 s / 6.18 s, against cache_aware's 10.2 s / 6.12 s. Passing over queued owners
// in rendezvous order instead reached 10.4 s / 6.33 s, and made one seed of shared-prefix on a
// mixed fleet worse (592 → 929 ms); without the pace check the least loaded rule did the same
// there (555 / 592 → 819 / 929 ms).

// leastOnQueue reports whether a new prompt goes to the least loaded worker rather than its
// rendezvous owner: this replica judges itself the fleet's only gateway, some candidate's fresh
// report shows waiting requests, and the engines decode at a similar pace.
func (p *CacheAwareHash) leastOnQueue(av []cand) bool {
	return p.solo(av) && p.anyQueued(av) && p.uniformPace(av)
}
