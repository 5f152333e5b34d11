package console

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/deadletter"
)

// An action is one operator command the console can run. Each goes
// through the admin function of its CLI command.
type action struct {
	Name  string // path segment: pause, resume, retry, skip, discard, promote, retire
	Title string // button text
	// Says is what it will do, in the confirmation.
	Says string
	// DeadLetters is true for the actions that take a dead-letter selection.
	DeadLetters bool
	// Danger marks the destructive ones (red button).
	Danger bool
}

var actions = map[string]action{
	"pause": {Name: "pause", Title: "Pause",
		Says: "The active node stops applying within a second (the batches in flight commit first) and keeps its lock and slot. While paused, the slot retains WAL on the source. The pause is stored in the engine schema: it holds across restarts and failovers until resumed. Same as pgscribe pause."},
	"resume": {Name: "resume", Title: "Resume",
		Says: "Ends the pause, or makes a halted version's active node retry the halted work now (if the cause is still there it halts again). Same as pgscribe resume."},
	"retry": {Name: "retry", Title: "Retry", DeadLetters: true,
		Says: "Asks the active node to apply the selected dead letters again with the rules it runs now, per stream in position order; an event that fails again stays, with its new reason. Queued when no engine runs the version. The dry run below shows what the configured rules would write now. Same as pgscribe deadletters retry."},
	"skip": {Name: "skip", Title: "Skip", DeadLetters: true, Danger: true,
		Says: "The active node drops the selected dead letters (counted as skipped in their cursors) and releases the events their streams parked, in order, without them. Their events are never applied. Same as pgscribe deadletters skip."},
	"discard": {Name: "discard", Title: "Discard", DeadLetters: true, Danger: true,
		Says: "Deletes the selected dead letters now, with no engine needed, and counts them as skipped in their cursors. Their events are never applied. Same as pgscribe deadletters discard -yes."},
	"promote": {Name: "promote", Title: "Promote", Danger: true,
		Says: "Serves this version: in one transaction, points every view of its serve schema at this version's tables and records it as served. Refused unless the version is live, lags at most 10s and is not halted. Same as pgscribe promote."},
	"retire": {Name: "retire", Title: "Retire", Danger: true,
		Says: "Removes this version: its slot, cursors, watermark, dead letters and lease (its schema and tables stay). Refused for the served version and while an engine runs it. Same as pgscribe retire."},
}

var (
	errActionsOff = errors.New("actions are off: set [metrics] console_token (or console_auth_header behind a trusted proxy) to enable them")
	errNoToken    = errors.New("refused: this action needs the console token")
	errBadCSRF    = errors.New("refused: the form is not one this console rendered (reload the page and confirm again)")
)

func (s *Server) actionsEnabled() bool {
	return s.cfg.Metrics.ConsoleToken != "" || s.cfg.Metrics.ConsoleAuthHeader != ""
}

// authorize says who sends r, or why r may not act. A request through the
// trusted proxy header is that header's user and must carry the form
// secret of a page this console rendered (a cross-site form cannot know
// it); any other needs the token, which no cross-site form knows either.
func (s *Server) authorize(r *http.Request) (string, error) {
	if !s.actionsEnabled() {
		return "", errActionsOff
	}
	if h := s.cfg.Metrics.ConsoleAuthHeader; h != "" {
		if user := r.Header.Get(h); user != "" {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				return "", errBadCSRF
			}
			return user, nil
		}
	}
	tok := s.cfg.Metrics.ConsoleToken
	if tok == "" {
		return "", errNoToken
	}
	got := r.PostFormValue("token")
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		got = b
	}
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(tok)) != 1 {
		return "", errNoToken
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "token holder at " + host, nil
}

// selection is the dead letters an action applies to: ids, or the
// version page's filter.
type selection struct {
	IDs    []int64
	Filter dlFilter
}

func selectionOf(r *http.Request) (selection, error) {
	sel := selection{Filter: filterOf(r)}
	sel.Filter.After = 0
	for _, v := range r.Form["id"] {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			id, err := strconv.ParseInt(part, 10, 64)
			if err != nil || id < 1 {
				return sel, fmt.Errorf("not a dead letter id: %q", part)
			}
			sel.IDs = append(sel.IDs, id)
		}
	}
	return sel, nil
}

func (sel selection) filter(projection string, version int64) deadletter.Filter {
	f := sel.Filter.of(projection, version)
	f.IDs = sel.IDs
	return f
}

// Describe says which dead letters, in words.
func (sel selection) Describe() string {
	var parts []string
	if len(sel.IDs) > 0 {
		ids := make([]string, len(sel.IDs))
		for i, id := range sel.IDs {
			ids[i] = strconv.FormatInt(id, 10)
		}
		parts = append(parts, "id "+strings.Join(ids, ", "))
	}
	if sel.Filter.Kind != "" {
		parts = append(parts, "kind "+sel.Filter.Kind)
	}
	if sel.Filter.Rule != "" {
		parts = append(parts, "rule "+sel.Filter.Rule)
	}
	if sel.Filter.Stream != "" {
		parts = append(parts, "stream "+sel.Filter.Stream)
	}
	if len(parts) == 0 {
		return "every dead letter of this version"
	}
	return "the dead letters with " + strings.Join(parts, ", ")
}

