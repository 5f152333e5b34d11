package lag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Health reports the process's health: healthy is false when a projection
// is halted or the process is wedged; ready is true when every projection
// is live and caught up or a healthy standby. Detail is served as JSON.
type Health func() (healthy, ready bool, detail any)

// Server serves /metrics, /healthz and /readyz, and a console at / when
// Listen is given one.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr (the default configuration binds loopback only).
// console, when not nil, serves every other path (the web console).
func Listen(addr string, g prometheus.Gatherer, health Health, console http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	probe := func(pick func(h, r bool) bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			h, r, d := health()
			w.Header().Set("Content-Type", "application/json")
			if !pick(h, r) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(d)
		}
	}
	mux.Handle("/healthz", probe(func(h, _ bool) bool { return h }))
	mux.Handle("/readyz", probe(func(_, r bool) bool { return r }))
	if console != nil {
		mux.Handle("/", console)
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close shuts the server down.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
