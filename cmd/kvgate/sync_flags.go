package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/replicasync"
)

// addFleetSyncFlags registers the fleet simulator's replica sync model (kvgate bench --fleet).
func addFleetSyncFlags(fs *flag.FlagSet, m *fleet.SyncModel) {
	fs.BoolVar(&m.Enabled, "replica-sync", false, "fleet: the gateways share every decision over a modelled replica sync bus (kvgate serve --replica-sync)")
	fs.DurationVar(&m.Delay, "replica-sync-delay", 0, "fleet replica sync: the bus's one-way delay")
	fs.Float64Var(&m.Loss, "replica-sync-loss", 0, "fleet replica sync: share of batches lost per receiver, in [0, 1)")
	fs.DurationVar(&m.LostAt, "replica-sync-lost-at", 0, "fleet replica sync: virtual time at which the bus goes down for the rest of the run (0: never)")
}

// replicaSyncOptions are kvgate serve's replica sync flags.
type replicaSyncOptions struct {
	spec, creds, listen, keyFile string
	peers                        listFlag
}

// registerReplicaSyncFlags registers kvgate serve's replica sync flags.
func registerReplicaSyncFlags(fs *flag.FlagSet, o *replicaSyncOptions) {
	fs.StringVar(&o.spec, "replica-sync", "off", "share every routing decision with the other gateway replicas: off (one replica needs nothing), embedded (an in-process NATS server per replica, clustered on --replica-sync-listen with --replica-sync-peers), or an existing NATS cluster's nats:// or tls:// URLs, comma-separated")
	fs.StringVar(&o.creds, "replica-sync-creds", "", "replica sync, existing cluster: a NATS credentials file (else "+envSyncUser+"/"+envSyncPassword+" or "+envSyncToken+" from the environment)")
	fs.StringVar(&o.listen, "replica-sync-listen", "", "replica sync, embedded: the cluster address HOST:PORT peers dial (not the API port; beyond loopback it needs a key)")
	fs.Var(&o.peers, "replica-sync-peers", "replica sync, embedded: the peers' cluster addresses, nats://HOST:PORT, or a HOST:PORT name resolved to every address it has (a headless Service), comma-separated")
	fs.StringVar(&o.keyFile, "replica-sync-key-file", "", "replica sync: a file holding the cluster's secret (at least 16 bytes; else "+envSyncKey+"): it keys the prefix hashes and, embedded, authenticates the cluster port")
}

// Environment variables of the replica sync secrets (never logged).
const (
	envSyncKey      = "KVGATE_REPLICA_SYNC_KEY"
	envSyncUser     = "KVGATE_REPLICA_SYNC_USER"
	envSyncPassword = "KVGATE_REPLICA_SYNC_PASSWORD"
	envSyncToken    = "KVGATE_REPLICA_SYNC_TOKEN"
)

// options turns the flags and the environment into replicasync.Options.
func (o *replicaSyncOptions) options() (replicasync.Options, error) {
	ro := replicasync.Options{Spec: o.spec, CredsFile: o.creds, Listen: o.listen, Peers: o.peers,
		User: os.Getenv(envSyncUser), Password: os.Getenv(envSyncPassword), Token: os.Getenv(envSyncToken)}
	switch {
	case o.keyFile != "":
		b, err := os.ReadFile(o.keyFile)
		if err != nil {
			return ro, fmt.Errorf("--replica-sync-key-file: %w", err)
		}
		ro.Key = bytes.TrimSpace(b)
	case os.Getenv(envSyncKey) != "":
		ro.Key = []byte(os.Getenv(envSyncKey))
	}
	return ro, ro.Validate()
}

// startReplicaSync starts the replica sync plane the flags ask for; nil when it is off.
func startReplicaSync(ctx context.Context, o *replicaSyncOptions, log *slog.Logger) (*replicasync.Plane, error) {
	ro, err := o.options()
	if err != nil || !ro.Enabled() {
		return nil, err
	}
	p, err := replicasync.Start(ctx, ro, replicasync.PlaneConfig{Logger: log})
	if err != nil {
		return nil, err
	}
	if a := p.ClusterAddr(); a != nil {
		log.Info("replica sync: embedded cluster listening", "addr", a.String(), "peers", len(ro.Peers), "keyed", len(ro.Key) > 0)
	} else {
		log.Info("replica sync: on an existing NATS cluster", "urls", len(strings.Split(ro.Spec, ",")))
	}
	return p, nil
}
