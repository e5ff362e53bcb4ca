package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/worker"
)

// kvEventOptions are the flags of KV-cache event ingestion and precise routing.
type kvEventOptions struct {
	events    kvevents.Config
	tokenizer string
	tok       kvevents.TokenizerConfig
}

func registerKVEventFlags(fs *flag.FlagSet, o *kvEventOptions) {
	fs.StringVar(&o.events.Bind, "kv-events-bind", "", "SUB endpoint engines publish KV-cache events to, tcp://host:port (empty: none; no host: loopback); beyond loopback it needs --kv-events-allowed-hosts")
	fs.Var((*listFlag)(&o.events.AllowedHosts), "kv-events-allowed-hosts", "addresses, CIDRs and host names whose connections --kv-events-bind accepts, comma-separated (empty: loopback only); a publisher may still speak only for workers on its own host unless a worker's "+kvevents.PublisherLabel+" label allows it")
	fs.IntVar(&o.events.Port, "kv-events-port", 0, "dial every worker's KV-cache event publisher on this port of its host (vLLM: 5557; 0: only workers labelled "+kvevents.EndpointLabel+")")
	fs.IntVar(&o.events.ReplayPort, "kv-events-replay-port", 0, "every worker's event replay port, asked after a sequence gap (0: only workers labelled "+kvevents.ReplayLabel+")")
	fs.IntVar(&o.events.MaxBlocks, "kv-events-max-blocks", 1<<18, fmt.Sprintf("KV blocks kept per worker over all its event streams, at most %d bytes each; the oldest go first past it", kvevents.BytesPerBlock))
	fs.DurationVar(&o.events.Resync, "kv-events-resync", 10*time.Second, "after a gap no replay filled, how long the prefix tree routes the worker's model while events rebuild its picture")
	fs.StringVar(&o.tokenizer, "tokenizer", "worker", "how precise_prefix tokenizes: worker (a worker's POST /tokenize, the engine's own chat template)")
	fs.DurationVar(&o.tok.Timeout, "tokenizer-timeout", 100*time.Millisecond, "deadline of one tokenization; past it the prefix tree routes the request")
	fs.IntVar(&o.tok.CacheTokens, "tokenizer-cache-tokens", 1<<22, "tokens of tokenized prompts cached")
}

// validate checks the options.
func (o *kvEventOptions) validate() error {
	if o.tokenizer != "worker" {
		return fmt.Errorf("--tokenizer %q: only \"worker\" is supported", o.tokenizer)
	}
	if o.events.Port < 0 || o.events.Port > 65535 || o.events.ReplayPort < 0 || o.events.ReplayPort > 65535 {
		return fmt.Errorf("--kv-events-port/--kv-events-replay-port out of range")
	}
	return nil
}

// defaultPolicy returns precise_prefix when engine events are configured (--kv-events-bind or
// --kv-events-port) and --policy was not given (on the command line or in the config file),
// else name. Measured (docs/routing.md, "Precise routing from engine KV-cache events"): with
// events, precise_prefix matches cache_aware_hash's hit rate with one gateway and beats it with
// two and on evicting long contexts; without events it would only add a fallback.
func (o *kvEventOptions) defaultPolicy(fs *flag.FlagSet, name string) string {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "policy" })
	if set || !o.events.Enabled() {
		return name
	}
	return "precise_prefix"
}

// startKVEvents starts event ingestion when a worker could be followed (a bind endpoint, a
// port, or per-worker labels, which need ingestion running too: it is started whenever
// precise routing may be used), follows the registry, and returns the view precise_prefix
// routes on and the function that stops it all. Call it before workers are registered.
func startKVEvents(o *kvEventOptions, reg *worker.Registry, log *slog.Logger) (*kvevents.View, func(), error) {
	cfg := o.events
	cfg.Logger = log
	svc, err := kvevents.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	if svc.BindAddr != "" {
		openTo := "processes on this machine (loopback)"
		if len(cfg.AllowedHosts) > 0 {
			openTo = "connections from " + strings.Join(cfg.AllowedHosts, ", ")
		}
		log.Info("kv events: listening for engine publishers", "addr", svc.BindAddr, "open_to", openTo,
			"may_publish_for", "workers on the publisher's own host, or allowed by their "+kvevents.PublisherLabel+" label")
	}
	reg.Subscribe(func(e worker.Event) {
		if e.Removed {
			svc.Forget(e.Worker.ID)
			return
		}
		if err := svc.Track(e.Worker); err != nil {
			log.Warn("kv events: not following worker", "worker", e.Worker.ID, "err", err)
		}
	})
	return kvevents.NewView(svc, kvevents.NewTokenizer(o.tok)), func() { svc.Close() }, nil
}

// registerKVEventMetrics exports ingestion's counters on the gateway's /metrics.
func registerKVEventMetrics(gw *gateway.Server, v *kvevents.View) {
	gw.Metrics().Registry().MustRegister(kvevents.NewCollector(v.Service, v.Tokenizer))
}
