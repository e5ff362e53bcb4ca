package main

import (
	"io"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/flow"
)

func TestFlowFlags(t *testing.T) {
	o, err := parseServe([]string{"--queue", "--queue-timeout", "5s", "--max-queue-requests", "10",
		"--tenant", "chat:weight=4,priority=5", "--tenant", "*:rps=50,tps=1000", "--tenant-header", "X-Tenant",
		"--worker-urls", "http://a:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f := o.gw.Flow
	if !f.Enabled || f.Timeout != 5*time.Second || f.MaxRequests != 10 || f.TenantHeader != "X-Tenant" {
		t.Errorf("flow config %+v", f)
	}
	want := []flow.Tenant{{Name: "chat", Weight: 4, Priority: 5}, {Name: flow.OtherTenant, Weight: 1, RequestsPerSecond: 50, TokensPerSecond: 1000}}
	if len(f.Tenants) != 2 || f.Tenants[0] != want[0] || f.Tenants[1] != want[1] {
		t.Errorf("tenants %+v, want %+v", f.Tenants, want)
	}
	for _, bad := range [][]string{
		{"--tenant", "bad name"},
		{"--tenant", "a:weight=x"},
		{"--tenant", "a:colour=red"},
		{"--tenant", "a:weight=0.5", "--tenant", "a"},
		{"--tenant", "a:weight=-1"},
		{"--queue-max-kv-usage", "2"},
	} {
		if _, err := parseServe(append(bad, "--worker-urls", "http://a:1"), io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if o, _ := parseServe([]string{"--worker-urls", "http://a:1"}, io.Discard); o.gw.Flow.Enabled {
		t.Error("the queue is on by default")
	}
}
