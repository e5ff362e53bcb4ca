package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/gateway"
)

// addFlowFlags registers the flow-control flags (internal/flow, internal/gateway/flow.go). Only
// the operator sets them. What a client may choose is bounded by them: its priority only with a
// key given the priority permission ("NAME+priority=SECRET"), its tenant only by its key's name
// or, behind a trusted front, --tenant-header.
func addFlowFlags(fs *flag.FlagSet, c *gateway.FlowConfig) {
	d := flow.DefaultConfig()
	s := d.Saturation
	fs.BoolVar(&c.Enabled, "queue", false, "hold requests in a per-model queue at the gateway until an engine can take them, with priorities and fair share between tenants (off: every request goes to a worker on arrival)")
	fs.IntVar(&c.MaxRequests, "max-queue-requests", d.MaxRequests, "queue: requests one model's queue may hold (429 above)")
	fs.Int64Var(&c.MaxBytes, "max-queue-bytes", d.MaxBytes, "queue: request-body bytes one model's queue may hold (429 above)")
	fs.DurationVar(&c.Timeout, "queue-timeout", d.Timeout, "queue: how long a request may wait (then 429, or 503 when no worker is available)")
	fs.DurationVar(&c.Aging, "queue-aging", d.Aging, "queue: a waiting request's priority rises by one per this much wait, so that low bands are never starved (negative = strict bands)")
	fs.Float64Var(&c.Saturation.MaxWaiting, "queue-max-engine-waiting", s.MaxWaiting, "queue: requests an engine may hold waiting past its running batch and still take more (0 = none at an engine that states its batch, max_running_requests, else 2; negative = none)")
	fs.Float64Var(&c.Saturation.MaxKVUsage, "queue-max-kv-usage", s.MaxKVUsage, "queue: KV-cache usage (0-1] at which an engine takes no more")
	fs.DurationVar(&c.Saturation.MaxPredictedWait, "queue-max-predicted-wait", s.MaxPredictedWait, "queue: predicted wait before a new request's prefill starts (an engine's queued prefill over its prefill rate, as estimated between load reports) at which the engine takes no more; also the pool's, when the routing cost predicts it on the best engine")
	fs.Int64Var(&c.Saturation.DefaultSlots, "queue-default-slots", s.DefaultSlots, "queue: running batch an engine is taken to hold until it states one or its reports show it full")
	fs.Var((*tenantList)(&c.Tenants), "tenant", "a tenant's share and limits, NAME[:weight=W,priority=P,rps=R,tps=T] (repeatable; NAME is a key's name or a --tenant-header value; * = every other tenant; tps counts prompt tokens)")
	fs.StringVar(&c.TenantHeader, "tenant-header", "", "request header naming the tenant, before the key's name (only behind a trusted front that sets or strips it: any client can send it)")
}

// tenantList collects --tenant values.
type tenantList []flow.Tenant

func (l *tenantList) String() string {
	if l == nil {
		return ""
	}
	names := make([]string, len(*l))
	for i, t := range *l {
		names[i] = t.Name
	}
	return strings.Join(names, " ")
}

// Set parses NAME[:weight=W,priority=P,rps=R,tps=T].
func (l *tenantList) Set(v string) error {
	name, opts, _ := strings.Cut(strings.TrimSpace(v), ":")
	if name == "*" {
		name = flow.OtherTenant
	}
	if !flow.ValidTenantName(name) {
		return fmt.Errorf("tenant name %q: want 1-64 letters, digits, '_', '.' or '-', or *", name)
	}
	t := flow.Tenant{Name: name, Weight: 1}
	for _, kv := range strings.Split(opts, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("tenant %s: %q is not KEY=VALUE", name, kv)
		}
		var err error
		switch k {
		case "weight":
			t.Weight, err = strconv.ParseFloat(val, 64)
		case "priority":
			t.Priority, err = strconv.Atoi(val)
		case "rps":
			t.RequestsPerSecond, err = strconv.ParseFloat(val, 64)
		case "tps":
			t.TokensPerSecond, err = strconv.ParseFloat(val, 64)
		default:
			return fmt.Errorf("tenant %s: unknown setting %q (want weight, priority, rps or tps)", name, k)
		}
		if err != nil {
			return fmt.Errorf("tenant %s: %s=%q is not a number", name, k, val)
		}
	}
	*l = append(*l, t)
	return nil
}
