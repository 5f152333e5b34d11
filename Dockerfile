# pgscribe container image: a static binary on an empty base.
#
#   docker build -t pgscribe --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse HEAD) --build-arg COMMIT_DATE=$(git log -1 --format=%cI) .
#   docker run --rm -e PGSCRIBE_DATABASE_URL=postgres://… \
#     -v /etc/pgscribe/pgscribe.toml:/etc/pgscribe/pgscribe.toml:ro \
#     -p 9187:9187 pgscribe
#
# The configuration must set [metrics] listen = "0.0.0.0:9187" (the default
# binds loopback, unreachable from outside the container) and a stable
# [engine] node name if the container's host name is random. Give the
# container more time to stop than [engine] shutdown_timeout (default 30s):
# `docker stop -t 45`, `stop_grace_period: 45s` in Compose,
# terminationGracePeriodSeconds: 45 in Kubernetes. See docs/operations.md.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# What `pgscribe version` prints: -buildvcs=false below (the build context
# need not be a git clone), so the commit comes from these.
ARG VERSION=dev
ARG COMMIT=
ARG COMMIT_DATE=
# CGO_ENABLED=0: a static binary that needs no libc, so it runs FROM scratch.
# `go build` fetches only the modules the binary needs (not `go mod
# download`, which would also fetch the test harness's Docker client).
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
	-ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.commitDate=${COMMIT_DATE}" -o /out/pgscribe . \
	&& /out/pgscribe version

FROM scratch
# CA certificates for sslmode=verify-full; nothing else is needed: no shell,
# no libc, no user database (the user below is numeric).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/pgscribe /usr/local/bin/pgscribe
USER 65532:65532
ENV PGSCRIBE_CONFIG=/etc/pgscribe/pgscribe.toml
EXPOSE 9187
# pgscribe stops gracefully on SIGTERM (docker stop); a second signal
# stops at once.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/pgscribe"]
CMD ["run"]
