package main

import (
	"flag"

	"github.com/kvgate/kvgate/internal/fleet"
)

// addFleetSyncFlags registers the fleet simulator's replica sync model (kvgate bench --fleet).
func addFleetSyncFlags(fs *flag.FlagSet, m *fleet.SyncModel) {
	fs.BoolVar(&m.Enabled, "replica-sync", false, "fleet: the gateways share every decision over a modelled replica sync bus (kvgate serve --replica-sync)")
	fs.DurationVar(&m.Delay, "replica-sync-delay", 0, "fleet replica sync: the bus's one-way delay")
	fs.Float64Var(&m.Loss, "replica-sync-loss", 0, "fleet replica sync: share of batches lost per receiver, in [0, 1)")
	fs.DurationVar(&m.LostAt, "replica-sync-lost-at", 0, "fleet replica sync: virtual time at which the bus goes down for the rest of the run (0: never)")
}
