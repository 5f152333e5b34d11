package console

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/rules"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Options tune the console; the zero value takes every default.
type Options struct {
	// Interval is how often the status is read while a page was viewed in
	// the last minute; default 2s.
	Interval time.Duration
	// Idle is how often it is read otherwise (the sparklines keep going);
	// default 15s.
	Idle time.Duration
	// Sleep is how long after the last page view the console keeps
	// reading at all; then it reads nothing until the next view (which
	// waits for a fresh reading). Default 10m.
	Sleep time.Duration
	// Counts is how often a reading also counts the events, each version's
	// dead letters and its cursors' totals (the backlog), which grow with
	// the tables; the readings between reuse the last counts. Default 30s;
	// the first reading and the one after an action always count.
	Counts time.Duration
	// History is how many samples each version keeps; default 180 (six
	// minutes at 2s).
	History int
	// ActionTimeout bounds one action (a retry waits for its outcome);
	// default 15s.
	ActionTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.Idle <= 0 {
		o.Idle = 15 * time.Second
	}
	if o.Sleep <= 0 {
		o.Sleep = 10 * time.Minute
	}
	if o.Counts <= 0 {
		o.Counts = 30 * time.Second
	}
	if o.History <= 0 {
		o.History = 180
	}
	if o.ActionTimeout <= 0 {
		o.ActionTimeout = 15 * time.Second
	}
	return o
}

// Server is the console: an http.Handler and the sampler that feeds it.
// Run must be running for the pages to show anything but a wait. Safe for
// concurrent use.
type Server struct {
	cfg     *config.Config
	progs   []*rules.Program
	log     *slog.Logger
	opts    Options
	mux     *http.ServeMux
	pages   map[string]*template.Template
	target  *pgxpool.Pool
	source  *pgxpool.Pool // target when both are one database
	sampler *sampler
	csrf    string // per-process secret of the action forms (trusted-header mode)
}

// New builds a console for cfg; progs are cfg's compiled rules in
// cfg.Projections order (for dry runs). It connects lazily: New fails only
// on a malformed database URL.
func New(cfg *config.Config, progs []*rules.Program, log *slog.Logger, o Options) (*Server, error) {
	o = o.withDefaults()
	s := &Server{cfg: cfg, progs: progs, log: log.With("component", "console"), opts: o}
	var err error
	if s.target, err = newPool(cfg.TargetURL()); err != nil {
		return nil, fmt.Errorf("console: target: %w", err)
	}
	s.source = s.target
	if cfg.TargetURL() != cfg.Database.URL {
		if s.source, err = newPool(cfg.Database.URL); err != nil {
			s.target.Close()
			return nil, fmt.Errorf("console: source: %w", err)
		}
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	s.csrf = hex.EncodeToString(b[:])
	s.pages, err = parsePages()
	if err != nil {
		return nil, err
	}
	s.sampler = newSampler(s, o)
	s.routes()
	return s, nil
}

// newPool opens a small lazy pool named pgscribe-console in
// pg_stat_activity.
func newPool(url string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "pgscribe-console"
	pc.MaxConns = 4
	pc.MinConns = 0
	pc.MaxConnIdleTime = time.Minute
	return pgxpool.NewWithConfig(context.Background(), pc)
}

// Run samples the status until ctx ends, then closes the console's
// connections. It returns nil.
func (s *Server) Run(ctx context.Context) error {
	defer func() {
		if s.source != s.target {
			s.source.Close()
		}
		s.target.Close()
	}()
	s.sampler.run(ctx)
	return nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", s.overview)
	m.HandleFunc("GET /api/status", s.statusJSON)
	m.HandleFunc("GET /v/{projection}/{version}", s.versionPage)
	m.HandleFunc("GET /v/{projection}/{version}/{action}", s.onAction(s.confirm))
	m.HandleFunc("POST /v/{projection}/{version}/{action}", s.onAction(s.act))
	s.mux = m
}

// ServeHTTP serves the console's pages with headers that keep them out of
// caches and frames and allow only the console's own scripts and styles.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// ListenAndServe serves s on addr (`pgscribe console`) and runs its
// sampler until ctx ends; ready, if set, receives the bound address.
func ListenAndServe(ctx context.Context, addr string, s *Server, ready func(addr string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("console listener: %w", err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	if ready != nil {
		ready(ln.Addr().String())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Run(ctx)
	}()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	err = srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Loopback reports whether a listen address (host:port) binds loopback
// only; an empty host or a name that is not localhost binds more.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
