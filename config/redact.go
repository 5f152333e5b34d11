package config

import (
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
)

const redacted = "xxxxx"

// kvSecretRE finds password and sslpassword settings in a keyword/value
// connection string; values may be single-quoted with backslash escapes.
var kvSecretRE = regexp.MustCompile(`(?i)((?:^|\s)(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)

// RedactURL returns the connection string with every password replaced by
// "xxxxx", so that it can be logged. It handles both forms pgx accepts: URLs
// (postgres://user:secret@host/db?sslpassword=…) and keyword/value strings
// (host=… password=secret). Parsing is deliberately loose: when unsure it
// hides too much rather than too little.
func RedactURL(dsn string) string {
	scheme, rest, isURL := strings.Cut(dsn, "://")
	if !isURL {
		return kvSecretRE.ReplaceAllString(dsn, "${1}"+redacted)
	}
	// The authority ends at the first '/' or '?', but an unescaped '/' or '@'
	// in a password would end it early; taking the last '@' before the query
	// hides the whole password even then.
	beforeQuery, query, hasQuery := strings.Cut(rest, "?")
	if at := strings.LastIndex(beforeQuery, "@"); at >= 0 {
		if user, _, hasPassword := strings.Cut(beforeQuery[:at], ":"); hasPassword {
			beforeQuery = user + ":" + redacted + beforeQuery[at:]
		}
	}
	out := scheme + "://" + beforeQuery
	if !hasQuery {
		return out
	}
	params := strings.Split(query, "&")
	for i, kv := range params {
		k, _, _ := strings.Cut(kv, "=")
		if name, err := url.QueryUnescape(k); err != nil || isSecretParam(name) {
			params[i] = k + "=" + redacted
		}
	}
	return out + "?" + strings.Join(params, "&")
}

func isSecretParam(name string) bool {
	name = strings.ToLower(name)
	return name == "password" || name == "sslpassword"
}

// String shows the connection strings with passwords hidden, so that
// printing a Config (%v, %+v) cannot leak them.
func (d Database) String() string {
	return fmt.Sprintf("{URL:%s TargetURL:%s}", RedactURL(d.URL), RedactURL(d.TargetURL))
}

// LogValue logs the connection strings with passwords hidden.
func (d Database) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", RedactURL(d.URL)),
		slog.String("target_url", RedactURL(d.TargetURL)),
	)
}
