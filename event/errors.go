package event

import "errors"

// ErrFenced is returned when the lease epoch no longer matches: another
// node took over this projection. Nothing of the batch was committed. It
// lives in the leaf because leader/ produces it and apply/ and engine/ act
// on it.
var ErrFenced = errors.New("fenced: lease epoch changed, another node owns this projection")
