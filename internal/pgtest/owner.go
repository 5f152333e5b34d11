package pgtest

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ownerLabel is the container label (and, for local clusters, the content
// of the owner file) naming the process that started a server, as
// "hostname/pid".
const ownerLabel = "org.pgscribe.pgtest.owner"

// owner identifies this process on this host.
func owner() string {
	host, _ := os.Hostname()
	return host + "/" + strconv.Itoa(os.Getpid())
}

// ownerGone reports whether the owner recorded as "hostname/pid" is a
// process of this host that no longer exists. Owners of other hosts (a
// shared Docker engine) and unreadable records are never gone.
func ownerGone(rec string) bool {
	host, pidText, ok := strings.Cut(strings.TrimSpace(rec), "/")
	if !ok {
		return false
	}
	if h, _ := os.Hostname(); h != host {
		return false
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
