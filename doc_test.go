package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
)

// The docs are checked against the binary: the commands and flags of the
// command table against docs/cli.md, the configuration keys the decoder
// knows against docs/config.md, every relative link, and every shell
// session shown. docs/testing.md ("The docs are tested") states the
// conventions these tests read.

// docFiles is README.md and every page under docs/, relative to srcDir.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(srcDir, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	files := []string{"README.md"}
	for _, p := range pages {
		rel, _ := filepath.Rel(srcDir, p)
		files = append(files, rel)
	}
	return files
}

func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(srcDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mdLine is one line of a markdown file outside fenced code blocks, with
// its 1-based number.
type mdLine struct {
	n    int
	text string
}

// mdBlock is a fenced code block: its info string, its lines and the line
// just before its opening fence.
type mdBlock struct {
	n      int // line of the opening fence
	info   string
	lines  []string
	before string
}

// parseMarkdown splits src into the lines outside fenced code blocks and
// the blocks.
func parseMarkdown(src string) ([]mdLine, []mdBlock) {
	var prose []mdLine
	var blocks []mdBlock
	var cur *mdBlock
	indent := ""
	prev := ""
	for i, l := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &mdBlock{n: i + 1, info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), before: strings.TrimSpace(prev)}
			indent = l[:len(l)-len(strings.TrimLeft(l, " "))]
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, strings.TrimPrefix(l, indent))
		default:
			prose = append(prose, mdLine{i + 1, l})
		}
		prev = l
	}
	return prose, blocks
}

var headingRE = regexp.MustCompile("^(#{1,6}) +(.*?) *$")

