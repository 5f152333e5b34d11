// Package integration runs the built pgscribe binary end to end against a
// real PostgreSQL: core and crash tests, faults, failover, metrics and the
// operator CLI. TestMain (pgtest.Main) starts one server for the whole
// package; each test gets its own database. With -short nothing starts and
// every test that needs the server skips.
//
// # The harness
//
// Every test builds on the same pieces (harness_test.go, node_test.go);
// a new test file should too.
//
// Environment and names:
//   - newDatabase(t) — a fresh database, dropped with its slots at the end;
//     requireServer(t) skips without a server; srv() is the server
//     (Restart, CanRestart, HostPort).
//   - pgscribeBinary(t) — the binary, built once with -race.
//   - migrate(t, config) — `pgscribe migrate -events-table`.
//   - uniqueID(kind) — a server-wide unique slot prefix or role name;
//     slotName(prefix, projection, version) — the slot pgscribe creates.
//
// Configuration:
//   - newConfig(dsn, slotPrefix) — [database] url, [source] slot_prefix,
//     metrics on a free port, JSON logs; then .set(section, key, tomlValue),
//     .with(section, map), .raw(section, lines), .add(projection TOML) and
//     .write(t, path).
//   - projectionTOML(name, version, onError, rules...) (projectionKeysTOML
//     with more projection keys: schema, serve, ddl …) with
//     rule{name, on ("A,B" for several), when, op, table, key, set, inc,
//     message, sql, args}.
//
// The pgscribe process, node:
//   - newNode(t, name, config, env...) prepares, startNode starts;
//     start() (re)starts and waits for the metrics listener (not with
//     noListener set, for configurations with metrics off);
//     stop()/terminate(timeout) want exit 0 after SIGTERM, kill() sends
//     SIGKILL, signal(sig), wait(timeout) returns the exit code,
//     running()/exited()/err(), requireRunning().
//   - Its log: findLog/countLog/countLogAfter(mark)/waitLog(timeout, what,
//     match) over JSON records (logMsg(prefix, projection) matches),
//     logged/loggedAfter(mark, msg), logText(substr) over raw lines (text
//     logs), logString(record, key).
//   - Its listener: get(path), tryGet(path), scrape().value(name, labels),
//     metric(name, labels), projLabels(projection, k, v…).
//   - broken() / brokenOrHalted(): reasons that end a wait early. At
//     cleanup a node still running is killed, a data race or panic in its
//     output fails the test, and a failed test shows its last lines.
//
// Waits (no bare sleeps): waitUntil(t, timeout, what, cond(ctx) (bool,
// error), broken...) fails at the deadline, on an error or on a broken
// reason; poll is the same returning false at the deadline; waitFor takes a
// plain condition.
//
// Oracles, from the events table alone:
//   - accountedSQL / accounted(ctx, q, projection, version) — conservation:
//     applied + skipped + dead_lettered + adopted over the version's cursors;
//     eventCount; waitAccounted(t, q, timeout, projection, version,
//     broken...) waits for every event to be accounted for and fails at
//     once on more.
//   - sameRows(t, q, what, got, want, args...) — exactness: the two
//     queries return the same multiset of rows (EXCEPT ALL both ways).
//   - scalar[T](t, q, sql, args...) — a one-value query.
//   - verifyProjection(t, q, p) — every oracle of a coreProjection: the
//     per-stream cursors and outcomes, the dead letters, the read model
//     (rig.verify runs it per projection; foCluster.addProjection too).
//
// Writers: the rig's appender (concurrent expected-version appends, commit
// LSN bounds for the slot-confirmation oracle), the fault tests'
// appendEvents (explicit events, dead-letter expectations in metadata) and
// startWriter (ticks that survive outages).
//
// The families on top: rig (workload_test.go: core and crash tests, with
// verify, the per-stream exactness oracle), faultEnv (faults_helpers_test.go:
// checkAccounting, verifyClean), foCluster (failover_test.go: roles,
// leases, fencing), the metrics tests' mtConfig, cliEnv (cli_test.go:
// runCLI, status and dead-letter JSON contracts), rbEnv (rebuild_test.go:
// versions side by side, promote, retire, adoption) and wtEnv
// (wait_test.go: read-your-writes); the group tests (group_test.go:
// requireOnGroupSlot — the group's slot alone, every member's watermark on
// it, one walsender; groupNotAhead — guarantee 7 on the slot each member
// is recorded on; detachedHolds — a paused or halted member holds the
// group slot's confirmation back); and the seeded fault campaign
// (campaign_plan_test.go: a seed's plan — configuration, history,
// schedule; campaign_test.go: TestCampaign runs it, with one oracle after
// every step; docs/testing.md, "The fault campaign").
package integration
