package pgtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type localBackend struct {
	binDir  string
	baseDir string // temporary directory holding everything below
	dataDir string
	logFile string
	cred    *syscall.Credential // unprivileged user to run as; nil unless root
	dsn     string
	logf    func(string, ...any)
}

// startLocal creates a cluster in a temporary directory with this machine's
// binaries and starts it on a free port of 127.0.0.1.
func startLocal(ctx context.Context, settings map[string]string, logf func(string, ...any)) (s *Server, err error) {
	start := time.Now()
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := runAsCredential(ctx, logf)
	if err != nil {
		return nil, err
	}
	root := tempRoot(cred != nil)
	reapClusters(ctx, root, binDir, cred, logf)

	base, err := os.MkdirTemp(root, "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	b := &localBackend{
		binDir:  binDir,
		baseDir: base,
		dataDir: filepath.Join(base, "data"),
		logFile: filepath.Join(base, "postgres.log"),
		cred:    cred,
		logf:    logf,
	}
	defer func() {
		if err != nil {
			b.tailLog()
			_ = b.stop(context.WithoutCancel(ctx))
		}
	}()
	sockDir := filepath.Join(base, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(base, "owner"), []byte(owner()+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		for _, p := range []string{base, sockDir} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("pgtest: %w", err)
			}
		}
	}
	// --no-sync and fsync=off: a test cluster is thrown away after the run.
	if err := b.run(ctx, "initdb", "-D", b.dataDir, "-U", "postgres", "--auth=trust",
		"--locale=C", "-E", "UTF8", "--no-sync"); err != nil {
		return nil, err
	}

	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = " + quoteConf(sockDir),
	}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		conf = append(conf, k+" = "+quoteConf(settings[k]))
	}
	if err := b.appendConf(conf...); err != nil {
		return nil, err
	}

	var port int
	for attempt := 1; ; attempt++ {
		port, err = freePort()
		if err != nil {
			return nil, fmt.Errorf("pgtest: pick a port: %w", err)
		}
		// Later lines win: a retry appends another port. The log is
		// emptied so that a bind failure is read from this attempt only.
		_ = os.Truncate(b.logFile, 0)
		if err := b.appendConf("port = " + strconv.Itoa(port)); err != nil {
			return nil, err
		}
		err = b.run(ctx, "pg_ctl", "-D", b.dataDir, "-l", b.logFile, "-w", "-t", "120", "start")
		if err != nil {
			log, _ := os.ReadFile(b.logFile)
			if attempt < 3 && strings.Contains(string(log), "could not bind") {
				logf("port %d was taken; trying another", port)
				continue
			}
			return nil, err
		}
		b.dsn = serverURL("127.0.0.1", port, "").String()
		break
	}
	if err := waitReady(ctx, b.dsn, nil); err != nil {
		return nil, fmt.Errorf("pgtest: wait for local server: %w", err)
	}
	s, err = newServer(ModeLocal, serverURL("127.0.0.1", port, ""), logf, b)
	if err != nil {
		return nil, err
	}
	logf("local server (%s) ready on %s in %s, data in %s", binDir, s.hostPort, time.Since(start).Round(time.Millisecond), b.dataDir)
	return s, nil
}

func (b *localBackend) restart(ctx context.Context, immediate bool) error {
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	// -l again: without it the new postmaster would write to pg_ctl's
	// output, which is our pipe, and running pg_ctl would never return.
	if err := b.run(ctx, "pg_ctl", "-D", b.dataDir, "-l", b.logFile, "-m", mode, "-w", "-t", "120", "restart"); err != nil {
		b.tailLog()
		return err
	}
	return waitReady(ctx, b.dsn, nil)
}

func (b *localBackend) stop(ctx context.Context) error {
	var err error
	if _, statErr := os.Stat(filepath.Join(b.dataDir, "postmaster.pid")); statErr == nil {
		err = b.run(ctx, "pg_ctl", "-D", b.dataDir, "-m", "fast", "-w", "-t", "60", "stop")
		if err != nil {
			b.logf("fast stop failed (%v); stopping immediately", err)
			err = b.run(ctx, "pg_ctl", "-D", b.dataDir, "-m", "immediate", "-w", "-t", "60", "stop")
		}
	}
	if err != nil {
		// Keep the directory: the server may still be running from it.
		return fmt.Errorf("pgtest: stop local server in %s: %w", b.baseDir, err)
	}
	if err := os.RemoveAll(b.baseDir); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	b.logf("stopped local server, removed %s", b.baseDir)
	return nil
}

