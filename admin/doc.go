// Package admin holds the operator commands and their text and JSON
// output, one exported function per command (docs/cli.md describes each):
//
//   - Migrate: the engine schema, the publication, the reference events
//     table and each version's read-model DDL
//   - Check: the configuration, the rules and the databases
//   - ShowStatus (Status for the report alone): status, with -watch and
//     progress bars
//   - ListDeadLetters, DeadLetterStats, RetryDeadLetters (retry and skip)
//     and DiscardDeadLetters: the deadletters subcommands
//   - Pause and Resume: the controls table, which the engine obeys
//   - Reset, Promote and Retire: a version's lifecycle
//   - Test: rule fixtures, with -database in a scratch schema
//   - Verify: a rebuild in a scratch schema diffed with the live read model
//   - Wait: the SQL wait functions, for scripts
//
// They read what a running engine records (the leases, watermarks,
// cursors and dead_letters tables, the slot, pg_locks) and write only
// what an operator asks for: controls and retry requests that the engine
// carries out, discarded dead letters, a reset or retired version's rows
// and slot, promote's views, migrate's schema, and test's and verify's
// scratch schemas. None runs a projection; package engine does that.
// main maps their errors to exit codes: ErrProblems, ErrNotConfirmed,
// ErrDiscardNotConfirmed, ErrWrongCommand, ErrVerifyUsage and a
// *FixtureError exit 2.
package admin
