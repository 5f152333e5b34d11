package pgtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"
)

// Proxy is a TCP proxy between clients and a server, for fault tests: Cut
// breaks the network like a pulled cable that the peers notice (the
// connections close), Blackhole like one they do not (bytes stop flowing,
// the connections stay open), and Restore mends it. Its methods are safe for
// concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	state  proxyState
	resume chan struct{} // closed when a blackhole ends
	conns  map[*proxyConn]struct{}
}

type proxyState int

const (
	proxyOpen proxyState = iota
	proxyCut
	proxyBlackhole
	proxyClosed
)

// proxyConn is one client connection and, once dialled, its server side.
type proxyConn struct {
	client, server net.Conn
}

func (c *proxyConn) close() {
	c.client.Close()
	if c.server != nil {
		c.server.Close()
	}
}

// NewProxy starts a proxy to target (host:port) listening on a free port of
// 127.0.0.1. The caller must Close it.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgtest: proxy listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DSN returns dsn (a postgres:// URL) with its host and port replaced by the
// proxy's, so that a client connects through the proxy.
func (p *Proxy) DSN(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("pgtest: proxy dsn: want a postgres:// URL with a host")
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// Cut closes every live connection and, until Restore, closes new ones as
// soon as they are accepted: clients see their connections fail at once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == proxyClosed {
		return
	}
	p.setState(proxyCut)
	p.closeConns()
}

// Blackhole stops every byte in both directions without closing anything:
// live connections hang, new ones are accepted but not forwarded. Clients
// notice only through their own timeouts. Restore delivers what was held
// back, as TCP would after a partition heals.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == proxyClosed || p.state == proxyBlackhole {
		return
	}
	p.setState(proxyBlackhole)
}

// Restore ends a Cut or a Blackhole: new connections go through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != proxyClosed {
		p.setState(proxyOpen)
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.state == proxyClosed {
		p.mu.Unlock()
		return nil
	}
	p.setState(proxyClosed)
	err := p.ln.Close()
	p.closeConns()
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// setState moves to a new state, waking the goroutines held by a
// blackhole. p.mu must be held.
func (p *Proxy) setState(s proxyState) {
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
	if s == proxyBlackhole {
		p.resume = make(chan struct{})
	}
	p.state = s
}

// closeConns closes every connection. p.mu must be held.
func (p *Proxy) closeConns() {
	for c := range p.conns {
		c.close()
		delete(p.conns, c)
	}
}

// gate blocks while the proxy is a blackhole and reports whether traffic
// may flow (false when cut or closed).
func (p *Proxy) gate() bool {
	for {
		p.mu.Lock()
		state, resume := p.state, p.resume
		p.mu.Unlock()
		switch state {
		case proxyOpen:
			return true
		case proxyBlackhole:
			<-resume
		default:
			return false
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors, say: do not spin
			continue
		}
		c := &proxyConn{client: client}
		p.mu.Lock()
		if p.state == proxyCut || p.state == proxyClosed {
			p.mu.Unlock()
			client.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

func (p *Proxy) serve(c *proxyConn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.close()
	}()
	if !p.gate() {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if _, live := p.conns[c]; !live {
		// Cut or closed while dialling.
		p.mu.Unlock()
		server.Close()
		return
	}
	c.server = server
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	go func() { p.pipe(c.server, c.client); done <- struct{}{} }()
	go func() { p.pipe(c.client, c.server); done <- struct{}{} }()
	<-done
	// One side ended: end the other, as PostgreSQL has no use for a
	// half-closed connection.
	c.close()
	<-done
}

// pipe copies src to dst, holding each chunk back while the proxy is a
// blackhole.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
