package apply

import "sync"

// tableCache holds one value per table, read from the catalog once (the
// column types statements cast to, the bounded columns the pre-check
// reads). Safe for concurrent use.
type tableCache[T any] struct {
	mu     sync.RWMutex
	tables map[string]T
}

func newTableCache[T any]() tableCache[T] { return tableCache[T]{tables: map[string]T{}} }

// get returns table's value, calling load when none is cached. Two callers
// may load the same table at once; the later store wins, and both values
// are the catalog's.
func (c *tableCache[T]) get(table string, load func() (T, error)) (T, error) {
	c.mu.RLock()
	t, ok := c.tables[table]
	c.mu.RUnlock()
	if ok {
		return t, nil
	}
	t, err := load()
	if err != nil {
		return t, err
	}
	c.mu.Lock()
	c.tables[table] = t
	c.mu.Unlock()
	return t, nil
}

// forget drops the cached values of tables: the catalog changed under them.
func (c *tableCache[T]) forget(tables map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range tables {
		delete(c.tables, t)
	}
}
