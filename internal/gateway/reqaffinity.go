package gateway

import (
	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/kvevents"
)

// The body's affinity fields, read on every inference route in the same pass as the rest:
//
//   - "prompt_cache_key" (OpenAI's): the client's name for a family of requests that share a
//     prefix; a session key (session.go).
//   - "conversation" (the Responses API's): a conversation id, as a string or as an object's
//     "id"; a session key after prompt_cache_key.
//   - "cache_salt" (vLLM's): requests with different salts never share prefix cache, so the salt
//     is part of the prefix's identity: the routing text the policies see opens with a mark of
//     its digest (policy.SaltedText), and precise routing looks the prompt's tokens up under it
//     (kvevents.SaltDigest). The salt itself is kept nowhere: only its digest, one-way, which
//     the prefix trees may hold.
//
// A member of another type names nothing (the worker answers it with its own 400), nor does
// an empty string. Each string is bounded by the body it is in; what the
// policies keep of a key is bounded by policy.MaxKeyBytes.

// Affinity is what a body says about which requests belong together.
type Affinity struct {
	// PromptCacheKey is the body's "prompt_cache_key" ("" when absent).
	PromptCacheKey string
	// Conversation is the body's "conversation": the string, or the object's "id" ("" when absent).
	Conversation string
	// Salt is a digest of the body's "cache_salt", when Salted (a non-empty salt was sent).
	Salt   uint64
	Salted bool
}

// isAffinityMember reports whether key is one of the members affinityMember reads.
func isAffinityMember(key []byte) bool {
	switch string(key) {
	case "prompt_cache_key", "conversation", "cache_salt":
		return true
	}
	return false
}

// affinityMember reads one affinity member of a body. The last member of a name decides, as in
// encoding/json: a later one of another type unsets what an earlier one set.
func affinityMember(s *jsonscan.Scanner, key []byte, a *Affinity, _ func(string)) {
	var v string
	switch {
	case string(key) == "conversation" && s.Peek() == '{':
		s.Object(func(k []byte) {
			if string(k) == "id" {
				v = ""
				if s.Peek() == '"' {
					v = string(s.Str(true))
					return
				}
			}
			s.Skip()
		})
	case s.Peek() == '"':
		v = string(s.Str(true))
	default:
		s.Skip()
	}
	switch string(key) {
	case "prompt_cache_key":
		a.PromptCacheKey = v
	case "conversation":
		a.Conversation = v
	default: // cache_salt
		a.Salt, a.Salted = 0, false
		if v != "" {
			a.Salt, a.Salted = kvevents.SaltDigest([]byte(v)), true
		}
	}
}
