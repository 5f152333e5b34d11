#!/usr/bin/env bash
# build-pg-image.sh builds a PostgreSQL Docker image from this machine's own
# PostgreSQL install, for machines whose Docker engine cannot pull images.
#
# The image is a root filesystem assembled by hand (PostgreSQL's bin/ and
# lib/, its share/ files, the shared libraries ldd says they need, dash) and
# loaded with `docker import`: no registry, no base image, no Dockerfile. Its
# entrypoint behaves like the official `postgres` image for what pgscribe's
# tests use: POSTGRES_PASSWORD, POSTGRES_USER, POSTGRES_DB, PGDATA and
# POSTGRES_HOST_AUTH_METHOD; extra `-c name=value` arguments after `postgres`.
#
# Usage: scripts/build-pg-image.sh [-f|--force] [TAG]
#   TAG               image tag (default $LOCAL_PG_IMAGE, else pgscribe-postgres:local)
#   -f, --force       rebuild even when the image already exists (or FORCE=1)
# Environment:
#   PG_VERSION        major version to package (default: newest in /usr/lib/postgresql)
#   PG_WITH_JIT=1     also package llvmjit and libLLVM (about 120 MB more);
#                     without it the server runs with JIT unavailable, as if
#                     postgresql-NN-jit were not installed.
set -euo pipefail

force="${FORCE:-0}"
tag="${LOCAL_PG_IMAGE:-pgscribe-postgres:local}"
while [ $# -gt 0 ]; do
	case "$1" in
	-f | --force) force=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "build-pg-image: unknown option $1" >&2
		exit 2
		;;
	*) tag="$1" ;;
	esac
	shift
done

