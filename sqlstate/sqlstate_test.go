package sqlstate

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgErr(code string) error { return &pgconn.PgError{Code: code, Message: "test"} }

// fakeNetErr is a net.Error that is not one of the standard library's.
type fakeNetErr struct{ timeout bool }

func (e fakeNetErr) Error() string   { return "fake net error" }
func (e fakeNetErr) Timeout() bool   { return e.timeout }
func (e fakeNetErr) Temporary() bool { return false }

// retryable reports SafeToRetry like pgconn's internal errors do.
type retryable struct{ safe bool }

func (e retryable) Error() string     { return "retryable" }
func (e retryable) SafeToRetry() bool { return e.safe }

func TestClassify(t *testing.T) {
	codes := []struct {
		code string
		want Class
	}{
		// transient
		{"08000", ClassTransient}, {"08001", ClassTransient}, {"08003", ClassTransient},
		{"08004", ClassTransient}, {"08006", ClassTransient}, {"08007", ClassTransient},
		{"08P01", ClassTransient},
		{"40000", ClassTransient}, {"40001", ClassTransient}, {"40003", ClassTransient},
		{"40P01", ClassTransient},
		{"53000", ClassTransient}, {"53100", ClassTransient}, {"53200", ClassTransient},
		{"53300", ClassTransient}, {"53400", ClassTransient},
		{"55P03", ClassTransient}, {"57014", ClassTransient},
		{"57P01", ClassTransient}, {"57P02", ClassTransient}, {"57P03", ClassTransient},
		{"57P04", ClassTransient}, {"57P05", ClassTransient},
		{"25P03", ClassTransient},
		// integrity
		{"23000", ClassIntegrity}, {"23001", ClassIntegrity}, {"23502", ClassIntegrity},
		{"23503", ClassIntegrity}, {"23505", ClassIntegrity}, {"23514", ClassIntegrity},
		{"23P01", ClassIntegrity},
		{"22000", ClassIntegrity}, {"22001", ClassIntegrity}, {"22003", ClassIntegrity},
		{"22007", ClassIntegrity}, {"22008", ClassIntegrity}, {"22012", ClassIntegrity},
		{"22021", ClassIntegrity}, {"22P02", ClassIntegrity}, {"22P05", ClassIntegrity},
		{"40002", ClassIntegrity},
		// structural
		{"42000", ClassStructural}, {"42501", ClassStructural}, {"42601", ClassStructural},
		{"42703", ClassStructural}, {"42883", ClassStructural}, {"42P01", ClassStructural},
		{"42P07", ClassStructural}, {"3F000", ClassStructural}, {"3D000", ClassStructural},
		{"28P01", ClassStructural}, {"25000", ClassStructural}, {"25006", ClassStructural},
		{"25P02", ClassStructural}, {"55000", ClassStructural}, {"55006", ClassStructural},
		{"57000", ClassStructural}, {"0A000", ClassStructural}, {"P0001", ClassStructural},
		{"58030", ClassStructural}, {"XX000", ClassStructural}, {"XX001", ClassStructural},
		{"XX002", ClassStructural}, {"ZZ999", ClassStructural},
	}
	type tc struct {
		name string
		err  error
		want Class
	}
	var tests []tc
	for _, c := range codes {
		tests = append(tests,
			tc{c.code, pgErr(c.code), c.want},
			tc{c.code + " wrapped", fmt.Errorf("commit: %w", fmt.Errorf("rule r: %w", pgErr(c.code))), c.want})
	}
	tests = append(tests, []tc{
		{"nil", nil, ClassNone},
		{"io.EOF", io.EOF, ClassTransient},
		{"io.ErrUnexpectedEOF wrapped", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), ClassTransient},
		{"driver closed the connection", fmt.Errorf("begin: %w", pgconn.ErrConnClosed), ClassTransient},
		{"closed network connection", fmt.Errorf("write: %w", net.ErrClosed), ClassTransient},
		{"ECONNRESET in net.OpError", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, ClassTransient},
		{"ECONNRESET bare wrapped", fmt.Errorf("x: %w", syscall.ECONNRESET), ClassTransient},
		{"ECONNREFUSED", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), ClassTransient},
		{"ECONNABORTED", fmt.Errorf("x: %w", syscall.ECONNABORTED), ClassTransient},
		{"EPIPE", fmt.Errorf("write: %w", os.NewSyscallError("write", syscall.EPIPE)), ClassTransient},
		{"ETIMEDOUT", fmt.Errorf("x: %w", syscall.ETIMEDOUT), ClassTransient},
		{"net.Error", fakeNetErr{}, ClassTransient},
		{"net.Error timeout wrapped", fmt.Errorf("x: %w", fakeNetErr{timeout: true}), ClassTransient},
		{"safe to retry", fmt.Errorf("x: %w", retryable{safe: true}), ClassTransient},
		{"not safe to retry, nothing else", retryable{safe: false}, ClassStructural},
		{"context.Canceled", context.Canceled, ClassTransient},
		{"context.DeadlineExceeded wrapped", fmt.Errorf("batch: %w", context.DeadlineExceeded), ClassTransient},
		{"ConnectError", connectError(t), ClassTransient},
		{"PgError beats connection wrapping", fmt.Errorf("connect: %w: %w", pgErr("28P01"), io.EOF), ClassStructural},
		{"integrity in errors.Join", errors.Join(errors.New("x"), pgErr("23505")), ClassIntegrity},
		{"plain error", errors.New("boom"), ClassStructural},
		{"pgx.ErrTxClosed", pgx.ErrTxClosed, ClassStructural},
		{"pgx.ErrNoRows", fmt.Errorf("x: %w", pgx.ErrNoRows), ClassStructural},
	}...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err); got != tt.want {
				t.Errorf("Classify(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// connectError returns a real *pgconn.ConnectError: a refused connection to
// a port nothing listens on.
func connectError(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pgconn.Connect(ctx, "postgres://x@127.0.0.1:"+strconv.Itoa(addr.Port)+"/x?sslmode=disable")
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("connect to a closed port: got %v, want a *pgconn.ConnectError", err)
	}
	return err
}

func TestClassifyClassString(t *testing.T) {
	names := map[Class]string{
		ClassNone:       "none",
		ClassTransient:  "transient",
		ClassIntegrity:  "integrity",
		ClassStructural: "structural",
		Class(42):       "unknown", // out of range
	}
	for c, want := range names {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}

func TestClassifySQLStateDescribe(t *testing.T) {
	tests := map[string]struct {
		err                 error
		wantState, wantDesc string
	}{
		"nil":              {nil, "", ""},
		"plain":            {errors.New("boom"), "", ""},
		"unique":           {pgErr("23505"), "23505", "23505 (unique_violation)"},
		"wrapped not null": {fmt.Errorf("a: %w", fmt.Errorf("b: %w", pgErr("23502"))), "23502", "23502 (not_null_violation)"},
		"bad text":         {pgErr("22P02"), "22P02", "22P02 (invalid_text_representation)"},
		"encoding":         {pgErr("22021"), "22021", "22021 (character_not_in_repertoire)"},
		"undefined table":  {pgErr("42P01"), "42P01", "42P01 (undefined_table)"},
		"privilege":        {pgErr("42501"), "42501", "42501 (insufficient_privilege)"},
		"schema":           {pgErr("3F000"), "3F000", "3F000 (invalid_schema_name)"},
		"serialization":    {pgErr("40001"), "40001", "40001 (serialization_failure)"},
		"idle session":     {pgErr("57P05"), "57P05", "57P05 (idle_session_timeout)"},
		"internal":         {pgErr("XX000"), "XX000", "XX000 (internal_error)"},
		"unknown code":     {pgErr("ZZ999"), "ZZ999", "ZZ999"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Code(tt.err); got != tt.wantState {
				t.Errorf("Code() = %q, want %q", got, tt.wantState)
			}
			if got := Describe(tt.err); got != tt.wantDesc {
				t.Errorf("Describe() = %q, want %q", got, tt.wantDesc)
			}
		})
	}
}

// TestClassifyConditionNamesComplete checks that conditionNames names every
// code pgerrcode defines, by reading pgerrcode's source: a pgerrcode upgrade
// that adds codes fails here until the table is regenerated.
func TestClassifyConditionNamesComplete(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH")
	}
	out, err := exec.Command(goBin, "list", "-m", "-f", "{{.Dir}}", "github.com/jackc/pgerrcode").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Skipf("locate pgerrcode source: %v", err)
	}
	file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(strings.TrimSpace(string(out)), "errcode.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	ast.Inspect(file, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, v := range spec.Values {
			lit, ok := v.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				continue
			}
			code, err := strconv.Unquote(lit.Value)
			if err != nil || len(code) != 5 {
				continue
			}
			seen++
			if _, ok := conditionNames[code]; !ok {
				t.Errorf("conditionNames lacks %s (pgerrcode.%s)", code, spec.Names[i].Name)
			}
		}
		return true
	})
	if seen < 200 {
		t.Fatalf("found only %d codes in pgerrcode's source; parser out of date?", seen)
	}
	for _, class := range []string{"08", "22", "23", "25", "3F", "40", "42", "53", "55", "57", "XX"} {
		if _, ok := conditionNames[class+"000"]; !ok {
			t.Errorf("conditionNames lacks class %s", class)
		}
	}
}

// The settings a 53300 or 53400 names, read from the server's message;
// other errors name none.
func TestResourceSetting(t *testing.T) {
	for _, tt := range []struct {
		code, msg, want string
	}{
		{"53300", "sorry, too many clients already", "max_connections"},
		{"53300", "remaining connection slots are reserved for non-replication superuser connections", "max_connections"},
		{"53300", "number of requested standby connections exceeds max_wal_senders (currently 10)", "max_wal_senders"},
		{"53400", "all replication slots are in use", "max_replication_slots"},
		{"53400", "too many background workers", ""},
		{"42P01", "relation does not exist", ""},
	} {
		err := fmt.Errorf("connect: %w", &pgconn.PgError{Code: tt.code, Message: tt.msg})
		if got := ResourceSetting(err); got != tt.want {
			t.Errorf("ResourceSetting(%s %q) = %q, want %q", tt.code, tt.msg, got, tt.want)
		}
	}
	if got := ResourceSetting(errors.New("plain")); got != "" {
		t.Errorf("a plain error names %q", got)
	}
}
