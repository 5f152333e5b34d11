package config

import (
	"strconv"
	"strings"
)

// keyPath names a value in the document, one element per level. Table keys
// are stored TOML-quoted when a bare key would not do, and array elements as
// "[i]", so String gives the form users see in errors and the line index
// uses as its key.
type keyPath []string

func (p keyPath) String() string {
	var b strings.Builder
	for i, e := range p {
		if i > 0 && !strings.HasPrefix(e, "[") {
			b.WriteByte('.')
		}
		b.WriteString(e)
	}
	return b.String()
}

// key returns the path of key k inside the table at p. It never shares p's
// backing array, because paths are kept while siblings are built from p.
func (p keyPath) key(k string) keyPath { return p.with(quoteKey(k)) }

// index returns the path of element i of the array at p.
func (p keyPath) index(i int) keyPath { return p.with("[" + strconv.Itoa(i) + "]") }

func (p keyPath) with(e string) keyPath {
	q := make(keyPath, len(p), len(p)+1)
	copy(q, p)
	return append(q, e)
}

func quoteKey(k string) string {
	if k == "" {
		return `""`
	}
	for _, r := range k {
		if !isBareKeyRune(r) {
			return strconv.Quote(k)
		}
	}
	return k
}

func isBareKeyRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-'
}

// lineIndex maps a key path (keyPath.String) to the line that first defines
// it: the key's own line, a table header, or for an inline table or array
// element the line where that element starts.
//
// BurntSushi/toml v1.6 keeps key positions unexported, and keyed without
// array indexes, so [[projection.rule]] entries would all share one
// position. The index is therefore built by a small scanner of our own; it
// runs only on text the TOML parser has already accepted, so it need not
// diagnose anything, only never loop or panic.
type lineIndex map[string]int

// line returns the line of p, or of its nearest ancestor that appears in the
// file (a missing required key points at its table's header), or 0.
func (ix lineIndex) line(p keyPath) int {
	for n := len(p); n > 0; n-- {
		if l, ok := ix[p[:n].String()]; ok {
			return l
		}
	}
	return 0
}

func indexLines(src string) lineIndex {
	s := &scanner{src: src, line: 1, lines: lineIndex{}, arrays: map[string]int{}}
	var table keyPath
	for {
		s.skipBlank(true)
		if s.i >= len(s.src) {
			return s.lines
		}
		start := s.i
		if s.src[s.i] == '[' {
			table = s.header()
		} else {
			s.keyValue(table)
		}
		if s.i == start {
			s.i++
		}
	}
}

type scanner struct {
	src    string
	i      int // next byte
	line   int // line of src[i]
	lines  lineIndex
	arrays map[string]int // array-of-tables path → elements seen so far
}

func (s *scanner) mark(p keyPath, line int) {
	k := p.String()
	if _, ok := s.lines[k]; !ok {
		s.lines[k] = line
	}
}

func (s *scanner) at(c byte) bool { return s.i < len(s.src) && s.src[s.i] == c }

// skipBlank skips spaces, tabs, comments and, if newlines is set, line
// breaks.
func (s *scanner) skipBlank(newlines bool) {
	for s.i < len(s.src) {
		switch s.src[s.i] {
		case ' ', '\t', '\r':
			s.i++
		case '\n':
			if !newlines {
				return
			}
			s.line++
			s.i++
		case '#':
			for s.i < len(s.src) && s.src[s.i] != '\n' {
				s.i++
			}
		default:
			return
		}
	}
}

// header reads [a.b] or [[a.b]] and returns the table it opens, resolving
// each array-of-tables prefix to its latest element, as TOML does.
func (s *scanner) header() keyPath {
	line := s.line
	s.i++
	array := s.at('[')
	if array {
		s.i++
	}
	parts := s.keyParts()
	for range 2 {
		if s.at(']') {
			s.i++
		}
	}
	var p keyPath
	for j, part := range parts {
		p = p.key(part)
		name := p.String()
		if array && j == len(parts)-1 {
			n := s.arrays[name]
			s.arrays[name] = n + 1
			s.mark(p, line)
			p = p.index(n)
		} else if n, ok := s.arrays[name]; ok {
			p = p.index(n - 1)
		}
		s.mark(p, line)
	}
	return p
}

