package replication

import (
	"errors"

	"github.com/jackc/pgerrcode"

	"github.com/pgscribe/pgscribe/sqlstate"
)

// ErrStreamEnded is returned when the server ended the replication stream
// (CopyDone) without an error: a walsender shutting down, not a fault of
// the slot.
var ErrStreamEnded = errors.New("replication: server ended the stream")

// Classify is sqlstate.Classify for the source's errors: a stalled or
// ended stream is a lost connection (transient), not a broken deployment,
// though neither carries a SQLSTATE. Everything else is classified by
// sqlstate: an error without a SQLSTATE that is not a connection failure
// (a row the decoder cannot read, a relation without a mapped column) is
// structural.
//
// 55006 (object_in_use) is transient here too: a walsender that a former
// holder left on the slot ("replication slot is active") exits in a
// moment, and the next session frees the slot first.
func Classify(err error) sqlstate.Class {
	if errors.Is(err, ErrStalled) || errors.Is(err, ErrStreamEnded) || sqlstate.Code(err) == pgerrcode.ObjectInUse {
		return sqlstate.ClassTransient
	}
	return sqlstate.Classify(err)
}
