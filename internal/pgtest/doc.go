// Package pgtest starts a real PostgreSQL server for tests, benchmarks and
// the demo, hands out isolated databases on it, restarts it to simulate a
// crash, and cuts connections to it through a TCP proxy.
//
// # Where the server comes from
//
// Start picks the first of three modes that applies:
//
//   - external: PGSCRIBE_TEST_DATABASE_URL is set. The server is used as it
//     is (it must have wal_level=logical for replication tests); Start only
//     checks that it answers. Databases are created and dropped on it, and
//     Stop drops the ones this Server created and did not drop. It cannot be
//     restarted.
//   - docker: a Docker engine answers. A container of PGSCRIBE_TEST_PG_IMAGE
//     (default postgres:16) is started with dockertest, its port 5432
//     published on a fixed free port of 127.0.0.1 so that a restart keeps the
//     address. When the image is absent and cannot be pulled, Start falls
//     back to local binaries (`make pg-image` builds a local image from the
//     machine's PostgreSQL install where no registry is reachable).
//   - local: the initdb, pg_ctl and postgres binaries of this machine
//     ($PGSCRIBE_PG_BIN, else the newest /usr/lib/postgresql/*/bin, else
//     $PATH), a cluster in a temporary directory, listening on a free port of
//     127.0.0.1. PostgreSQL refuses to run as root, so under root the
//     binaries run as the `postgres` user (created if missing).
//
// PGSCRIBE_TEST_PG_MODE=docker|local|external forces a mode instead.
//
// # Settings
//
// Every server started by pgtest runs with wal_level=logical,
// max_replication_slots=64, max_wal_senders=64, track_commit_timestamp=on,
// max_connections=200 and fsync=off; Options.Settings adds to them and may
// override them. fsync=off only loses data when the operating system
// crashes: a crash of PostgreSQL itself (Restart with immediate=true) keeps
// every committed transaction, which is what the fault tests exercise.
// Benchmarks that compare against fsync-bound loops should set fsync=on.
//
// # Leftovers
//
// Containers and temporary clusters carry the process id of their owner.
// Start removes the ones whose owner process is gone (a test binary killed
// by a timeout never runs its cleanup), so they do not pile up.
package pgtest
