package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// durabilityOwners are the files that may write a watermark row or confirm
// a slot: the ledger (a version's watermark, its slot, its backfill phase)
// and the saver (a group's members' watermarks in one transaction). The
// stores' SQL lives in cursor/, the replication protocol in replication/;
// everything else reaches them through these two files.
var durabilityOwners = []string{"engine/ledger.go", "engine/saver.go"}

// durabilityWriters are the functions that write a watermark row or
// confirm a slot, by package: calling one outside durabilityOwners (and
// the package that defines it) fails TestDurabilityHasOneOwner.
var durabilityWriters = map[string][]string{
	"cursor":      {"SaveWatermark", "SaveWatermarkStatement", "SaveWatermarksStatement", "SetPhase", "MoveWatermark", "MoveWatermarkStatement"},
	"replication": {"Confirm"},
}

// watermarkWrite matches SQL that writes the watermarks table.
var watermarkWrite = regexp.MustCompile(`(?is)\b(insert\s+into|update|delete\s+from)\b[^;]*\bwatermarks\b`)

// TestDurabilityHasOneOwner: no code outside the ledger and the saver
// writes a watermark row or confirms a slot. It reads every non-test Go
// file of the module: a call of a durabilityWriters function elsewhere, or
// SQL that writes the watermarks table outside cursor/, fails it, naming
// the file and line.
func TestDurabilityHasOneOwner(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var writers []string
	for _, names := range durabilityWriters {
		writers = append(writers, names...)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		pkgDir := filepath.ToSlash(filepath.Dir(rel))
		owner := slices.Contains(durabilityOwners, rel)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || !slices.Contains(writers, sel.Sel.Name) || owner {
					return true
				}
				for pkg, names := range durabilityWriters {
					if pkgDir == pkg || !slices.Contains(names, sel.Sel.Name) {
						continue
					}
					// A package-qualified call (replication.Confirm) or a
					// method of a cursor.Store: both are the writer.
					if id, ok := sel.X.(*ast.Ident); ok && id.Name != pkg && pkg == "replication" {
						continue
					}
					t.Errorf("%s: calls %s.%s: only %s write a watermark or confirm a slot",
						fset.Position(n.Pos()), pkg, sel.Sel.Name, strings.Join(durabilityOwners, " and "))
				}
			case *ast.BasicLit:
				if n.Kind != token.STRING || pkgDir == "cursor" || pkgDir == "migrations" {
					return true
				}
				if s, err := strconv.Unquote(n.Value); err == nil && watermarkWrite.MatchString(s) {
					t.Errorf("%s: SQL that writes the watermarks table outside cursor/: %.80q", fset.Position(n.Pos()), s)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read %d Go files under %s: not the module", files, root)
	}
}
