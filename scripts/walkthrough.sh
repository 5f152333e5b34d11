#!/usr/bin/env bash
# The first hour of a new user, as a script: the first CLI messages (README.md,
# docs/cli.md) and `make demo` stopped the way a user stops it, each checked.
# `make walkthrough` runs it, and CI after the tests (.ci/run).
#
# It starts from an empty state (no bin/, a temporary directory of its
# own, nothing on the demo's metrics port) and checks that each demo run
#   - stops gracefully on one signal to its whole process group (what
#     Ctrl-C in a terminal and `timeout` send): the engine logs one stop,
#     no "second signal", and exits 0;
#   - leaves nothing behind: no engine process, no PostgreSQL server
#     (container or cluster directory), nothing in the temporary
#     directory (no go-build… binary), the metrics port free again.
# Every wait has a deadline; the whole takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
GO=${GO:-go}

fail() {
	echo "walkthrough: FAIL: $*" >&2
	exit 1
}
step() { echo "walkthrough: $*"; }

work=$(mktemp -d)
pid=
# On any exit (a failed check, a timeout's SIGTERM): stop a demo still
# running, then remove the work directory.
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM -- "-$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# Everything below (go build, the demo) puts its temporary files here;
# it must be empty again at the end.
export TMPDIR="$work/tmp"
mkdir "$TMPDIR"
# The PostgreSQL image `make pg-image` chose, as `make demo` uses it.
if [ -z "${PGSCRIBE_TEST_PG_IMAGE:-}" ] && [ -s .cache/pg-image ]; then
	export PGSCRIBE_TEST_PG_IMAGE=$(cat .cache/pg-image)
fi
unset PGSCRIBE_CONFIG PGSCRIBE_DATABASE_URL

metrics_port_busy() { (exec 3<>/dev/tcp/127.0.0.1/9187) 2>/dev/null; }
if metrics_port_busy; then
	fail "127.0.0.1:9187 is in use (another engine or demo runs): the demo's engine needs it"
fi

step "empty state: no bin/, then make build"
rm -f bin/pgscribe bin/demo
make --no-print-directory build GO="$GO" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "make build"; }

# run_cli CODE CMD… runs a command, checks its exit code and leaves its
# combined output in $out.
run_cli() {
	local want=$1 rc=0
	shift
	out=$("$@" 2>&1) || rc=$?
	[ "$rc" = "$want" ] || fail "$*: exit $rc, want $want:"$'\n'"$out"
}
contains() { [[ $out == *"$1"* ]] || fail "output lacks \"$1\":"$'\n'"$out"; }

step "pgscribe frobnicate: the error and a one-line hint"
run_cli 2 bin/pgscribe frobnicate
[ "$out" = "pgscribe: unknown command \"frobnicate\" (run 'pgscribe help' for usage)" ] ||
	fail "unknown command, want one line:"$'\n'"$out"

step "pgscribe status without a config file: how to pass one"
run_cli 2 env -C "$work" "$repo/bin/pgscribe" status
contains "./pgscribe.toml: cannot read: no such file or directory"
contains "-config FILE or PGSCRIBE_CONFIG=FILE"

step "pgscribe version: version, commit, its date, Go"
run_cli 0 bin/pgscribe version
[ "$(wc -l <<<"$out")" = 4 ] || fail "version, want 4 lines:"$'\n'"$out"
if commit=$(git rev-parse HEAD 2>/dev/null); then contains "commit   $commit"; fi
contains "date     20"
contains "go       go1."

step "pgscribe check: 1 projection, 2 projections"
run_cli 0 bin/pgscribe check -offline -config config.toml.example
contains "config.toml.example: ok (2 projections; databases not checked)"
sed '/^# Projection `activity`/,$d' config.toml.example >"$work/one.toml"
run_cli 0 bin/pgscribe check -offline -config "$work/one.toml"
contains "ok (1 projection; databases not checked)"

