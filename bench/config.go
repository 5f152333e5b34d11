package main

import (
	_ "embed"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// configTemplate is config.toml.example cut in two: the header (every
// section but the projections) and the [[projection]] blocks by name, so
// that the bench runs the example's own rules, not a copy of them.
type configTemplate struct {
	header      string
	projections map[string]string
}

var (
	projectionStart = regexp.MustCompile(`(?m)^\[\[projection\]\][ \t]*$`)
	projectionName  = regexp.MustCompile(`(?m)^name[ \t]*=[ \t]*"([^"]+)"`)
	versionLine     = regexp.MustCompile(`(?m)^version[ \t]*=[ \t]*\d+`)
	urlLine         = regexp.MustCompile(`(?m)^url[ \t]*=.*$`)
	listenLine      = regexp.MustCompile(`(?m)^listen[ \t]*=.*$`)
)

// benchProjections are the projections the bench adds to the example's:
// account_stats (W3), w6 (W6) and activity_ref (W4P).
//
//go:embed projections.toml
var benchProjections string

// statsTable is the read model of account_stats.
const statsTable = `
CREATE TABLE IF NOT EXISTS account_stats (
  account_id    text        PRIMARY KEY,
  events        bigint      NOT NULL,
  deposited     bigint      NOT NULL,
  withdrawn     bigint      NOT NULL,
  last_type     text        NOT NULL,
  last_event_at timestamptz NOT NULL
);`

func loadTemplate(path string) (*configTemplate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	src := string(b) + "\n" + benchProjections
	starts := projectionStart.FindAllStringIndex(src, -1)
	if len(starts) == 0 {
		return nil, fmt.Errorf("%s: no [[projection]] block", path)
	}
	t := &configTemplate{header: src[:starts[0][0]], projections: map[string]string{}}
	for i, s := range starts {
		end := len(src)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		block := src[s[0]:end]
		m := projectionName.FindStringSubmatch(block)
		if m == nil {
			return nil, fmt.Errorf("%s: a [[projection]] block without a name", path)
		}
		t.projections[m[1]] = block
	}
	for _, want := range []*regexp.Regexp{urlLine, listenLine} {
		if !want.MatchString(t.header) {
			return nil, fmt.Errorf("%s: no line matching %s to override", path, want)
		}
	}
	return t, nil
}

// target is a projection version the bench runs.
type target struct {
	projection string
	version    int
}

func (t target) String() string { return t.projection + " v" + strconv.Itoa(t.version) }

// render returns a configuration for the given projection versions against
// dsn, with the metrics listener off (runs must not collide with anything
// else on this machine) and the engine keys in engineSet overridden.
func (t *configTemplate) render(dsn string, targets []target, engineSet map[string]string) (string, error) {
	h := urlLine.ReplaceAllLiteralString(t.header, "url = "+strconv.Quote(dsn))
	h = listenLine.ReplaceAllLiteralString(h, `listen = "off"`)
	for _, k := range slices.Sorted(maps.Keys(engineSet)) {
		re, err := regexp.Compile(`(?m)^#?[ \t]*` + regexp.QuoteMeta(k) + `[ \t]*=.*$`)
		if err != nil || !re.MatchString(h) {
			return "", fmt.Errorf("engine setting %q: no such key in the example configuration", k)
		}
		h = re.ReplaceAllLiteralString(h, k+" = "+engineSet[k])
	}
	var sb strings.Builder
	sb.WriteString(h)
	for _, tg := range targets {
		block, ok := t.projections[tg.projection]
		if !ok {
			return "", fmt.Errorf("no projection %q in the configuration template", tg.projection)
		}
		sb.WriteString(versionLine.ReplaceAllLiteralString(block, "version  = "+strconv.Itoa(tg.version)))
		sb.WriteString("\n")
	}
	return sb.String(), nil
}
