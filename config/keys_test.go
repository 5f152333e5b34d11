package config

import (
	"slices"
	"testing"
)

func TestKeys(t *testing.T) {
	keys := Keys()
	for _, want := range []string{"database.url", "source.columns.occurred_at", "engine.batch_size", "projection.start_after_position", "projection.rule.if_missing"} {
		if !slices.Contains(keys, want) {
			t.Errorf("Keys() lacks %q: %v", want, keys)
		}
	}
	for _, section := range []string{"database", "source.columns", "projection", "projection.rule"} {
		if slices.Contains(keys, section) {
			t.Errorf("Keys() lists the section %q as a key", section)
		}
	}
}