# wait_for LOG REGEX SECONDS PID waits for a line of the log to match
# while process PID runs.
wait_for() {
	local deadline=$((SECONDS + $3))
	until grep -Eq "$2" "$1"; do
		if [ $SECONDS -ge $deadline ] || ! kill -0 "$4" 2>/dev/null; then
			cat "$1"
			fail "no line matching /$2/ within $3s"
		fi
		sleep 0.2
	done
}

# left_behind LOG checks that the demo of LOG left nothing running.
left_behind() {
	local log=$1 pid name dir
	pid=$(sed -nE 's/^demo: engine started \(pid ([0-9]+)\)$/\1/p' "$log")
	[ -n "$pid" ] || fail "the demo did not report the engine's pid"
	if kill -0 "$pid" 2>/dev/null; then fail "engine (pid $pid) still runs"; fi
	name=$(sed -nE 's/^demo: pgtest: docker server (pgtest-[0-9a-f-]+) .*/\1/p' "$log")
	if [ -n "$name" ] && docker ps -a --format '{{.Names}}' | grep -qx "$name"; then
		fail "container $name still exists"
	fi
	dir=$(sed -nE 's/^demo: pgtest: local server .* data in (.*)\/data$/\1/p' "$log")
	if [ -n "$dir" ] && [ -e "$dir" ]; then fail "local cluster $dir still exists"; fi
	[ -n "$name$dir" ] || fail "the demo did not say which server it started"
	[ -z "$(ls -A "$TMPDIR")" ] || fail "left in the temporary directory: $(ls -A "$TMPDIR")"
	if metrics_port_busy; then fail "127.0.0.1:9187 still answers"; fi
}

# one_stop LOG checks that the engine stopped once, gracefully.
one_stop() {
	local n
	n=$(grep -c 'msg="stopping: finishing in-flight batches"' "$1" || true)
	[ "$n" = 1 ] || { cat "$1"; fail "engine logged $n graceful stops, want 1"; }
	if grep -q 'second signal' "$1"; then cat "$1"; fail "the engine got a second signal"; fi
	grep -qx 'demo: engine exited 0' "$1" || { cat "$1"; fail "the engine did not exit 0"; }
}

# Job control: each background job below gets a process group of its own,
# as a terminal's foreground job has, and SIGINT is not ignored in it (a
# script's background jobs otherwise start with SIGINT ignored).
set -m

step "make demo, then Ctrl-C (SIGINT to its process group)"
log=$work/demo-make.log
make --no-print-directory demo GO="$GO" >"$log" 2>&1 &
pid=$!
wait_for "$log" '^  events [0-9]+ · balances accounted' 90 "$pid"
kill -INT -- "-$pid"
rc=0
wait "$pid" || rc=$?
one_stop "$log"
if grep -q '^make: \*\*\*' "$log"; then cat "$log"; fail "make reported an error"; fi
# GNU make re-raises a SIGINT it got itself, so its status is 130 even
# though the demo under it exited 0.
[ "$rc" = 130 ] || { cat "$log"; fail "make demo: exit $rc, want 130 (SIGINT, no error)"; }
grep -q '^demo: backfill complete: activity v1 500 events, balances v1 500 events$' "$log" ||
	{ cat "$log"; fail "the engine did not backfill the 500 events the demo appended"; }
left_behind "$log"

step "bin/demo -rate 0 (backfill only), then SIGTERM to its group, as timeout -s TERM sends"
log=$work/demo-backfill.log
bin/demo -rate 0 -bin bin/pgscribe -config config.toml.example -schema examples/demo/schema.sql >"$log" 2>&1 &
pid=$!
wait_for "$log" '^  events 500 · balances accounted 500 · dead letters 5 ' 90 "$pid"
kill -TERM -- "-$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || { cat "$log"; fail "demo: exit $rc, want 0"; }
one_stop "$log"
# status after the backfill alone: COMMITTED (7th field) is a time.
committed=$(grep -E '^(balances|activity) v1 ' "$log" | awk '{print $7}')
[ "$(grep -c '^20' <<<"$committed")" = 2 ] || { cat "$log"; fail "status COMMITTED after a backfill: $committed"; }
left_behind "$log"

step "ok ($SECONDS s)"
