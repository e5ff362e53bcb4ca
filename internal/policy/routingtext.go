package policy

import "unicode/utf8"

// The routing text is the part of a prompt the policies see: its first RoutingPrefixBytes (the
// gateway's, 8 KiB). That fails where many prompts open with the same text longer than that (a
// long system prompt, an agent's scaffold): every prompt's routing text is then that opening and
// nothing else, the tree holds all of it for every worker, and no session can be told from
// another. So where the tree holds all of the routing text for two or more workers, the routing
// text runs on to RoutingPrefixBytes past the opening they share. Where it does not, the routing
// text is what it was: lengthening every routing text lengthens every tree walk and moved the
// prediction's error on traces whose shared opening is short (docs/routing.md §8.1).

// Opener is implemented by policies that keep a prefix tree: Opening returns how many leading
// bytes of text the tree holds for two or more workers (0 without a tree).
type Opener interface {
	Opening(text string) int
}

// Opening returns how many leading bytes of text the tree holds for two or more workers
// (radix.Tree.Opening); 0 for a nil tree (least_load keeps none).
func (t *prefixTree) Opening(text string) int {
	if t == nil {
		return 0
	}
	return t.tree.Opening(text)
}

// routingTextSpan is how many times past bytes a routing text keeps at most: an opening of up to
// three times past is reached past. It bounds what the gateway decodes of every prompt (32 KiB
// at the default 8 KiB) and what one tree walk reads, whatever a client sends: a longer shared
// opening is routed on its first 32 KiB alone, as a 12 KiB one was on its first 8 before.
const routingTextSpan = 4

// openingGrain is the granularity to which the opening is rounded down before past is counted
// from it. Past a shared opening, two prompts share a character or two by chance as often as not
// (two conversations whose next words start alike), so the tree's opening for one conversation
// differs from turn to turn by those few characters; cut at the exact opening, each turn's
// routing text would be a character longer or shorter than the one before, the tree would hold
// none of them whole, and Ĉ would lose what follows a routing text held whole (measured on the
// shared opening: hit 0.96× the oracle's and prediction MAE 0.044, against 0.995× and 0.012
// rounded). Rounded down to 1 KiB, an opening moves the cut only when it ends within those few
// characters of a multiple of 1 KiB.
const openingGrain = 1024

// MaxRoutingText returns the most bytes of a prompt RoutingText keeps for past (a salted text's
// mark comes on top): what a caller needs to read of a prompt.
func MaxRoutingText(past int) int { return routingTextSpan * past }

// SharedThrough reports whether p's prefix tree (Opener) holds all of text, a prompt's first
// past bytes, for two or more workers: only then does RoutingText of the prompt reach past text,
// so a caller that decoded only that much of a longer prompt needs more of it (up to
// MaxRoutingText) only then.
func SharedThrough(p Policy, text string) bool {
	if text == "" {
		return false
	}
	o, ok := As[Opener](p)
	return ok && o.Opening(text) >= len(text)
}

// RoutingText returns the routing text p routes text on: its first past bytes or, where p's
// prefix tree (Opener) holds all of those for two or more workers, the opening the tree holds
// for them, rounded down to 1 KiB, and past bytes beyond it; at most MaxRoutingText(past) bytes,
// cut at a character start. A salted text's mark (SaltedText) is not counted: past bytes of the
// prompt follow it. text may be longer than MaxRoutingText(past); past must be positive.
func RoutingText(p Policy, text string, salted bool, past int) string {
	base := 0
	if salted {
		base = SaltMarkLen
	}
	n := base + past
	if len(text) <= n {
		return text
	}
	end := min(len(text), base+MaxRoutingText(past))
	if o, ok := As[Opener](p); ok {
		if open := o.Opening(text[:end]); open >= n {
			n = min(max(open-open%openingGrain, base)+past, end)
		}
	}
	for n > 0 && n < len(text) && !utf8.RuneStart(text[n]) {
		n--
	}
	return text[:n]
}
