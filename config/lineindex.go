package config

import "strings"

// Lines maps the keys of a TOML document to the lines that define them, for
// other TOML files pgscribe reads (rule fixtures) to report problems the
// way configuration errors do: file, line and key.
type Lines struct{ ix lineIndex }

// IndexLines indexes src, a document the TOML parser has already accepted.
func IndexLines(src string) Lines { return Lines{ix: indexLines(src)} }

// Line returns the line of the value at path, whose elements are keys and
// array indexes ("[2]"), as in event[2].data: its own line, else that of its
// nearest ancestor present in the file, else 0.
func (l Lines) Line(path ...string) int {
	p := make(keyPath, len(path))
	for i, e := range path {
		if strings.HasPrefix(e, "[") {
			p[i] = e
		} else {
			p[i] = quoteKey(e)
		}
	}
	return l.ix.line(p)
}

// Suggest returns the key of known closest to k when k looks like a typo
// of it, else "": the "did you mean" of unknown-key errors.
func Suggest(k string, known []string) string { return suggest(k, known) }
