package migrations

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

func TestMigrationsEmbedded(t *testing.T) {
	if Latest() < 1 {
		t.Fatalf("Latest() = %d, want at least 1", Latest())
	}
	for i, m := range all {
		if i > 0 && m.version <= all[i-1].version {
			t.Errorf("migration %s has version %d after %d", m.name, m.version, all[i-1].version)
		}
		sql := strings.ReplaceAll(m.sql, schemaPlaceholder, `"x"`)
		if strings.Contains(sql, "{{") {
			t.Errorf("migration %s: unknown placeholder left after substitution", m.name)
		}
	}
}

func TestMigrationsParse(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	ok := "CREATE TABLE {{schema}}.t ();"
	tests := []struct {
		name    string
		fs      fstest.MapFS
		want    []int
		wantErr bool
	}{
		{"none", fstest.MapFS{}, nil, false},
		{"two in order", fstest.MapFS{"sql/0002_b.sql": file(ok), "sql/0001_a.sql": file(ok)}, []int{1, 2}, false},
		{"gap", fstest.MapFS{"sql/0001_a.sql": file(ok), "sql/0003_c.sql": file(ok)}, []int{1, 3}, false},
		{"by value, not name", fstest.MapFS{"sql/10_b.sql": file(ok), "sql/9_a.sql": file(ok)}, []int{9, 10}, false},
		{"same value", fstest.MapFS{"sql/0003_a.sql": file(ok), "sql/3_b.sql": file(ok)}, nil, true},
		{"duplicate", fstest.MapFS{"sql/0001_a.sql": file(ok), "sql/0001_b.sql": file(ok)}, nil, true},
		{"no number", fstest.MapFS{"sql/init.sql": file(ok)}, nil, true},
		{"zero", fstest.MapFS{"sql/0000_a.sql": file(ok)}, nil, true},
		{"no placeholder", fstest.MapFS{"sql/0001_a.sql": file("CREATE TABLE t ();")}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := parse(tt.fs)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parse() error = %v, wantErr %v", err, tt.wantErr)
			}
			var got []int
			for _, m := range ms {
				got = append(got, m.version)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("versions = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMigrationsCurrentWithGaps(t *testing.T) {
	knownVersions := Versions()
	latest := Latest()
	// unknown is a number below latest that no migration has (the numbers
	// have gaps), 0 when there is none.
	unknown := 0
	for v := latest - 1; v > 0 && unknown == 0; v-- {
		if !known(v) {
			unknown = v
		}
	}
	tests := []struct {
		name    string
		applied []int
		want    int
	}{
		{"none", nil, 0},
		{"all", knownVersions, latest},
		{"all but the last", knownVersions[:len(knownVersions)-1], knownVersions[len(knownVersions)-2]},
		{"first missing", knownVersions[1:], 0},
		{"unknown above", append(slices.Clone(knownVersions), latest+5), latest + 5},
		{"unknown below latest", []int{1, unknown}, latest + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "unknown below latest" && unknown == 0 {
				t.Skip("every version below latest is known")
			}
			if got := currentOf(tt.applied); got != tt.want {
				t.Errorf("currentOf(%v) = %d, want %d", tt.applied, got, tt.want)
			}
		})
	}
}

func TestMigrationsTableIdent(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr bool
	}{
		{"plain", "events", `"events"`, false},
		{"qualified", "app.events", `"app"."events"`, false},
		{"odd characters", `My Schema.ev"ents`, `"My Schema"."ev""ents"`, false},
		{"empty", "", "", true},
		{"three parts", "a.b.c", "", true},
		{"empty schema", ".events", "", true},
		{"empty table", "app.", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := tableIdent(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("tableIdent(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err == nil && id.Sanitize() != tt.want {
				t.Errorf("tableIdent(%q) = %s, want %s", tt.in, id.Sanitize(), tt.want)
			}
		})
	}
}

func TestMigrationsPublicationFixes(t *testing.T) {
	const pub, tbl = `"p"`, `"t"`
	create := "CREATE PUBLICATION \"p\" FOR TABLE \"t\" WITH (publish = 'insert', publish_via_partition_root = true)"
	add := `ALTER PUBLICATION "p" ADD TABLE "t"`
	drop := `ALTER PUBLICATION "p" DROP TABLE "t"`
	set := "ALTER PUBLICATION \"p\" SET (publish = 'insert')"
	viaRoot := "ALTER PUBLICATION \"p\" SET (publish_via_partition_root = true)"
	tests := []struct {
		name  string
		found bool
		st    pubState
		want  []string
	}{
		{"absent", false, pubState{}, []string{create}},
		{"as wanted", true, pubState{insert: true, viaRoot: true, covered: true}, nil},
		{"all tables, inserts only", true, pubState{insert: true, viaRoot: true, allTables: true, covered: true}, nil},
		{"publishes everything", true, pubState{insert: true, update: true, delete: true, truncate: true, viaRoot: true, covered: true}, []string{set}},
		{"updates only", true, pubState{update: true, viaRoot: true, covered: true}, []string{set}},
		{"truncate too", true, pubState{insert: true, truncate: true, viaRoot: true, covered: true}, []string{set}},
		{"other table", true, pubState{insert: true, viaRoot: true}, []string{add}},
		{"other table and ops", true, pubState{insert: true, delete: true, viaRoot: true}, []string{add, set}},
		{"row filter", true, pubState{insert: true, viaRoot: true, covered: true, restricted: true}, []string{drop, add}},
		{"not via the partition root", true, pubState{insert: true, covered: true}, []string{viaRoot}},
		{"made by an older pgscribe, publishing more", true, pubState{insert: true, update: true, covered: true}, []string{set, viaRoot}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			if got := st.fixes(tt.found, pub, tbl); !slices.Equal(got, tt.want) {
				t.Errorf("fixes() = %q, want %q", got, tt.want)
			}
		})
	}
}
