package apply

import "github.com/pgscribe/pgscribe/cursor"

// cursorCacheSize bounds the cursors one partition remembers. Past it the
// cache forgets a quarter of them (whichever the map yields first); a
// forgotten stream's cursor is read from PostgreSQL again, inside the
// batch transaction, so the bound costs reads and never correctness.
const cursorCacheSize = 16384

// cursorCache holds the cursors a partition's own committed batches wrote
// or read. Only this partition's worker touches its streams' cursors while
// this node holds the lease, and every batch verifies the lease before it
// commits, so a cached cursor is the stored one for as long as batches
// commit. Any failed attempt clears the cache: a COMMIT whose answer was
// lost may have committed. Not safe for concurrent use: one per partition.
type cursorCache struct {
	m map[string]cursor.Cursor
}

func (c *cursorCache) get(stream string) (cursor.Cursor, bool) {
	cur, ok := c.m[stream]
	return cur, ok
}

// put records the cursors of a committed batch.
func (c *cursorCache) put(curs map[string]cursor.Cursor) {
	if c.m == nil {
		c.m = make(map[string]cursor.Cursor, len(curs))
	}
	if len(c.m)+len(curs) > cursorCacheSize {
		drop := len(c.m) + len(curs) - cursorCacheSize*3/4
		for id := range c.m {
			if drop <= 0 {
				break
			}
			delete(c.m, id)
			drop--
		}
	}
	for id, cur := range curs {
		c.m[id] = cur
	}
}

func (c *cursorCache) clear() { c.m = nil }

// forget drops one stream's cursor: work outside the batches (a released
// parked stream) changed it.
func (c *cursorCache) forget(stream string) { delete(c.m, stream) }
