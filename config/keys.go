package config

import (
	"slices"
	"strings"
)

// Keys returns every key a configuration file may hold, as dotted paths
// without array indexes ("engine.batch_size", "source.columns.id",
// "projection.rule.op"), sorted. A key whose value is a table of fixed
// keys ([source.columns], [[projection.rule]]) is not listed itself; its
// keys are. They are the keys the decoder asks for, read off a decode of
// a file with one table of each kind, so they cannot drift from what
// Load accepts: the doc test compares them with docs/config.md.
func Keys() []string {
	raw := map[string]any{"projection": []map[string]any{{"rule": []map[string]any{{}}}}}
	d := &decoder{file: "keys.toml", schema: map[string][]string{}}
	d.config(raw, true)
	var keys []string
	for section, known := range d.schema {
		for _, k := range known {
			path := k
			if section != "" {
				path = section + "." + k
			}
			if _, isSection := d.schema[path]; !isSection {
				keys = append(keys, path)
			}
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// section is p without its array indexes: "projection.rule" for
// projection[0].rule[2], "" for the root.
func (p keyPath) section() string {
	var parts []string
	for _, e := range p {
		if !strings.HasPrefix(e, "[") {
			parts = append(parts, e)
		}
	}
	return strings.Join(parts, ".")
}
