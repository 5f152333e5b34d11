package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/lag"
	"github.com/pgscribe/pgscribe/rules"
)

// Compile compiles every projection's rules; the error joins every
// compile error of every projection.
func Compile(cfg *config.Config) ([]*rules.Program, error) {
	progs := make([]*rules.Program, 0, len(cfg.Projections))
	var errs []error
	for i, spec := range cfg.Projections {
		prog, err := rules.Compile(spec)
		if err != nil {
			errs = append(errs, locate(cfg, i, spec, err))
			continue
		}
		progs = append(progs, prog)
	}
	return progs, errors.Join(errs...)
}

// locate prefixes each rules.CompileError in err with the file and line
// of the field it names, as configuration errors are.
func locate(cfg *config.Config, projection int, spec rules.Spec, err error) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for k, e := range errs {
		var ce *rules.CompileError
		if !errors.As(e, &ce) {
			continue
		}
		rule := -1
		for j, rs := range spec.Rules {
			if rules.RuleName(j, rs) == ce.Rule {
				rule = j
				break
			}
		}
		if rule < 0 {
			continue
		}
		if line := cfg.RuleLine(projection, rule, ce.Field); line > 0 {
			errs[k] = fmt.Errorf("%s:%d: %w", cfg.Path, line, e)
		}
	}
	return errors.Join(errs...)
}

// RunOptions configures RunAll.
type RunOptions struct {
	Version string
	Logger  *slog.Logger
	// Hard is cancelled on a hard stop; until then a graceful stop (ctx)
	// lets in-flight batches finish.
	Hard context.Context
	// Registry receives the metrics; nil creates one.
	Registry *prometheus.Registry
	// Ready, if set, receives the metrics listener's address once bound.
	Ready func(addr string)
	// Programs are cfg's compiled rules, in cfg.Projections order (from
	// Compile); nil compiles them.
	Programs []*rules.Program
	// Console, when not nil, is served at / on the metrics listener (the
	// web console: package console, which the caller builds because it
	// imports this package).
	Console http.Handler
}

// RunAll runs every configured projection until ctx ends. Projections are
// independent: one halting does not stop the others. It returns when all
// have stopped.
func RunAll(ctx context.Context, cfg *config.Config, o RunOptions) error {
	progs := o.Programs
	if progs == nil {
		var err error
		if progs, err = Compile(cfg); err != nil {
			return err
		}
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := lag.NewMetrics(reg, o.Version)
	hard := o.Hard
	if hard == nil {
		hard = context.Background()
	}
	var sem chan struct{}
	if n := cfg.Engine.MaxActiveProjections; n > 0 {
		sem = make(chan struct{}, n)
	}
	projs := make([]*Projection, len(progs))
	for i, prog := range progs {
		projs[i] = New(cfg, cfg.Projections[i], prog, m, o.Logger, hard)
	}
	if cfg.Metrics.Enabled() {
		srv, err := lag.Listen(cfg.Metrics.Listen, reg, func() (bool, bool, any) { return health(projs) }, o.Console)
		if err != nil {
			return err
		}
		o.Logger.Info("metrics listening", "addr", srv.Addr())
		if o.Ready != nil {
			o.Ready(srv.Addr())
		}
		defer srv.Close(context.WithoutCancel(ctx))
	}
	urls := []string{cfg.Database.URL}
	if cfg.TargetURL() != cfg.Database.URL {
		urls = append(urls, cfg.TargetURL())
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		m.SampleOldestTransaction(sampleCtx, urls, cfg.Engine.LagInterval, o.Logger)
	}()
	defer func() { stopSampling(); <-sampled }()
	var wg sync.WaitGroup
	errs := make([]error, len(projs))
	// Every version runs as a member of its group: a version alone is a
	// group of one, streaming its own slot through the same hub (one source
	// path, so that no mode can lose what another keeps).
	for name, idx := range cfg.Groups() {
		g := &group{name: name, cfg: cfg, log: o.Logger.With("group", name)}
		for _, i := range idx {
			g.members = append(g.members, projs[i])
		}
		if len(idx) == 1 {
			projs[idx[0]].slots = sem // no group lock: the member's own takes it
		} else {
			g.slots = sem // the group takes one for all
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.run(ctx); err != nil {
				errs[idx[0]] = fmt.Errorf("group %s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	o.Logger.Info("all projections stopped")
	return errors.Join(errs...)
}

type projectionHealth struct {
	Projection string `json:"projection"`
	Version    int64  `json:"version"`
	State      State  `json:"state"`
	Ready      bool   `json:"ready"`
	Error      string `json:"error,omitempty"`
}

func health(projs []*Projection) (healthy, ready bool, detail any) {
	healthy, ready = true, true
	out := make([]projectionHealth, 0, len(projs))
	for _, p := range projs {
		h := projectionHealth{Projection: p.spec.Name, Version: p.spec.Version, State: p.State(), Ready: p.Ready()}
		if h.State == StateHalted {
			healthy = false
			if e := p.haltError(); e != nil {
				h.Error = e.Error()
			}
		}
		ready = ready && h.Ready
		out = append(out, h)
	}
	return healthy, ready, out
}
