// Package admin holds the operator commands and their text and JSON
// output: check (configuration, rules and databases), status (with -watch
// and progress bars), reset, deadletters list and stats, and migrate. They
// read what a running engine records (the leases, watermarks, cursors and
// dead_letters tables, the slot, pg_locks) and never run a projection
// themselves; package engine does that. main maps their errors to exit
// codes (ErrProblems and ErrNotConfirmed exit 2).
package admin
