package apply

import (
	"fmt"
	"testing"

	"github.com/pgscribe/pgscribe/cursor"
)

func TestCursorCache(t *testing.T) {
	var c cursorCache
	if _, ok := c.get("s"); ok {
		t.Fatal("empty cache has a cursor")
	}
	c.put(map[string]cursor.Cursor{"a": {StreamPosition: 3, Position: 30}, "b": {StreamPosition: 1, Position: 31}})
	c.put(map[string]cursor.Cursor{"a": {StreamPosition: 4, Position: 40}})
	if got, ok := c.get("a"); !ok || got != (cursor.Cursor{StreamPosition: 4, Position: 40}) {
		t.Errorf("a = %+v, %v; want the later put", got, ok)
	}
	if got, ok := c.get("b"); !ok || got.StreamPosition != 1 {
		t.Errorf("b = %+v, %v; want kept", got, ok)
	}
	c.clear()
	if _, ok := c.get("a"); ok {
		t.Error("cleared cache still has a cursor")
	}

	// Past the bound it forgets some, never the batch just committed.
	for i := 0; i < 3*cursorCacheSize; i += 1000 {
		m := make(map[string]cursor.Cursor, 1000)
		for j := i; j < i+1000; j++ {
			m[fmt.Sprint("s", j)] = cursor.Cursor{StreamPosition: int64(j)}
		}
		c.put(m)
		if len(c.m) > cursorCacheSize {
			t.Fatalf("cache holds %d cursors, bound %d", len(c.m), cursorCacheSize)
		}
		for id, want := range m {
			if got, ok := c.get(id); !ok || got != want {
				t.Fatalf("%s = %+v, %v just after its put", id, got, ok)
			}
		}
	}
}