log() { echo "build-pg-image: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
	log "no Docker engine answers; nothing to build"
	exit 1
fi
if [ "$force" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
	log "$tag already exists (use --force to rebuild)"
	exit 0
fi

if [ -z "${PG_VERSION:-}" ]; then
	for bin in /usr/lib/postgresql/*/bin/postgres; do
		[ -x "$bin" ] || continue
		v="${bin#/usr/lib/postgresql/}"
		v="${v%%/*}"
		if [ -z "${PG_VERSION:-}" ] || [ "$v" -gt "$PG_VERSION" ]; then PG_VERSION="$v"; fi
	done
fi
if [ -z "${PG_VERSION:-}" ]; then
	log "no PostgreSQL found in /usr/lib/postgresql/*/bin (apt-get install postgresql-15)"
	exit 1
fi
pgroot="/usr/lib/postgresql/$PG_VERSION"
pgshare="/usr/share/postgresql/$PG_VERSION"
for f in "$pgroot/bin/postgres" "$pgroot/bin/initdb" "$pgshare/postgres.bki"; do
	if [ ! -e "$f" ]; then
		log "missing $f"
		exit 1
	fi
done

start=$(date +%s)
rootfs="$(mktemp -d "${TMPDIR:-/tmp}/pg-rootfs.XXXXXX")"
tarball="$rootfs.tar"
trap 'rm -rf "$rootfs" "$tarball"' EXIT
log "assembling PostgreSQL $PG_VERSION from $pgroot in $rootfs"

# Debian 12 is merged-/usr: keep the same layout so the paths ldd prints and
# the paths compiled into PostgreSQL (share dir, socket dir) are valid as is.
mkdir -p "$rootfs"/{usr/bin,usr/sbin,usr/lib,usr/lib64,usr/local/bin,usr/share,etc,dev,proc,sys,root}
mkdir -p "$rootfs"/{tmp,run/postgresql,var/lib/postgresql/data}
ln -s usr/bin "$rootfs/bin"
ln -s usr/sbin "$rootfs/sbin"
ln -s usr/lib "$rootfs/lib"
ln -s usr/lib64 "$rootfs/lib64"
ln -s ../run "$rootfs/var/run"
chmod 1777 "$rootfs/tmp"
chmod 0700 "$rootfs/root" "$rootfs/var/lib/postgresql/data"
chmod 2775 "$rootfs/run/postgresql"

mkdir -p "$rootfs$pgroot" "$rootfs/usr/share/postgresql"
cp -a "$pgroot/." "$rootfs$pgroot/"
cp -a "$pgshare" "$rootfs/usr/share/postgresql/"
# PostgreSQL on Debian uses the system time zone database.
if [ -d /usr/share/zoneinfo ]; then cp -a /usr/share/zoneinfo "$rootfs/usr/share/"; fi
if [ "${PG_WITH_JIT:-0}" != 1 ]; then
	rm -rf "$rootfs$pgroot"/lib/llvmjit*.so "$rootfs$pgroot"/lib/llvmjit_types.bc "$rootfs$pgroot/lib/bitcode"
fi
cp -L /bin/sh "$rootfs/usr/bin/dash"
ln -s dash "$rootfs/usr/bin/sh"

# Every shared library the ELF files need, copied under the name the loader
# looks for (the soname path ldd prints, dereferenced), plus the loader.
libs="$(
	for f in "$rootfs$pgroot"/bin/* "$rootfs$pgroot"/lib/*.so "$rootfs/usr/bin/dash"; do
		[ -f "$f" ] || continue
		ldd "$f" 2>/dev/null || true
	done | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u
)"
nlibs=0
for lib in $libs; do
	dir="$(cd "$(dirname "$lib")" && pwd -P)"
	mkdir -p "$rootfs$dir"
	cp -L "$lib" "$rootfs$dir/$(basename "$lib")"
	nlibs=$((nlibs + 1))
done
log "copied $nlibs shared libraries"

cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
postgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/sh
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
postgres:x:999:
GROUP
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$rootfs/etc/hosts"

# The entrypoint needs nothing but dash builtins and PostgreSQL's binaries.
cat >"$rootfs/usr/local/bin/docker-entrypoint.sh" <<'ENTRYPOINT'
#!/bin/sh
# Initialises an empty $PGDATA the way the official postgres image does, then
# execs the command (default: postgres). Only shell builtins and PostgreSQL
# binaries are available in this image.
set -eu

# `docker run IMAGE -c foo=bar` means `postgres -c foo=bar`.
if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi

if [ "$1" = postgres ] || [ "$1" = postmaster ]; then
	: "${PGDATA:=/var/lib/postgresql/data}"
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	export PGDATA

	if [ ! -s "$PGDATA/PG_VERSION" ]; then
		auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
		if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
			echo "error: database is uninitialized and POSTGRES_PASSWORD is not set" >&2
			echo "       (set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
			exit 1
		fi
		# The password goes through a pipe, never a file or the command line.
		# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words
		printf '%s\n' "${POSTGRES_PASSWORD:-}" |
			initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/dev/stdin \
				--auth-local=trust --auth-host="$auth" --locale=C -E UTF8 \
				--no-instructions ${POSTGRES_INITDB_ARGS:-} >/dev/null
		{
			echo
			echo "# added by docker-entrypoint.sh"
			echo "host all all all $auth"
			echo "host replication all all $auth"
		} >>"$PGDATA/pg_hba.conf"
		echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
		if [ "$POSTGRES_DB" != postgres ]; then
			printf 'CREATE DATABASE "%s";\n' "$POSTGRES_DB" |
				postgres --single -j -D "$PGDATA" postgres >/dev/null
		fi
		echo "PostgreSQL init process complete; ready for start up."
	fi
fi

exec "$@"
ENTRYPOINT
chmod 0755 "$rootfs/usr/local/bin/docker-entrypoint.sh"

# Everything belongs to root except PGDATA's parent and the socket directory,
# which belong to the postgres user (uid 999) the container runs as. Two tar
# passes set the owners without needing root on the build host.
tar --numeric-owner --owner=0 --group=0 -C "$rootfs" \
	--exclude=./var/lib/postgresql --exclude=./run/postgresql -cf "$tarball" .
tar --numeric-owner --owner=999 --group=999 -C "$rootfs" \
	-rf "$tarball" ./var/lib/postgresql ./run/postgresql
log "rootfs is $(du -sh "$tarball" | cut -f1); importing as $tag"

docker import \
	--change "ENV PATH=$pgroot/bin:/usr/local/bin:/usr/bin:/bin" \
	--change "ENV PGDATA=/var/lib/postgresql/data" \
	--change "USER 999:999" \
	--change "WORKDIR /var/lib/postgresql" \
	--change "EXPOSE 5432" \
	--change "LABEL org.pgscribe.pg-image.source=$pgroot org.pgscribe.pg-image.version=$PG_VERSION" \
	--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
	--change 'CMD ["postgres"]' \
	--message "PostgreSQL $PG_VERSION from $pgroot (scripts/build-pg-image.sh)" \
	"$tarball" "$tag" >/dev/null
log "built $tag in $(($(date +%s) - start))s"
