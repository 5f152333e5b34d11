package engine

// The feed modes: how a projection version reads its source. Every
// version reads it through its group's stream (hub.go); a version alone is
// a group of one whose stream reads the version's own slot, a member of a
// group of two or more reads the group's shared slot, catching up on a
// slot of its own after a backfill, a detach or a resync until it joins.
// One code path serves both: the modes differ in the slot and in the
// number of members. Every guarantee of the source and of a version's
// lifecycle holds in each mode: the integration tests' matrix
// (integration.feedModes, inEveryFeed) runs those tests in each, and
// TestFeedModesCovered fails when a mode listed here has no row there.
const (
	FeedAlone  = "alone"
	FeedMember = "member"
)

// FeedModes lists every feed mode.
var FeedModes = []string{FeedAlone, FeedMember}