// run runs one of the PostgreSQL binaries, as the unprivileged user when
// this process is root, with a minimal environment (no PG* variables of the
// caller leak into the cluster).
func (b *localBackend) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(b.binDir, name), args...)
	cmd.Dir = b.baseDir
	cmd.Env = []string{
		"PATH=" + b.binDir + ":/usr/local/bin:/usr/bin:/bin",
		"HOME=" + b.baseDir,
		"LC_ALL=C",
		"LANG=C",
	}
	if b.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	}
	// pg_ctl leaves the postmaster running with its output in the log
	// file; WaitDelay guards against a child that keeps our pipe anyway.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: %s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (b *localBackend) appendConf(lines ...string) error {
	f, err := os.OpenFile(filepath.Join(b.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	_, err = f.WriteString("\n# pgtest\n" + strings.Join(lines, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// tailLog passes the end of the server log to logf.
func (b *localBackend) tailLog() {
	data, err := os.ReadFile(b.logFile)
	if err != nil || len(data) == 0 {
		return
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	lines = lines[max(0, len(lines)-40):]
	b.logf("last lines of %s:\n%s", b.logFile, strings.Join(lines, "\n"))
}

// quoteConf quotes a value for postgresql.conf.
func quoteConf(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// findBinDir returns the directory of initdb, pg_ctl and postgres:
// $PGSCRIBE_PG_BIN, else the newest /usr/lib/postgresql/*/bin (Debian's
// layout), else the directory of pg_ctl on $PATH.
func findBinDir() (string, error) {
	complete := func(dir string) bool {
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if !complete(dir) {
			return "", fmt.Errorf("pgtest: %s=%s lacks initdb, pg_ctl or postgres", EnvBinDir, dir)
		}
		return dir, nil
	}
	best, bestVersion := "", -1.0
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, dir := range matches {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		if err == nil && v > bestVersion && complete(dir) {
			best, bestVersion = dir, v
		}
	}
	if best != "" {
		return best, nil
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if dir := filepath.Dir(p); complete(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: no PostgreSQL binaries found (set %s, or install postgresql-15)", EnvBinDir)
}

// runAsCredential returns the user to run PostgreSQL as when this process
// is root, which initdb and postgres refuse to run as: the postgres user,
// created if it does not exist.
func runAsCredential(ctx context.Context, logf func(string, ...any)) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		logf("running as root: creating system user postgres")
		out, cerr := exec.CommandContext(ctx, "useradd", "--system", "--user-group",
			"--home-dir", "/var/lib/postgresql", "--no-create-home",
			"--shell", "/usr/sbin/nologin", "postgres").CombinedOutput()
		if cerr != nil {
			return nil, fmt.Errorf("pgtest: running as root and no postgres user: useradd: %w: %s", cerr, out)
		}
		u, err = user.Lookup("postgres")
	}
	if err != nil {
		return nil, fmt.Errorf("pgtest: look up user postgres: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// tempRoot returns where to create the cluster directory: the usual
// temporary directory, unless an unprivileged user must reach it and
// cannot (TMPDIR under /root, say), then /tmp.
func tempRoot(dropPrivileges bool) string {
	dir := os.TempDir()
	if !dropPrivileges {
		return dir
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if p == filepath.Dir(p) {
			return dir
		}
	}
}

// reapClusters stops and removes the clusters under root whose owner
// process is gone.
func reapClusters(ctx context.Context, root, binDir string, cred *syscall.Credential, logf func(string, ...any)) {
	owners, _ := filepath.Glob(filepath.Join(root, "pgtest-*", "owner"))
	for _, f := range owners {
		rec, err := os.ReadFile(f)
		if err != nil || !ownerGone(string(rec)) {
			continue
		}
		base := filepath.Dir(f)
		b := &localBackend{binDir: binDir, baseDir: base, dataDir: filepath.Join(base, "data"), cred: cred, logf: func(string, ...any) {}}
		if _, err := os.Stat(filepath.Join(b.dataDir, "postmaster.pid")); err == nil {
			_ = b.run(ctx, "pg_ctl", "-D", b.dataDir, "-m", "immediate", "-w", "-t", "30", "stop")
		}
		if err := os.RemoveAll(base); err == nil {
			logf("removed leftover cluster %s of a dead test process", base)
		}
	}
}
