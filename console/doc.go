// Package console serves pgscribe's web console: an overview of every
// projection version (what `pgscribe status` reports, with sparklines of
// the last minutes), a page per version (its rules, history, dead letters
// and parked streams), and the operator actions (pause, resume, dead-letter
// retry/skip/discard, promote, retire) behind a token.
//
// Everything it shows comes from the databases through package admin, as
// the CLI reads it, so it works from any host with no engine running; the
// actions call the same admin functions as the CLI commands. A sampler
// goroutine reads the status every Interval while someone looks (every Idle
// for Sleep after the last view, then not until the next view; never
// sooner than 20 times the last reading's duration) on pooled connections, and keeps History samples per version
// for the sparklines; a page view renders the latest sample and costs the
// database nothing. The counts among it (events, backlogs, dead letters,
// parked events: admin.StatusCounts, full passes over growing tables) are
// read every Counts only, at the first reading and after an action, and
// reused between; the page says how old they are. Version pages read dead letters on demand, one page of
// them at a time.
//
// The HTML is rendered on the server (html/template, so event data is
// escaped wherever it lands) with its stylesheet and one small script
// embedded in the binary. The pages are complete without JavaScript; with
// it, the script re-fetches the page every few seconds and swaps the part
// marked live. A Content-Security-Policy allows scripts and styles from the
// console only, a second line of defence against injected markup.
//
// Actions are off unless the configuration sets [metrics] console_token or
// console_auth_header. A POST must carry the token (form field "token",
// header "Authorization: Bearer …"), compared in constant time, or come
// through the trusted proxy header together with the per-process form
// secret of a page this console rendered (CSRF). Every action is logged
// with who asked and what it did.
package console
