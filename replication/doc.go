// Package replication reads the events table: it manages the logical
// replication slot, backfills under the slot's exported snapshot, and
// streams pgoutput (protocol 1) changes, decoding inserts into events.
//
// Ordering constraints this package keeps:
//
//   - The exported snapshot is imported (SET TRANSACTION SNAPSHOT and a
//     first query) before the replication connection sends any other
//     command; the importing transaction then keeps it valid for the whole
//     backfill.
//   - The slot is confirmed (standby status update, flush position set
//     explicitly) only to what the Sink says is durably accounted for, or,
//     when nothing at all is in flight, to the WAL end the server reported
//     in a keepalive, so an idle events table never makes the slot retain
//     WAL.
//   - Events are handed to the Sink in commit order. While the Sink is full
//     (backpressure) status updates keep flowing so the server does not
//     time the connection out, and the stall clock is paused.
//   - Backfill and stream decode a row through one decoder (decode.go),
//     from the text its columns' output functions print, so the two paths
//     cannot read an event differently. A change for a relation that is
//     neither the events table nor one of its partitions is an error
//     (ErrForeignRelation), never skipped.
//
// The package knows nothing of rules or of how events are applied.
package replication