// anchor is GitHub's fragment for a heading's text: lower case, markup
// and punctuation dropped (hyphens and underscores stay), spaces to
// hyphens.
func anchor(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the fragments of every heading of a markdown file,
// numbering repeats as GitHub does (x, x-1, x-2).
func anchors(src string) map[string]bool {
	prose, _ := parseMarkdown(src)
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range prose {
		m := headingRE.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		a := anchor(m[2])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// sections returns, for each heading of level 2 or deeper matched by
// nameRE (its first group is the section's name), the prose lines under
// it up to the next heading of the same level or higher.
func sections(prose []mdLine, nameRE *regexp.Regexp) map[string][]mdLine {
	out := map[string][]mdLine{}
	var cur string
	level := 0
	for _, l := range prose {
		if m := headingRE.FindStringSubmatch(l.text); m != nil {
			if len(m[1]) <= level {
				cur, level = "", 0
			}
			if n := nameRE.FindStringSubmatch(m[2]); n != nil {
				cur, level = n[1], len(m[1])
				out[cur] = nil
			}
			continue
		}
		if cur != "" {
			out[cur] = append(out[cur], l)
		}
	}
	return out
}

// firstCells returns the backquoted first cells of a section's table rows:
// "| `-json` | …" gives "-json" (up to a space: "`-limit N`" gives -limit).
func firstCells(lines []mdLine) []string {
	var cells []string
	for _, l := range lines {
		m := regexp.MustCompile("^\\| *`([^` ]+)[^`]*` *\\|").FindStringSubmatch(l.text)
		if m != nil {
			cells = append(cells, m[1])
		}
	}
	return cells
}

// flagRows returns a flags table's rows as (flag, default cell):
// "| `-limit N` | `100` | …" gives ("-limit", "`100`").
func flagRows(lines []mdLine) [][2]string {
	var rows [][2]string
	re := regexp.MustCompile("^\\| *`(-[a-z-]+)[^`]*` *\\| *([^|]*?) *\\|")
	for _, l := range lines {
		if m := re.FindStringSubmatch(l.text); m != nil {
			rows = append(rows, [2]string{m[1], m[2]})
		}
	}
	return rows
}

// diff reports what want has and got lacks, and the reverse.
func diff(want, got []string) (missing, extra []string) {
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			extra = append(extra, g)
		}
	}
	return missing, extra
}

// Every command of the command table has a section in docs/cli.md whose
// flags table lists exactly its flags, and every section is a command.
func TestDocsCLI(t *testing.T) {
	prose, _ := parseMarkdown(readDoc(t, "docs/cli.md"))
	secs := sections(prose, regexp.MustCompile("^`pgscribe ([a-z ]+)`$"))
	for _, c := range commands {
		lines, ok := secs[c.name]
		if !ok {
			t.Errorf("docs/cli.md has no section \"## `pgscribe %s`\" for the command %q", c.name, c.name)
			continue
		}
		var flags []string
		if c.define != nil {
			fs, _ := newFlagSet(&c, io.Discard, io.Discard)
			fs.VisitAll(func(f *flag.Flag) { flags = append(flags, "-"+f.Name) })
			for _, row := range flagRows(lines) {
				f := fs.Lookup(strings.TrimPrefix(row[0], "-"))
				if f == nil {
					continue // reported below
				}
				want := ""
				if f.DefValue != "" && f.DefValue != "[]" {
					want = "`" + f.DefValue + "`"
				}
				if row[1] != want {
					t.Errorf("docs/cli.md, pgscribe %s: -%s's default is %q in its flags table, %q in the command", c.name, f.Name, row[1], want)
				}
			}
		}
		missing, extra := diff(flags, firstCells(lines))
		if len(missing) > 0 {
			t.Errorf("docs/cli.md, pgscribe %s: flags not in its flags table: %s", c.name, strings.Join(missing, " "))
		}
		if len(extra) > 0 {
			t.Errorf("docs/cli.md, pgscribe %s: its flags table lists flags the command does not have: %s", c.name, strings.Join(extra, " "))
		}
	}
	for name := range secs {
		if lookup(name) == nil {
			t.Errorf("docs/cli.md has a section for `pgscribe %s`, which is not a command", name)
		}
	}
}

// Every key config.Keys knows is a row of its section's table in
// docs/config.md, and every row is a key.
func TestDocsConfigKeys(t *testing.T) {
	prose, _ := parseMarkdown(readDoc(t, "docs/config.md"))
	var documented []string
	for section, lines := range sections(prose, regexp.MustCompile("^`\\[\\[?([a-z_.]+)\\]\\]?`$")) {
		for _, k := range firstCells(lines) {
			documented = append(documented, section+"."+k)
		}
	}
	missing, extra := diff(config.Keys(), documented)
	for _, k := range missing {
		t.Errorf("docs/config.md does not document the key %s (a row \"| `%s` | …\" under the heading \"`[%s]`\")",
			k, k[strings.LastIndex(k, ".")+1:], k[:strings.LastIndex(k, ".")])
	}
	for _, k := range extra {
		t.Errorf("docs/config.md documents %s, which the configuration does not have", k)
	}
}

// Every op of the op table is a row of docs/config.md's op table, and
// every row is an op.
func TestDocsOps(t *testing.T) {
	prose, _ := parseMarkdown(readDoc(t, "docs/config.md"))
	rows, ok := sections(prose, regexp.MustCompile("^(What each op does)$"))["What each op does"]
	if !ok {
		t.Fatal("docs/config.md has no section \"## What each op does\"")
	}
	missing, extra := diff(event.OpNames(), firstCells(rows))
	for _, op := range missing {
		t.Errorf("docs/config.md, What each op does: no row for op %q", op)
	}
	for _, op := range extra {
		t.Errorf("docs/config.md, What each op does: a row for %q, which is not an op", op)
	}
}

// Every command the docs name in code (`pgscribe status -json`, a
// "$ pgscribe …" line of a session) is a command of the table, with flags
// it has; every `[section] key` they name is a configuration key.
func TestDocsMentions(t *testing.T) {
	cmdRE := regexp.MustCompile("`(pgscribe [^`]*)`")
	keyRE := regexp.MustCompile("`\\[([a-z_.]+)\\] ([a-z_]+)[^`]*`")
	keys := config.Keys()
	for _, rel := range docFiles(t) {
		prose, blocks := parseMarkdown(readDoc(t, rel))
		var mentions []mdLine
		for _, l := range prose {
			for _, m := range cmdRE.FindAllStringSubmatch(l.text, -1) {
				mentions = append(mentions, mdLine{l.n, m[1]})
			}
			for _, m := range keyRE.FindAllStringSubmatch(l.text, -1) {
				if k := m[1] + "." + m[2]; !slices.Contains(keys, k) {
					t.Errorf("%s:%d: `[%s] %s` is not a configuration key", rel, l.n, m[1], m[2])
				}
			}
		}
		for _, b := range blocks {
			if b.before == "<!-- run -->" {
				continue // run by TestDocsShellSessions, errors included
			}
			for i, l := range b.lines {
				if cmd, ok := strings.CutPrefix(l, "$ "); ok && strings.HasPrefix(cmd, "pgscribe ") {
					mentions = append(mentions, mdLine{b.n + 1 + i, cmd})
				}
			}
		}
		for _, m := range mentions {
			if err := checkMention(m.text); err != nil {
				t.Errorf("%s:%d: `%s`: %v", rel, m.n, m.text, err)
			}
		}
	}
}

// checkMention checks that a command line as the docs show it names a
// command and only flags of that command. Words other than flags (flag
// values, FIXTURE operands, placeholders) are not checked.
func checkMention(line string) error {
	words := strings.Fields(line)[1:]
	if len(words) == 0 {
		return nil
	}
	name := words[0]
	if strings.ToUpper(name) == name {
		return nil // a placeholder: pgscribe COMMAND -h
	}
	if slices.Contains(helpAliases, name) {
		name = "help"
	}
	if subs := subcommands(name); len(subs) > 0 && len(words) > 1 && slices.Contains(subs, words[1]) {
		name += " " + words[1]
	}
	c := lookup(name)
	if c == nil {
		if len(subcommands(name)) > 0 {
			return nil // the group itself ("pgscribe deadletters"), a usage error shown as such
		}
		return fmt.Errorf("no command %q", name)
	}
	if c.define == nil {
		return nil
	}
	fs, _ := newFlagSet(c, io.Discard, io.Discard)
	for _, w := range words[1:] {
		f, ok := strings.CutPrefix(w, "-")
		if !ok || f == "" || strings.HasPrefix(f, "-") || !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(f) {
			continue
		}
		if fs.Lookup(f) == nil {
			return fmt.Errorf("pgscribe %s has no flag -%s", c.name, f)
		}
	}
	return nil
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Every relative link of README.md and docs/*.md names a file of the
// repository, and its fragment a heading of that page.
func TestDocsLinks(t *testing.T) {
	cache := map[string]map[string]bool{}
	for _, rel := range docFiles(t) {
		prose, _ := parseMarkdown(readDoc(t, rel))
		for _, l := range prose {
			text := regexp.MustCompile("`[^`]*`").ReplaceAllString(l.text, "")
			for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				file := rel
				if path != "" {
					file = filepath.Join(filepath.Dir(rel), path)
					if _, err := os.Stat(filepath.Join(srcDir, file)); err != nil {
						t.Errorf("%s:%d: link %s: no such file %s", rel, l.n, target, file)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				if cache[file] == nil {
					cache[file] = anchors(readDoc(t, file))
				}
				if !cache[file][frag] {
					t.Errorf("%s:%d: link %s: %s has no heading #%s", rel, l.n, target, file, frag)
				}
			}
		}
	}
}

// Every shell session shown in the docs is run here (<!-- run -->), by a
// named test (<!-- tested by TestX -->), or marked <!-- illustrative -->.
func TestDocsShellSessions(t *testing.T) {
	tests := testNames(t)
	for _, rel := range docFiles(t) {
		_, blocks := parseMarkdown(readDoc(t, rel))
		for _, b := range blocks {
			lang, _, _ := strings.Cut(b.info, " ")
			shell := slices.Contains([]string{"sh", "shell", "bash", "console"}, lang) ||
				(len(b.lines) > 0 && strings.HasPrefix(b.lines[0], "$ "))
			if !shell {
				continue
			}
			switch {
			case strings.HasPrefix(b.before, "<!-- illustrative"):
			case strings.HasPrefix(b.before, "<!-- tested by "):
				name := strings.TrimSuffix(strings.TrimPrefix(b.before, "<!-- tested by "), " -->")
				if !tests[name] {
					t.Errorf("%s:%d: the shell session is marked as tested by %s, and no test has that name", rel, b.n, name)
				}
			case b.before == "<!-- run -->":
				runSession(t, rel, b)
			default:
				t.Errorf("%s:%d: a shell session neither run by a test nor marked illustrative: put <!-- illustrative -->, <!-- tested by TestName --> or <!-- run --> on the line before its fence (docs/testing.md)", rel, b.n)
			}
		}
	}
}

// runSession runs each "$ pgscribe …" line of b through run, from the
// repository's root and with no configuration in the environment, and
// compares what it prints (stdout, then stderr's last line as main
// prints it, then "exit N" when not 0) with the lines that follow it.
func runSession(t *testing.T, rel string, b mdBlock) {
	t.Helper()
	t.Setenv("PGSCRIBE_CONFIG", "")
	t.Setenv("PGSCRIBE_DATABASE_URL", "")
	t.Chdir(srcDir)
	for i := 0; i < len(b.lines); i++ {
		cmd, ok := strings.CutPrefix(b.lines[i], "$ ")
		if !ok {
			t.Errorf("%s:%d: a <!-- run --> block must start with a \"$ pgscribe …\" line", rel, b.n+1+i)
			return
		}
		args := strings.Fields(cmd)
		if len(args) == 0 || args[0] != "pgscribe" {
			t.Errorf("%s:%d: a <!-- run --> block runs pgscribe only, not %q", rel, b.n+1+i, cmd)
			return
		}
		var want []string
		for i+1 < len(b.lines) && !strings.HasPrefix(b.lines[i+1], "$ ") {
			i++
			want = append(want, b.lines[i])
		}
		var out bytes.Buffer
		err := run(args[1:], &out, &out)
		if err != nil && !errors.Is(err, errHelp) {
			fmt.Fprintf(&out, "pgscribe: %v\nexit %d\n", err, exitCode(err))
		}
		got := strings.TrimRight(out.String(), "\n")
		if w := strings.Join(want, "\n"); got != w {
			t.Errorf("%s:%d: `%s` printed\n%s\nwhere the docs show\n%s", rel, b.n+1, cmd, got, w)
		}
	}
}

// testNames is every Test function of the repository's test files.
func testNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	re := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err := filepath.WalkDir(srcDir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != srcDir {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"`pgscribe deadletters list`":                            "pgscribe-deadletters-list",
		"Several nodes: active/standby":                          "several-nodes-activestandby",
		"`[source.columns]`":                                     "sourcecolumns",
		"Spreading projections: `max_active_projections`":        "spreading-projections-max_active_projections",
		"1. The events table":                                    "1-the-events-table",
		"PostgreSQL failover and failover slots (PostgreSQL 17)": "postgresql-failover-and-failover-slots-postgresql-17",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}