// actionPage is what the confirmation and the result of an action show.
type actionPage struct {
	page
	Action     action
	Projection string
	Version    int64
	Selection  selection // of the dead-letter actions
}

// actionRequest reads an action's path and form, with its dead-letter
// selection; false when it answered the request already (an unknown
// action, a malformed form).
func (s *Server) actionRequest(w http.ResponseWriter, r *http.Request) (actionPage, bool) {
	proj, ver, ok := s.versionOf(r)
	a, known := actions[r.PathValue("action")]
	if !ok || !known {
		http.Error(w, "no such action", http.StatusNotFound)
		return actionPage{}, false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return actionPage{}, false
	}
	sel, err := selectionOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return actionPage{}, false
	}
	p := actionPage{page: s.basePage(r, fmt.Sprintf("%s %s v%d · pgscribe console", a.Title, proj, ver), sample{}),
		Action: a, Projection: proj, Version: ver, Selection: sel}
	p.Refresh = 0 // not live: a form must not change under the operator
	return p, true
}

// onAction serves h with the request's actionPage; a request that
// actionRequest answered already goes no further.
func (s *Server) onAction(h func(http.ResponseWriter, *http.Request, actionPage)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if ap, ok := s.actionRequest(w, r); ok {
			h(w, r, ap)
		}
	}
}

// filter is the dead-letter filter of the page's selection.
func (p actionPage) filter() deadletter.Filter {
	return p.Selection.filter(p.Projection, p.Version)
}

type confirmData struct {
	actionPage
	Matching   int64
	Preview    string
	PreviewErr string
}

// confirm shows what an action will do, with a dry run for the dead-letter
// actions, and the form that does it.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request, ap actionPage) {
	d := confirmData{actionPage: ap}
	if ap.Action.DeadLetters {
		ctx, cancel := context.WithTimeout(r.Context(), s.opts.ActionTimeout)
		defer cancel()
		f := ap.filter()
		st, err := deadletter.GetStats(ctx, s.target, s.cfg.Engine.Schema, f)
		if err != nil {
			d.PreviewErr = err.Error()
		}
		d.Matching = st.Total
		var out bytes.Buffer
		switch ap.Action.Name {
		case "retry":
			err = admin.RetryDeadLetters(ctx, s.cfg, admin.RetryOptions{Filter: f, DryRun: true, Programs: s.progs}, &out)
		case "discard":
			err = admin.DiscardDeadLetters(ctx, s.cfg, admin.DiscardOptions{Filter: f}, &out)
			if errors.Is(err, admin.ErrDiscardNotConfirmed) {
				err = nil
			}
		}
		d.Preview = out.String()
		if err != nil {
			d.PreviewErr = err.Error()
		}
	}
	s.render(w, http.StatusOK, "confirm", d)
}

type resultData struct {
	actionPage
	Output string
	Err    string
}

// act runs a confirmed action. A refusal answers 403 (no authority) or
// 409 (the action's own refusal).
func (s *Server) act(w http.ResponseWriter, r *http.Request, ap actionPage) {
	d := resultData{actionPage: ap}
	a, proj, ver, sel := ap.Action, ap.Projection, ap.Version, ap.Selection
	who, err := s.authorize(r)
	if err != nil {
		s.log.Warn("console action refused", "action", a.Name, "projection", proj, "version", ver,
			"remote_addr", r.RemoteAddr, "err", err)
		d.Err = err.Error()
		s.render(w, http.StatusForbidden, "result", d)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.ActionTimeout)
	defer cancel()
	by := "pgscribe console: " + who
	var out bytes.Buffer
	f := ap.filter()
	switch a.Name {
	case "pause":
		err = admin.Pause(ctx, s.cfg, admin.ControlOptions{Projection: proj, Version: ver, Reason: r.PostFormValue("reason"), By: by}, &out)
	case "resume":
		err = admin.Resume(ctx, s.cfg, admin.ControlOptions{Projection: proj, Version: ver}, &out)
	case "retry", "skip":
		err = admin.RetryDeadLetters(ctx, s.cfg, admin.RetryOptions{Filter: f, Skip: a.Name == "skip", Programs: s.progs, By: by}, &out)
	case "discard":
		err = admin.DiscardDeadLetters(ctx, s.cfg, admin.DiscardOptions{Filter: f, Yes: true}, &out)
	case "promote":
		err = admin.Promote(ctx, s.cfg, admin.PromoteOptions{Projection: proj, Version: ver}, &out)
	case "retire":
		err = admin.Retire(ctx, s.cfg, admin.RetireOptions{Projection: proj, Version: ver}, &out)
	}
	attrs := []any{"action", a.Name, "projection", proj, "version", ver, "who", who, "remote_addr", r.RemoteAddr}
	if a.DeadLetters {
		attrs = append(attrs, "selection", sel.Describe())
	}
	d.Output = out.String()
	status := http.StatusOK
	if err != nil {
		d.Err = err.Error()
		status = http.StatusInternalServerError
		if errors.Is(err, admin.ErrRefused) || errors.Is(err, admin.ErrWrongCommand) {
			status = http.StatusConflict
		}
		s.log.Warn("console action failed", append(attrs, "err", err)...)
	} else {
		s.log.Info("console action", append(attrs, "output", strings.TrimSpace(d.Output))...)
	}
	// The next page view shows the action's effect, counts included.
	s.sampler.refresh()
	s.render(w, status, "result", d)
}
