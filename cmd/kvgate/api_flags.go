package main

import (
	"flag"
	"strings"

	"github.com/kvgate/kvgate/internal/gateway"
)

// addAPIFlags registers the flags of the client-facing API's own fields: the session headers
// that name a conversation (gateway.Config.SessionHeaders).
func addAPIFlags(fs *flag.FlagSet, g *gateway.Config) {
	fs.Var((*listFlag)(&g.SessionHeaders), "session-headers",
		"request headers, after x-kvgate-routing-key, whose value names a conversation: its session key (consistent_hashing, sticky sessions) and placement key (cost policies), before the body's prompt_cache_key and conversation (default "+strings.Join(gateway.DefaultSessionHeaders, ",")+")")
}
