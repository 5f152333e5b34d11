package pgtest

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestDatabaseName(t *testing.T) {
	// Test name → the prefix its database name must start with.
	prefixes := map[string]string{
		"TestApply":                        "testapply_",
		"TestApply/crash_mid-batch":        "testapply_crash_mid_batch_", // subtest
		"1/x":                              "t_1_x_",                     // digit first
		"///":                              "t__",                        // nothing usable
		strings.Repeat("TestVeryLong", 10): "testverylong",               // too long
	}
	for testName, prefix := range prefixes {
		t.Run(testName, func(t *testing.T) {
			got := DatabaseName(testName)
			if !strings.HasPrefix(got, prefix) {
				t.Errorf("DatabaseName(%q) = %q, want prefix %q", testName, got, prefix)
			}
			if len(got) > 63 {
				t.Errorf("DatabaseName(%q) = %q is %d bytes", testName, got, len(got))
			}
			if strings.Trim(got, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
				t.Errorf("DatabaseName(%q) = %q has characters that need quoting", testName, got)
			}
			if again := DatabaseName(testName); again == got {
				t.Errorf("DatabaseName(%q) returned %q twice", testName, got)
			}
		})
	}
}

func TestSplitImage(t *testing.T) {
	tests := []struct{ image, repo, tag string }{
		{"postgres:16", "postgres", "16"},
		{"postgres", "postgres", "latest"},
		{"pgscribe-postgres:local", "pgscribe-postgres", "local"},
		{"registry:5000/team/postgres", "registry:5000/team/postgres", "latest"},
		{"registry:5000/team/postgres:15-alpine", "registry:5000/team/postgres", "15-alpine"},
	}
	for _, tt := range tests {
		repo, tag := splitImage(tt.image)
		if repo != tt.repo || tag != tt.tag {
			t.Errorf("splitImage(%q) = %q, %q; want %q, %q", tt.image, repo, tag, tt.repo, tt.tag)
		}
	}
}

func TestMergeSettings(t *testing.T) {
	tests := []struct {
		name    string
		extra   map[string]string
		want    map[string]string
		wantErr bool
	}{
		{name: "defaults", want: map[string]string{"wal_level": "logical", "fsync": "off", "max_wal_senders": "64"}},
		{name: "override", extra: map[string]string{"fsync": "on", "work_mem": "64MB"}, want: map[string]string{"fsync": "on", "work_mem": "64MB", "track_commit_timestamp": "on"}},
		{name: "custom class", extra: map[string]string{"pg_stat_statements.track": "all"}, want: map[string]string{"pg_stat_statements.track": "all"}},
		{name: "injection", extra: map[string]string{"fsync=off -c x": "1"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mergeSettings(tt.extra)
			if (err != nil) != tt.wantErr {
				t.Fatalf("mergeSettings: err = %v, wantErr %t", err, tt.wantErr)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
	args := settingArgs(map[string]string{"b": "2", "a": "1"})
	if strings.Join(args, " ") != "-c a=1 -c b=2" {
		t.Errorf("settingArgs = %q", args)
	}
}

func TestQuoteConf(t *testing.T) {
	if got := quoteConf(`it's`); got != `'it''s'` {
		t.Errorf("quoteConf = %s", got)
	}
}

func TestServerDSN(t *testing.T) {
	s, err := newServer(ModeLocal, serverURL("127.0.0.1", 5433, "p@ss"), func(string, ...any) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.DSN("app_db"), "postgres://postgres:p%40ss@127.0.0.1:5433/app_db?sslmode=disable"; got != want {
		t.Errorf("DSN = %s, want %s", got, want)
	}
	if got, want := s.AdminDSN(), "postgres://postgres:p%40ss@127.0.0.1:5433/postgres?sslmode=disable"; got != want {
		t.Errorf("AdminDSN = %s, want %s", got, want)
	}
	if s.HostPort() != "127.0.0.1:5433" {
		t.Errorf("HostPort = %s", s.HostPort())
	}
}

func TestOwnerGone(t *testing.T) {
	host, _ := os.Hostname()
	tests := []struct {
		name string
		rec  string
		want bool
	}{
		{name: "self", rec: owner(), want: false},
		{name: "parent alive", rec: host + "/" + strconv.Itoa(os.Getppid()), want: false},
		{name: "dead pid", rec: host + "/" + strconv.Itoa(1<<22+7), want: true},
		{name: "other host", rec: "elsewhere.invalid/" + strconv.Itoa(1<<22+7), want: false},
		{name: "garbage", rec: "nonsense", want: false},
	}
	for _, tt := range tests {
		if got := ownerGone(tt.rec); got != tt.want {
			t.Errorf("%s: ownerGone(%q) = %t, want %t", tt.name, tt.rec, got, tt.want)
		}
	}
}

// echoServer accepts connections and echoes what it reads.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes msg and reads it back within timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

func TestProxy(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	c1 := dial()
	if err := roundTrip(c1, "hello", 5*time.Second); err != nil {
		t.Fatalf("through open proxy: %v", err)
	}

	p.Cut()
	if err := roundTrip(c1, "lost", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("live connection after Cut: err = %v, want closed", err)
	}
	if err := roundTrip(dial(), "refused", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection after Cut: err = %v, want closed", err)
	}

	p.Restore()
	c2 := dial()
	if err := roundTrip(c2, "back", 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}

	p.Blackhole()
	if err := roundTrip(c2, "held", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("through blackhole: err = %v, want a timeout", err)
	}
	p.Restore()
	// What the blackhole held back arrives after Restore.
	buf := make([]byte, len("held"))
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c2, buf); err != nil || string(buf) != "held" {
		t.Fatalf("held bytes after Restore: %q, %v", buf, err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still listening after Close")
	}
}

func TestProxyDSN(t *testing.T) {
	p, err := NewProxy("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, err := p.DSN("postgres://u:pw@127.0.0.1:5432/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if want := "postgres://u:pw@" + p.Addr() + "/db?sslmode=disable"; got != want {
		t.Errorf("DSN = %s, want %s", got, want)
	}
	if _, err := p.DSN("host=x port=5"); err == nil {
		t.Error("DSN accepted a keyword/value string")
	}
}
