package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// errImageUnavailable marks a start that failed only because the default
// image is neither present nor pullable; Start then falls back to local
// binaries.
var errImageUnavailable = errors.New("docker image unavailable")

// dockerPool returns a client of the Docker engine of DOCKER_HOST (or the
// default socket) if the engine answers.
func dockerPool(ctx context.Context) (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Client.PingWithContext(pctx); err != nil {
		return nil, err
	}
	return pool, nil
}

// startDocker is Start with the docker mode forced.
func startDocker(ctx context.Context, settings map[string]string, logf func(string, ...any)) (*Server, error) {
	pool, err := dockerPool(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgtest: docker mode: %w", err)
	}
	return startDockerWith(ctx, pool, settings, logf)
}

type dockerBackend struct {
	pool *dockertest.Pool
	id   string
	name string
	dsn  string
	logf func(string, ...any)
}

func startDockerWith(ctx context.Context, pool *dockertest.Pool, settings map[string]string, logf func(string, ...any)) (*Server, error) {
	image := os.Getenv(EnvImage)
	explicit := image != ""
	if !explicit {
		image = DefaultImage
	}
	if err := ensureImage(ctx, pool, image, logf); err != nil {
		if explicit {
			// The caller asked for this image: a fallback would test
			// something else than asked.
			return nil, fmt.Errorf("pgtest: %s=%s: %w", EnvImage, image, err)
		}
		return nil, err
	}
	reapContainers(ctx, pool, logf)

	host, bindIP := dockerHost(pool)
	password := randomHex(16)
	repo, tag := splitImage(image)
	start := time.Now()
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgtest: pick a port: %w", err)
		}
		name := fmt.Sprintf("pgtest-%d-%s", os.Getpid(), randomHex(4))
		res, err := pool.RunWithOptions(&dockertest.RunOptions{
			Name:       name,
			Repository: repo,
			Tag:        tag,
			Env: []string{
				"POSTGRES_PASSWORD=" + password,
				"POSTGRES_USER=postgres",
				"POSTGRES_DB=postgres",
				"POSTGRES_INITDB_ARGS=--no-sync",
			},
			Cmd:          append([]string{"postgres"}, settingArgs(settings)...),
			ExposedPorts: []string{"5432/tcp"},
			PortBindings: map[docker.Port][]docker.PortBinding{
				"5432/tcp": {{HostIP: bindIP, HostPort: strconv.Itoa(port)}},
			},
			Labels: map[string]string{ownerLabel: owner()},
		}, func(hc *docker.HostConfig) {
			hc.PublishAllPorts = false
			// Not auto-removed: an immediate restart stops the
			// container, and Restart starts that same container again.
			hc.AutoRemove = false
			hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
			hc.ShmSize = 256 << 20
		})
		if err != nil {
			// If only the start failed, the container exists.
			_ = pool.RemoveContainerByName(name)
			if attempt < 3 && strings.Contains(err.Error(), "address already in use") {
				logf("port %d was taken; trying another", port)
				continue
			}
			return nil, fmt.Errorf("pgtest: run %s: %w", image, err)
		}
		b := &dockerBackend{
			pool: pool,
			id:   res.Container.ID,
			name: name,
			dsn:  serverURL(host, port, password).String(),
			logf: logf,
		}
		s, err := newServer(ModeDocker, serverURL(host, port, password), logf, b)
		if err == nil {
			err = waitReady(ctx, b.dsn, b.alive)
		}
		if err != nil {
			b.logTail(ctx)
			_ = b.stop(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("pgtest: wait for container %s: %w", name, err)
		}
		logf("docker server %s (%s) ready on %s in %s", name, image, s.hostPort, time.Since(start).Round(time.Millisecond))
		return s, nil
	}
}

// ensureImage makes sure image is present, pulling it if it is not.
func ensureImage(ctx context.Context, pool *dockertest.Pool, image string, logf func(string, ...any)) error {
	if _, err := pool.Client.InspectImage(image); err == nil {
		return nil
	}
	logf("pulling %s", image)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	repo, tag := splitImage(image)
	err := pool.Client.PullImage(docker.PullImageOptions{
		Repository:        repo,
		Tag:               tag,
		Context:           pctx,
		InactivityTimeout: time.Minute,
		OutputStream:      io.Discard,
	}, docker.AuthConfiguration{})
	if err != nil {
		return fmt.Errorf("%w: %s is not present and cannot be pulled: %v", errImageUnavailable, image, err)
	}
	return nil
}

