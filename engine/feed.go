package engine

// The feed modes: how a projection version reads its source. A version
// alone in its group streams a slot of its own; a member of a group of
// two or more takes its transactions from the group's stream (hub.go),
// catching up on a slot of its own after a backfill, a detach or a
// resync until it joins. Every guarantee of the source and of a version's
// lifecycle holds in each mode: the integration tests' matrix
// (integration.feedModes, inEveryFeed) runs those tests in each, and
// TestFeedModesCovered fails when a mode listed here has no row there.
const (
	FeedAlone  = "alone"
	FeedMember = "member"
)

// FeedModes lists every feed mode.
var FeedModes = []string{FeedAlone, FeedMember}
