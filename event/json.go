package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// DecodeDocument decodes a jsonb document. Objects become map[string]any,
// arrays []any, integral numbers that fit int64 become int64 (no precision
// loss, unlike encoding/json's float64 default), other numbers float64.
// A document that is not a JSON object (a scalar or array) is returned under
// the key "value" so rules can still reach it.
func DecodeDocument(raw []byte) (map[string]any, error) {
	if len(raw) == 0 {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode json: %w", err)
	}
	v = normalize(v)
	if m, ok := v.(map[string]any); ok {
		return m, nil
	}
	return map[string]any{"value": v}, nil
}

func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case json.Number:
		s := string(x)
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsInf(f, 0) {
			// Out of float range: keep the exact text rather than lose it.
			return s
		}
		return f
	default:
		return v
	}
}

// Decode fills Data and Metadata from RawData and RawMetadata unless they
// are already set. Not safe for concurrent use on one Event.
func (e *Event) Decode() error { return e.DecodeDocuments(true, true) }

// DecodeDocuments decodes Data (when data) and Metadata (when metadata)
// unless already set: rules decode only what their expressions read. The
// replication stage leaves decoding to the apply stage's partition
// workers, so it runs in parallel, off the single reader goroutine. A
// document that is not JSON returns a *DecodeError. Not safe for
// concurrent use on one Event.
func (e *Event) DecodeDocuments(data, metadata bool) error {
	if data && e.Data == nil {
		d, err := DecodeDocument(e.RawData)
		if err != nil {
			return &DecodeError{Err: fmt.Errorf("event %s data: %w", e.ID, err)}
		}
		e.Data = d
	}
	if metadata && e.Metadata == nil {
		m, err := DecodeDocument(e.RawMetadata)
		if err != nil {
			return &DecodeError{Err: fmt.Errorf("event %s metadata: %w", e.ID, err)}
		}
		e.Metadata = m
	}
	return nil
}

// DecodeError is an event document that is not JSON (possible with a json
// or text column, never with jsonb). It dead-letters the event with
// error_kind "decode".
type DecodeError struct{ Err error }

func (e *DecodeError) Error() string { return e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// Kind is the dead-letter error_kind.
func (e *DecodeError) Kind() string { return "decode" }

// Message is the dead-letter error_message.
func (e *DecodeError) Message() string { return e.Err.Error() }