// splitImage splits "repo[:tag]" at the tag's colon, which is the last
// colon after the last slash (a registry host may carry a port).
func splitImage(image string) (repo, tag string) {
	slash := strings.LastIndex(image, "/")
	if i := strings.LastIndex(image, ":"); i > slash {
		return image[:i], image[i+1:]
	}
	return image, "latest"
}

// dockerHost returns the host the published port is reached on and the
// address to bind it to: loopback for a local engine, the engine's host on
// all its interfaces for a remote one (DOCKER_HOST=tcp://...).
func dockerHost(pool *dockertest.Pool) (host, bindIP string) {
	u, err := url.Parse(pool.Client.Endpoint())
	if err == nil && (u.Scheme == "tcp" || u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != "" {
		return u.Hostname(), ""
	}
	return "127.0.0.1", "127.0.0.1"
}

// alive reports an error when the container is no longer running, so that
// a wait for readiness stops early with the container's log.
func (b *dockerBackend) alive(ctx context.Context) error {
	c, err := b.pool.Client.InspectContainerWithContext(b.id, ctx)
	if err != nil {
		return err
	}
	if !c.State.Running {
		return fmt.Errorf("container %s exited with code %d", b.name, c.State.ExitCode)
	}
	return nil
}

// logTail passes the end of the container's log to logf.
func (b *dockerBackend) logTail(ctx context.Context) {
	var out bytes.Buffer
	err := b.pool.Client.Logs(docker.LogsOptions{
		Context:      context.WithoutCancel(ctx),
		Container:    b.id,
		OutputStream: &out,
		ErrorStream:  &out,
		Stdout:       true,
		Stderr:       true,
		Tail:         "40",
	})
	if err == nil {
		b.logf("last lines of container %s:\n%s", b.name, out.String())
	}
}

func (b *dockerBackend) restart(ctx context.Context, immediate bool) error {
	// SIGQUIT is PostgreSQL's immediate shutdown: the postmaster kills its
	// children without a checkpoint, like a crash. SIGINT is a fast
	// shutdown. The postmaster is the container's PID 1 (the entrypoint
	// execs it), so the container stops when it exits.
	sig := docker.SIGINT
	if immediate {
		sig = docker.SIGQUIT
	}
	if err := b.pool.Client.KillContainer(docker.KillContainerOptions{ID: b.id, Signal: sig, Context: ctx}); err != nil {
		return fmt.Errorf("signal container %s: %w", b.name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err := b.pool.Client.WaitContainerWithContext(b.id, wctx)
	cancel()
	if err != nil {
		b.logf("container %s did not stop (%v); killing it", b.name, err)
		if err := b.pool.Client.KillContainer(docker.KillContainerOptions{ID: b.id, Context: ctx}); err != nil {
			return fmt.Errorf("kill container %s: %w", b.name, err)
		}
		if _, err := b.pool.Client.WaitContainerWithContext(b.id, ctx); err != nil {
			return fmt.Errorf("wait for container %s: %w", b.name, err)
		}
	}
	// The port binding is part of the container, so the same host port
	// comes back.
	if err := b.pool.Client.StartContainerWithContext(b.id, nil, ctx); err != nil {
		return fmt.Errorf("start container %s: %w", b.name, err)
	}
	if err := waitReady(ctx, b.dsn, b.alive); err != nil {
		b.logTail(ctx)
		return err
	}
	return nil
}

func (b *dockerBackend) stop(ctx context.Context) error {
	err := b.pool.Client.RemoveContainer(docker.RemoveContainerOptions{
		ID:            b.id,
		Force:         true,
		RemoveVolumes: true,
		Context:       ctx,
	})
	var missing *docker.NoSuchContainer
	if err != nil && !errors.As(err, &missing) {
		return fmt.Errorf("pgtest: remove container %s: %w", b.name, err)
	}
	b.logf("removed container %s", b.name)
	return nil
}

// reapContainers removes the containers of pgtest owners on this host that
// are no longer running.
func reapContainers(ctx context.Context, pool *dockertest.Pool, logf func(string, ...any)) {
	cs, err := pool.Client.ListContainers(docker.ListContainersOptions{
		All:     true,
		Filters: map[string][]string{"label": {ownerLabel}},
		Context: ctx,
	})
	if err != nil {
		return
	}
	for _, c := range cs {
		if !ownerGone(c.Labels[ownerLabel]) {
			continue
		}
		err := pool.Client.RemoveContainer(docker.RemoveContainerOptions{ID: c.ID, Force: true, RemoveVolumes: true, Context: ctx})
		if err == nil {
			logf("removed leftover container %s of a dead test process", strings.Join(c.Names, ","))
		}
	}
}