// keyValue reads `dotted.key = value` inside the table at base.
func (s *scanner) keyValue(base keyPath) {
	line := s.line
	p := base
	for _, part := range s.keyParts() {
		p = p.key(part)
		s.mark(p, line)
	}
	s.skipBlank(false)
	if !s.at('=') {
		return
	}
	s.i++
	s.skipBlank(false)
	s.value(p)
}

// keyParts reads a possibly dotted, possibly quoted key.
func (s *scanner) keyParts() []string {
	var parts []string
	for {
		s.skipBlank(false)
		if s.i >= len(s.src) {
			return parts
		}
		switch s.src[s.i] {
		case '"', '\'':
			parts = append(parts, s.str())
		default:
			start := s.i
			for s.i < len(s.src) && !strings.ContainsRune(" \t\r\n.=]#", rune(s.src[s.i])) {
				s.i++
			}
			if s.i == start {
				return parts
			}
			parts = append(parts, s.src[start:s.i])
		}
		s.skipBlank(false)
		if !s.at('.') {
			return parts
		}
		s.i++
	}
}

// value skips one value, indexing the keys of inline tables and the
// elements of arrays under p.
func (s *scanner) value(p keyPath) {
	if s.i >= len(s.src) {
		return
	}
	switch s.src[s.i] {
	case '"', '\'':
		s.str()
	case '[':
		s.i++
		for n := 0; ; n++ {
			s.skipBlank(true)
			if s.i >= len(s.src) || s.at(']') {
				break
			}
			start := s.i
			s.mark(p.index(n), s.line)
			s.value(p.index(n))
			s.skipBlank(true)
			if s.at(',') || s.i == start {
				s.i++
			}
		}
		s.i++
	case '{':
		s.i++
		for {
			s.skipBlank(true)
			if s.i >= len(s.src) || s.at('}') {
				break
			}
			start := s.i
			s.keyValue(p)
			s.skipBlank(true)
			if s.at(',') || s.i == start {
				s.i++
			}
		}
		s.i++
	default:
		for s.i < len(s.src) && !strings.ContainsRune(",]}#\r\n", rune(s.src[s.i])) {
			s.i++
		}
	}
}

// str reads any of TOML's four string forms and returns its content,
// unescaped as far as Go's rules agree with TOML's (enough for keys; values
// are only skipped).
func (s *scanner) str() string {
	q := s.src[s.i]
	delim := strings.Repeat(string(q), 3)
	if strings.HasPrefix(s.src[s.i:], delim) {
		s.i += 3
		for s.i < len(s.src) {
			switch {
			case strings.HasPrefix(s.src[s.i:], delim):
				s.i += 3
				// Up to two quotes may end the content right before the delimiter.
				for k := 0; k < 2 && s.at(q); k++ {
					s.i++
				}
				return ""
			case s.src[s.i] == '\\' && q == '"' && s.i+1 < len(s.src):
				s.i++
				if s.src[s.i] == '\n' {
					s.line++
				}
			case s.src[s.i] == '\n':
				s.line++
			}
			s.i++
		}
		return ""
	}
	s.i++
	start := s.i
	for s.i < len(s.src) && s.src[s.i] != q && s.src[s.i] != '\n' {
		if s.src[s.i] == '\\' && q == '"' {
			s.i++
		}
		s.i++
	}
	raw := s.src[start:min(s.i, len(s.src))]
	if s.at(q) {
		s.i++
	}
	if q == '"' {
		if u, err := strconv.Unquote(`"` + raw + `"`); err == nil {
			return u
		}
	}
	return raw
}
