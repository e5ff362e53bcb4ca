package policy

// Balance is cache_aware's request-count balance rule (DESIGN.md §3): the pool is imbalanced
// when the most loaded worker has more than Abs requests above the least loaded and more than Rel
// times its load. Policies that must judge balance exactly as cache_aware does (the fleet
// simulator's oracle) use it rather than copy it.
type Balance struct {
	// Abs is balance_abs_threshold; Rel is balance_rel_threshold.
	Abs int64
	Rel float64
}

// BalanceOf returns the balance rule of cfg.
func BalanceOf(cfg CacheAwareConfig) Balance {
	return Balance{Abs: cfg.BalanceAbsThreshold, Rel: cfg.BalanceRelThreshold}
}

// Imbalanced reports whether loads minLoad and maxLoad, the least and the most of a pool, make
// it imbalanced.
func (b Balance) Imbalanced(minLoad, maxLoad int64) bool {
	return maxLoad-minLoad > b.Abs && float64(maxLoad) > b.Rel*float64(minLoad)
}

// Within reports whether a worker of the given load may take a request without making a pool
// whose least loaded worker has minLoad imbalanced.
func (b Balance) Within(load, minLoad int64) bool { return !b.Imbalanced(minLoad, load) }
