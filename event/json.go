package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
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
func (e *Event) Decode() error { return e.DecodeDocuments(All, All) }

// Want says how much of a JSON document to decode: nothing (the zero
// value), the whole document (All), or only some top-level keys.
type Want struct {
	All  bool
	Keys []string // with All false: the top-level keys to decode
}

// All decodes a whole document.
var All = Want{All: true}

func (w Want) none() bool { return !w.All && len(w.Keys) == 0 }

// Union is what w and o want together: the whole document when either
// wants it whole, else both's keys.
func (w Want) Union(o Want) Want {
	if w.All || o.All {
		return All
	}
	keys := slices.Clone(w.Keys)
	for _, k := range o.Keys {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return Want{Keys: keys}
}

// DecodeDocuments decodes Data and Metadata as far as data and metadata
// want, unless already set: rules decode only what their expressions
// read. A document of which only some keys are wanted becomes a map of
// those keys that it has. The replication stage leaves decoding to the
// apply stage's partition workers, so it runs in parallel, off the single
// reader goroutine. A document that is not JSON returns a *DecodeError
// (whatever is wanted of it), and so does an event whose Invalid is set.
// Not safe for concurrent use on one Event.
func (e *Event) DecodeDocuments(data, metadata Want) error {
	if e.Invalid != nil {
		return e.Invalid
	}
	if !data.none() && e.Data == nil {
		d, err := decodeWanted(e.RawData, data)
		if err != nil {
			return &DecodeError{Err: fmt.Errorf("event %s data: %w", e.ID, err)}
		}
		e.Data = d
	}
	if !metadata.none() && e.Metadata == nil {
		m, err := decodeWanted(e.RawMetadata, metadata)
		if err != nil {
			return &DecodeError{Err: fmt.Errorf("event %s metadata: %w", e.ID, err)}
		}
		e.Metadata = m
	}
	return nil
}

func decodeWanted(raw []byte, w Want) (map[string]any, error) {
	if w.All || len(raw) == 0 {
		return DecodeDocument(raw)
	}
	return DecodeKeys(raw, w.Keys)
}

// DecodeKeys is DecodeDocument for only the given top-level keys of an
// object: the other values are skipped over, never built, which is most
// of the cost of decoding. The whole document is still checked to be JSON.
// A document that is not an object is decoded whole, as DecodeDocument
// does.
func DecodeKeys(raw []byte, keys []string) (map[string]any, error) {
	if !gjson.ValidBytes(raw) {
		return DecodeDocument(raw) // for encoding/json's description of the error
	}
	doc := gjson.ParseBytes(raw)
	if !doc.IsObject() {
		return DecodeDocument(raw)
	}
	m := make(map[string]any, len(keys))
	var err error
	doc.ForEach(func(k, v gjson.Result) bool {
		key := validUTF8(k.Str)
		if !slices.Contains(keys, key) {
			return true
		}
		// A repeated key (json, never jsonb) keeps the last, as
		// encoding/json and jsonb do.
		m[key], err = jsonValue(v)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// validUTF8 replaces each byte of s that is not UTF-8 with U+FFFD, as
// encoding/json does (possible with a json or text column in a database
// whose encoding is not UTF8; never with jsonb).
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for _, r := range s {
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

// jsonValue converts one gjson value as DecodeDocument would.
func jsonValue(v gjson.Result) (any, error) {
	switch v.Type {
	case gjson.Null:
		return nil, nil
	case gjson.True:
		return true, nil
	case gjson.False:
		return false, nil
	case gjson.String:
		return validUTF8(v.Str), nil
	case gjson.Number:
		return normalize(json.Number(v.Raw)), nil
	default: // an object or array
		dec := json.NewDecoder(strings.NewReader(v.Raw))
		dec.UseNumber()
		var x any
		if err := dec.Decode(&x); err != nil {
			return nil, fmt.Errorf("decode json: %w", err)
		}
		return normalize(x), nil
	}
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
