package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestREADMEQuickStart follows README.md's "Your own events table in ten
// minutes" with the README's own SQL and configuration, read from the
// file: migrate, check, run, the append and the read that waits for it,
// status and the dead letter, each with what the README shows.
func TestREADMEQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and the binary; skipped with -short")
	}
	t.Parallel()
	src, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	for _, m := range regexp.MustCompile("(?s)```(\\w*)\n(.*?)```").FindAllStringSubmatch(string(src), -1) {
		blocks[m[1]] = append(blocks[m[1]], m[2])
	}
	if len(blocks["sql"]) < 3 || len(blocks["toml"]) < 1 {
		t.Fatalf("README.md: want the events table, the read model and the append as sql blocks and the configuration as a toml block, got %d and %d", len(blocks["sql"]), len(blocks["toml"]))
	}
	readModel, appendSQL, toml := blocks["sql"][1], blocks["sql"][2], blocks["toml"][0]
	// The README's [database] section is its URL alone; this test's
	// database, slot prefix and metrics port replace it.
	database, projections, ok := strings.Cut(toml, "[[projection]]")
	if !ok || !regexp.MustCompile(`^\[database\]\nurl = "[^"]*"\n\n$`).MatchString(database) {
		t.Fatalf("README.md's configuration is not [database] url, then [[projection]]:\n%s", toml)
	}

	e := newCLIEnv(t)
	cfg := newConfig(e.dsn, e.prefix).add("[[projection]]"+projections).write(t, e.dir+"/pgscribe.toml")

	e.mustRun(0, "migrate", "-config", cfg, "-events-table")
	e.exec(readModel)
	if r := e.mustRun(0, "check", "-config", cfg); !strings.Contains(r.stdout, "ok (1 projection; databases checked)") {
		t.Fatalf("check: %s", r)
	}
	e.start(cfg)

	// Step 5: the append, the wait (true), then the rows the README shows
	// in its comment.
	stmts := strings.SplitAfter(appendSQL, ";")
	if len(stmts) < 3 {
		t.Fatalf("README.md's append block is not INSERT; wait; SELECT:\n%s", appendSQL)
	}
	e.exec(stmts[0])
	if !scalar[bool](t, e.conn, stmts[1]) {
		t.Fatalf("README.md's wait returned false: %s", stmts[1])
	}
	var want []string
	for _, m := range regexp.MustCompile(`(?m)^--\s+(acct-\S+)\s+\|\s+(\S+)\s+\|\s+(-?\d+)$`).FindAllStringSubmatch(appendSQL, -1) {
		want = append(want, strings.Join(m[1:], " "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := e.conn.Query(ctx, stmts[2])
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var account, owner string
		var balance int64
		if err := rows.Scan(&account, &owner, &balance); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %d", account, owner, balance))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("balances after README.md's append:\n%s\nthe README shows:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Steps 6 and 7: status and the dead letter, as the README shows them
	// (but for times, WAL positions and the node's name).
	// Live once the group's stream reads the slot, a moment after the
	// backfill (status says starting until then).
	live := regexp.MustCompile(`(?m)^balances v1\s+live\s`)
	var st cliResult
	if !poll(t, 30*time.Second, "status to say live", func(context.Context) (bool, error) {
		st = e.mustRun(0, "status", "-config", cfg)
		return live.MatchString(st.stdout), nil
	}) {
		t.Errorf("status: %s", st)
	}
	r := e.mustRun(0, "deadletters", "list", "-config", cfg)
	if !strings.Contains(r.stdout, "balances v1  4         acct-2/2  Withdrawn  rule:positive_amount  amount must be positive, got 0") {
		t.Errorf("deadletters list: %s", r)
	}
	if r := e.mustRun(0, "deadletters", "retry", "-config", cfg, "-dry-run", "-id", "1"); !strings.Contains(r.stdout,
		`dead letter 1 (balances v1, stream acct-2 position 2, Withdrawn): fails again in the rules: projection "balances" v1, rule "positive_amount"`) {
		t.Errorf("deadletters retry -dry-run: %s", r)
	}
	if r := e.mustRun(0, "deadletters", "discard", "-config", cfg, "-id", "1", "-yes"); !strings.Contains(r.stdout,
		"discarded 1 dead letter(s) of balances v1 (now counted as skipped)") {
		t.Errorf("deadletters discard: %s", r)
	}
}
