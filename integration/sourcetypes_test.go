package integration

// Events tables of every shape pgscribe reads: the column types event
// stores use, streams starting at 0 or 1, plain and partitioned (list,
// range with hash below it, a partition attached while the engine runs),
// and the tables of two real event stores created from their own DDL. Each
// runs through the backfill, the live stream and a restart, and the read
// model is compared exactly with what SQL over the events table says it
// must be, for three projections: two sharing one slot and decode (a
// group) and one on a slot of its own.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// sourceShape is one events table and how pgscribe is told to read it.
type sourceShape struct {
	name string
	ddl  string // creates the table (and what it needs)
	// table and columns are the [source] table and [source.columns] lines.
	table, columns string
	// insert appends events; its SELECT list sees s (stream number) and k
	// (the event's index in its stream, from 0) and ranges over
	// generate_series($1, $2) s, generate_series($3, $4) k.
	insertInto, values string
	// view reads the table back in the fields the expectation needs:
	// stream_id, sp, p, t, i, o (timestamptz or NULL), d (jsonb or NULL),
	// u (text).
	view string
	// occurred says the projection sets last_occurred (the table has an
	// occurred_at column).
	occurred bool
	// live, when set, runs while the engine is live (a partition attached);
	// liveStreams are then streams only it can hold.
	live        string
	liveStreams [2]int
	// before runs before migrate (an older pgscribe's publication).
	before string
}

// sourceTypesProjection projects every event of a stream onto one row: how
// many, their amounts, and the last event's fields, so that each field
// pgscribe decodes shows in the read model.
func sourceTypesProjection(occurred bool) string {
	occ := ""
	if occurred {
		occ = `, last_occurred = "occurred_at"`
	}
	return projectionTOML("shape", 1, "", rule{name: "tally", op: "upsert", table: "rm_streams",
		key: `stream_id = "stream_id"`,
		set: `last_type = "type", last_stream_position = "stream_position", last_position = "position", last_id = "id", last_user = "metadata.user ?? ''"` + occ,
		inc: `events = "1", amount = "data.amount ?? 0"`})
}

// sourceTypesGroup is what every shape runs: the projection twice in the
// default group (one shared slot and decode: shape and shape_g) and once in
// a group of its own (its own slot: shape_own), each into its read model.
var sourceTypesGroup = []struct{ projection, table, group string }{
	{"shape", "rm_streams", ""}, {"shape_g", "rm_streams_g", ""}, {"shape_own", "rm_streams_own", "own"},
}

// sourceTypesProjections is sourceTypesProjection for sourceTypesGroup.
func sourceTypesProjections(occurred bool) (toml, ddl string) {
	for _, p := range sourceTypesGroup {
		one := strings.Replace(sourceTypesProjection(occurred), `table = "rm_streams"`, fmt.Sprintf("table = %q", p.table), 1)
		one = strings.Replace(one, `name = "shape"`, fmt.Sprintf("name = %q", p.projection), 1)
		if p.group != "" {
			one = strings.Replace(one, "version = 1\n", fmt.Sprintf("version = 1\ngroup = %q\n", p.group), 1)
		}
		toml += one
		ddl += strings.Replace(sourceTypesReadModel, "rm_streams", p.table, 1) + ";\n"
	}
	return toml, ddl
}

const sourceTypesReadModel = `CREATE TABLE rm_streams (
  stream_id            text PRIMARY KEY,
  events               bigint NOT NULL,
  amount               bigint NOT NULL,
  last_type            text NOT NULL,
  last_stream_position bigint NOT NULL,
  last_position        bigint NOT NULL,
  last_id              text NOT NULL,
  last_user            text NOT NULL,
  last_occurred        timestamptz
)`

// Values every shape writes: three types, an amount, metadata and data
// that are sometimes NULL (or absent from the document), and a time with
// microseconds.
const (
	shapeType     = `(ARRAY['Deposited', 'Withdrawn', 'Noted'])[k % 3 + 1]`
	shapeData     = `CASE WHEN k % 7 = 3 THEN NULL ELSE jsonb_build_object('amount', k * 10 + s) END`
	shapeDataJSON = `CASE WHEN k % 7 = 3 THEN '{}' ELSE jsonb_build_object('amount', k * 10 + s) END`
	shapeMeta     = `CASE WHEN k % 4 = 1 THEN NULL ELSE jsonb_build_object('user', 'u' || k) END`
	shapeTime     = `timestamp '2026-12-01 11:56:06.672146' + k * interval '1.000001 s' + s * interval '1 day'`
)

var sourceShapes = []sourceShape{{
	name: "int identity, bigint streams from 0, json, text, timestamp",
	ddl: `CREATE TABLE ev (
  seq       int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id  text NOT NULL UNIQUE,
  stream    bigint NOT NULL,
  version   int NOT NULL,
  kind      varchar(64) NOT NULL,
  body      json,
  meta      text,
  at        timestamp without time zone NOT NULL,
  UNIQUE (stream, version))`,
	table:      `table = "ev"`,
	columns:    `position = "seq"` + "\n" + `id = "event_id"` + "\n" + `stream_id = "stream"` + "\n" + `stream_position = "version"` + "\n" + `type = "kind"` + "\n" + `data = "body"` + "\n" + `metadata = "meta"` + "\n" + `occurred_at = "at"`,
	insertInto: `ev (event_id, stream, version, kind, body, meta, at)`,
	values:     `'e-' || s || '-' || k, s, k, ` + shapeType + `, (` + shapeData + `)::json, (` + shapeMeta + `)::text, ` + shapeTime,
	view:       `SELECT stream::text AS stream_id, version::bigint AS sp, seq::bigint AS p, kind::text AS t, event_id AS i, at AT TIME ZONE 'UTC' AS o, body::jsonb AS d, coalesce(meta::jsonb ->> 'user', '') AS u FROM ev`,
	occurred:   true,
}, {
	name: "bigserial, uuid streams from 1, text data, a domain, no id, metadata or time",
	ddl: `CREATE DOMAIN event_type AS text CHECK (VALUE <> '');
CREATE TABLE ev (
  position  bigserial PRIMARY KEY,
  stream    uuid NOT NULL,
  n         bigint NOT NULL,
  type      event_type NOT NULL,
  payload   text NOT NULL,
  UNIQUE (stream, n))`,
	table:      `table = "ev"`,
	columns:    `id = ""` + "\n" + `stream_id = "stream"` + "\n" + `stream_position = "n"` + "\n" + `data = "payload"` + "\n" + `metadata = ""` + "\n" + `occurred_at = ""`,
	insertInto: `ev (stream, n, type, payload)`,
	values:     `md5('stream' || s)::uuid, k + 1, ` + shapeType + `, (` + shapeDataJSON + `)::text`,
	view:       `SELECT stream::text AS stream_id, n AS sp, position AS p, type::text AS t, '' AS i, NULL::timestamptz AS o, payload::jsonb AS d, '' AS u FROM ev`,
}, {
	name: "list partitions, one attached live, varchar streams, older publication",
	ddl: `CREATE SCHEMA es;
CREATE TABLE es.events (
  position        bigserial,
  tenant          text NOT NULL,
  id              uuid NOT NULL DEFAULT gen_random_uuid(),
  stream_id       varchar(100) NOT NULL,
  stream_position bigint NOT NULL,
  type            text NOT NULL,
  data            jsonb,
  metadata        jsonb,
  occurred_at     timestamptz NOT NULL,
  PRIMARY KEY (tenant, position),
  UNIQUE (tenant, stream_id, stream_position)
) PARTITION BY LIST (tenant);
CREATE TABLE es.events_a PARTITION OF es.events FOR VALUES IN ('a');
CREATE TABLE es.events_b PARTITION OF es.events FOR VALUES IN ('b');
CREATE TABLE es.events_c (LIKE es.events);`,
	before:     `CREATE PUBLICATION pgscribe_events FOR TABLE es.events WITH (publish = 'insert')`,
	table:      `table = "es.events"`,
	insertInto: `es.events (tenant, stream_id, stream_position, type, data, metadata, occurred_at)`,
	values:     `CASE WHEN s > 100 THEN 'c' WHEN s % 2 = 0 THEN 'a' ELSE 'b' END, 'st-' || s, k + 1, ` + shapeType + `, ` + shapeData + `, ` + shapeMeta + `, ` + shapeTime,
	view:       `SELECT stream_id::text, stream_position AS sp, position AS p, type AS t, id::text AS i, occurred_at AS o, data AS d, coalesce(metadata ->> 'user', '') AS u FROM es.events`,
	occurred:   true,
	// Without publish_via_partition_root (as an older pgscribe left it)
	// the stream names the partitions: they are read as the table.
	live: `ALTER PUBLICATION pgscribe_events SET (publish_via_partition_root = false);
ALTER TABLE es.events ATTACH PARTITION es.events_c FOR VALUES IN ('c')`,
	liveStreams: [2]int{101, 103},
}, {
	name: "range partitions over hash partitions, one attached live, int streams",
	ddl: `CREATE TABLE ev (
  pos         bigserial,
  id          uuid NOT NULL DEFAULT gen_random_uuid(),
  stream      int NOT NULL,
  sp          smallint NOT NULL,
  type        text NOT NULL,
  data        jsonb NOT NULL,
  metadata    json,
  occurred_at timestamptz NOT NULL,
  PRIMARY KEY (pos, stream)
) PARTITION BY RANGE (pos);
CREATE TABLE ev_low PARTITION OF ev FOR VALUES FROM (MINVALUE) TO (100000) PARTITION BY HASH (stream);
CREATE TABLE ev_low_0 PARTITION OF ev_low FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE ev_low_1 PARTITION OF ev_low FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE TABLE ev_high (LIKE ev INCLUDING DEFAULTS);`,
	table:      `table = "ev"`,
	columns:    `position = "pos"` + "\n" + `stream_id = "stream"` + "\n" + `stream_position = "sp"`,
	insertInto: `ev (stream, sp, type, data, metadata, occurred_at)`,
	values:     `s, k, ` + shapeType + `, ` + shapeDataJSON + `, (` + shapeMeta + `)::json, ` + shapeTime,
	view:       `SELECT stream::text AS stream_id, sp::bigint, pos AS p, type AS t, id::text AS i, occurred_at AS o, data AS d, coalesce(metadata::jsonb ->> 'user', '') AS u FROM ev`,
	occurred:   true,
	// Later events land in a partition attached while pgscribe streams.
	live:        `ALTER TABLE ev ATTACH PARTITION ev_high FOR VALUES FROM (100000) TO (MAXVALUE); SELECT setval('ev_pos_seq', 100000)`,
	liveStreams: [2]int{201, 202},
}, {
	// message-db (github.com/message-db/message-db,
	// database/tables/messages.sql and database/indexes/): its table as its
	// DDL creates it. Streams start at position 0; time is a timestamp
	// without time zone holding UTC.
	name: "message-db",
	ddl: `CREATE SCHEMA message_store;
CREATE TABLE IF NOT EXISTS message_store.messages (
  global_position bigserial NOT NULL,
  position bigint NOT NULL,
  time TIMESTAMP WITHOUT TIME ZONE DEFAULT (now() AT TIME ZONE 'utc') NOT NULL,
  stream_name text NOT NULL,
  type text NOT NULL,
  data jsonb,
  metadata jsonb,
  id UUID NOT NULL DEFAULT gen_random_uuid()
);
ALTER TABLE message_store.messages ADD PRIMARY KEY (global_position) NOT DEFERRABLE INITIALLY IMMEDIATE;
CREATE UNIQUE INDEX messages_stream ON message_store.messages (stream_name, position);
CREATE UNIQUE INDEX messages_id ON message_store.messages (id);`,
	table:      `table = "message_store.messages"`,
	columns:    `position = "global_position"` + "\n" + `stream_id = "stream_name"` + "\n" + `stream_position = "position"` + "\n" + `occurred_at = "time"`,
	insertInto: `message_store.messages (stream_name, position, type, data, metadata)`,
	values:     `'account-' || s, k, ` + shapeType + `, ` + shapeData + `, ` + shapeMeta,
	view:       `SELECT stream_name AS stream_id, position AS sp, global_position AS p, type AS t, id::text AS i, time AT TIME ZONE 'UTC' AS o, data AS d, coalesce(metadata ->> 'user', '') AS u FROM message_store.messages`,
	occurred:   true,
}, {
	// SQLStreamStore (github.com/SQLStreamStore/SQLStreamStore,
	// src/SqlStreamStore.Postgres/PgSqlScripts/Tables.sql), its schema
	// placeholder set to "sss": streams are an int of the streams table,
	// versions and global positions start at 0, created_utc is a
	// timestamp without time zone.
	name: "SQLStreamStore",
	ddl: `CREATE SCHEMA sss;
CREATE SEQUENCE IF NOT EXISTS sss.streams_seq
  START 1;
CREATE TABLE IF NOT EXISTS sss.streams (
  id                   CHAR(42)      NOT NULL,
  id_original          VARCHAR(1000) NOT NULL,
  id_internal          INT           NOT NULL DEFAULT nextval('sss.streams_seq'),
  version              INT           NOT NULL DEFAULT (-1),
  position             BIGINT        NOT NULL DEFAULT (-1),
  max_age              INT           NULL,
  max_count            INT           NULL,
  CONSTRAINT pk_streams PRIMARY KEY (id_internal),
  CONSTRAINT uq_streams_id UNIQUE (id),
  CONSTRAINT ck_version_gte_negative_one CHECK (version >= -1)
);
CREATE SEQUENCE IF NOT EXISTS sss.messages_seq
  START 0
  MINVALUE 0;
CREATE TABLE IF NOT EXISTS sss.messages (
  stream_id_internal INT          NOT NULL,
  stream_version     INT          NOT NULL,
  "position"         BIGINT       NOT NULL DEFAULT nextval('sss.messages_seq'),
  message_id         UUID         NOT NULL,
  created_utc        TIMESTAMP    NOT NULL,
  type               VARCHAR(128) NOT NULL,
  json_data          JSONB      NOT NULL,
  json_metadata      JSONB,
  CONSTRAINT pk_messages PRIMARY KEY (position),
  CONSTRAINT fk_messages_stream FOREIGN KEY (stream_id_internal) REFERENCES sss.streams (id_internal),
  CONSTRAINT uq_messages_stream_id_internal_and_stream_version UNIQUE (stream_id_internal, stream_version),
  CONSTRAINT uq_stream_id_internal_and_message_id UNIQUE (stream_id_internal, message_id),
  CONSTRAINT ck_stream_version_gte_zero CHECK (stream_version >= 0)
);
ALTER SEQUENCE sss.messages_seq
  OWNED BY sss.messages.position;
INSERT INTO sss.streams (id, id_original, id_internal) SELECT md5('s' || s), 'stream-' || s, s FROM generate_series(1, 300) s;`,
	table:      `table = "sss.messages"`,
	columns:    `id = "message_id"` + "\n" + `stream_id = "stream_id_internal"` + "\n" + `stream_position = "stream_version"` + "\n" + `data = "json_data"` + "\n" + `metadata = "json_metadata"` + "\n" + `occurred_at = "created_utc"`,
	insertInto: `sss.messages (stream_id_internal, stream_version, message_id, created_utc, type, json_data, json_metadata)`,
	values:     `s, k, gen_random_uuid(), ` + shapeTime + `, ` + shapeType + `, ` + shapeDataJSON + `, ` + shapeMeta,
	view:       `SELECT stream_id_internal::text AS stream_id, stream_version::bigint AS sp, position AS p, type::text AS t, message_id::text AS i, created_utc AT TIME ZONE 'UTC' AS o, json_data AS d, coalesce(json_metadata ->> 'user', '') AS u FROM sss.messages`,
	occurred:   true,
}}

// TestSourceTypes runs every shape through backfill, streaming and a
// restart, comparing the read model exactly each time.
func TestSourceTypes(t *testing.T) {
	for _, sh := range sourceShapes {
		t.Run(sh.name, func(t *testing.T) { runSourceShape(t, sh) })
	}
}

func runSourceShape(t *testing.T, sh sourceShape) {
	e := newCLIEnv(t)
	// The server's time zone is not UTC, so that a time read in the
	// session's zone rather than as pgscribe documents shows up.
	e.exec(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET TimeZone = %L', current_database(), 'Asia/Kolkata'); END $$`)
	e.exec(sh.ddl)
	if sh.before != "" {
		e.exec(sh.before)
	}
	source := sh.table
	if sh.columns != "" {
		source += "\n\n[source.columns]\n" + sh.columns
	}
	projections, ddl := sourceTypesProjections(sh.occurred)
	cfg := e.config("shape", source, "", projections)
	e.mustRun(0, "migrate", "-config", cfg)
	e.exec(ddl)
	e.mustRun(0, "check", "-config", cfg)
	if sh.before != "" {
		if n := e.queryInt(`SELECT count(*) FROM pg_publication WHERE pubname = 'pgscribe_events' AND pubviaroot`); n != 1 {
			t.Fatal("migrate left the publication without publish_via_partition_root")
		}
	}

	table := sh.insertInto[:strings.Index(sh.insertInto, " ")]
	var checkProjection func(step string, p *node, projection, rm string)
	appendEvents := func(s1, s2, k1, k2 int) {
		t.Helper()
		e.exec(fmt.Sprintf(`INSERT INTO %s SELECT %s FROM generate_series($1::int, $2::int) s, generate_series($3::int, $4::int) k ORDER BY s, k`,
			sh.insertInto, sh.values), s1, s2, k1, k2)
	}
	check := func(step string, p *node) {
		t.Helper()
		for _, pr := range sourceTypesGroup {
			checkProjection(step+" ("+pr.projection+")", p, pr.projection, pr.table)
		}
		if n := e.queryInt(`SELECT count(*) FROM pgscribe.dead_letters`); n != 0 {
			t.Errorf("%s: %d dead letters", step, n)
		}
		// shape and shape_g share the default group's slot once they joined
		// (each backfills on a slot of its own first, dropped at the join);
		// shape_own has its own.
		waitFor(t, time.Minute, step+": two slots, the default group's streaming", func() bool {
			p.requireRunning()
			return e.queryInt(`SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`) == 2 &&
				e.queryInt(`SELECT count(*) FROM pg_replication_slots WHERE database = current_database()
  AND slot_name LIKE '%\_group\_default' AND active`) == 1
		})
		// The lag probe reads the position column too.
		if p.logText("lag probe failed") > 0 {
			t.Errorf("%s: the lag probe failed on this table", step)
		}
	}
	checkProjection = func(step string, p *node, projection, rm string) {
		t.Helper()
		waitFor(t, 2*time.Minute, step+": every event accounted for", func() bool {
			p.requireRunning()
			return e.queryInt(fmt.Sprintf(`SELECT (SELECT count(*) FROM %s) - coalesce((SELECT sum(applied + skipped + dead_lettered)
FROM pgscribe.cursors WHERE projection = $1 AND version = 1), 0)::bigint`, table), projection) == 0
		})
		want := `WITH ev AS (` + sh.view + `)
SELECT stream_id, count(*)::bigint AS events, coalesce(sum((d ->> 'amount')::bigint), 0)::bigint AS amount,
  (array_agg(t ORDER BY sp DESC))[1] AS last_type, max(sp)::bigint AS last_stream_position,
  (array_agg(p ORDER BY sp DESC))[1]::bigint AS last_position, (array_agg(i ORDER BY sp DESC))[1] AS last_id,
  (array_agg(u ORDER BY sp DESC))[1] AS last_user, (array_agg(o ORDER BY sp DESC))[1] AS last_occurred
FROM ev GROUP BY stream_id`
		got := `SELECT stream_id, events, amount, last_type, last_stream_position, last_position, last_id, last_user, last_occurred FROM ` + rm
		diff := e.queryInt(`WITH want AS (` + want + `), got AS (` + got + `)
SELECT (SELECT count(*) FROM (SELECT * FROM want EXCEPT SELECT * FROM got) a) + (SELECT count(*) FROM (SELECT * FROM got EXCEPT SELECT * FROM want) b)`)
		if diff != 0 {
			t.Errorf("%s: read model differs from the events in %d rows", step, diff)
			rows, err := e.conn.Query(t.Context(), `WITH want AS (`+want+`), got AS (`+got+`)
SELECT 'want', w::text FROM (SELECT * FROM want EXCEPT SELECT * FROM got) w UNION ALL
SELECT 'got', g::text FROM (SELECT * FROM got EXCEPT SELECT * FROM want) g ORDER BY 2 LIMIT 10`)
			if err == nil {
				for rows.Next() {
					var side, r string
					_ = rows.Scan(&side, &r)
					t.Logf("%s %s", side, r)
				}
				rows.Close()
			}
		}
		if n := e.queryInt(`SELECT count(*) FROM ` + rm); n == 0 {
			t.Errorf("%s: empty read model", step)
		}
	}

	// Backfill: 6 streams of 8 events.
	appendEvents(1, 6, 0, 7)
	p := e.start(cfg)
	check("backfill", p)

	// Live: the same streams go on, new ones start.
	appendEvents(1, 6, 8, 11)
	appendEvents(7, 9, 0, 4)
	if sh.live != "" {
		e.exec(sh.live)
		appendEvents(sh.liveStreams[0], sh.liveStreams[1], 0, 5)
		appendEvents(1, 2, 12, 13)
	}
	check("live", p)

	// Restart: events appended while stopped, then live again.
	p.stop()
	appendEvents(1, 9, 20, 22)
	p.start()
	check("after restart", p)
	appendEvents(10, 11, 0, 3)
	check("live after restart", p)
	p.stop()
}

// TestSourceTypeUnreadable: a mapped column of a type pgscribe cannot read
// is refused by check, naming the column and its type, and halts run at
// start, before any event.
func TestSourceTypeUnreadable(t *testing.T) {
	e := newCLIEnv(t)
	e.exec(`CREATE TABLE events (
  position        bigserial PRIMARY KEY,
  id              uuid NOT NULL DEFAULT gen_random_uuid(),
  stream_id       text NOT NULL,
  stream_position bigint NOT NULL,
  type            text NOT NULL,
  data            bytea NOT NULL,
  metadata        jsonb,
  occurred_at     date NOT NULL DEFAULT current_date)`)
	cfg := e.config("unreadable", "", "", sourceTypesProjection(true))
	e.mustRun(0, "migrate", "-config", cfg)
	e.exec(sourceTypesReadModel)
	r := e.mustRun(2, "check", "-config", cfg)
	for _, want := range []string{`column "data": has type bytea`, `column "occurred_at": has type date`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check lacks %q:\n%s", want, r)
		}
	}
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('s', 1, 'Deposited', '\x00')`)
	p := e.start(cfg)
	waitFor(t, time.Minute, "run to halt on the column type", func() bool {
		p.requireRunning()
		return p.logText("projection halted") > 0 && p.logText("bytea") > 0
	})
	if n := e.queryInt(`SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1`, e.prefix+"%"); n != 0 {
		t.Errorf("a halted start created %d slots", n)
	}
	p.stop()
}

// TestSourceForeignRelation: an insert into a table the publication also
// publishes, which is not the events table, halts the projection rather
// than being dropped (or applied).
func TestSourceForeignRelation(t *testing.T) {
	e := newCLIEnv(t)
	cfg := e.config("foreign", "", "", sourceTypesProjection(true))
	e.mustRun(0, "migrate", "-config", cfg, "-events-table")
	e.exec(sourceTypesReadModel)
	e.exec(`CREATE TABLE other (id int PRIMARY KEY); ALTER PUBLICATION pgscribe_events ADD TABLE other`)
	if r := e.mustRun(2, "check", "-config", cfg); !strings.Contains(r.stdout, "also publishes public.other") {
		t.Errorf("check does not name the other table:\n%s", r)
	}
	p := e.start(cfg)
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('s', 1, 'Deposited', '{"amount": 1}')`)
	waitFor(t, time.Minute, "the event", func() bool {
		p.requireRunning()
		return e.queryInt(`SELECT count(*) FROM rm_streams`) == 1
	})
	e.exec(`INSERT INTO other VALUES (1)`)
	waitFor(t, time.Minute, "run to halt on the other table's insert", func() bool {
		p.requireRunning()
		return p.logText("projection halted") > 0 && p.logText("public.other") > 0
	})
	p.stop()

	// The slot's history still holds that insert as published: the way out
	// is the table out of the publication and a resync (the slot dropped;
	// per-stream cursors skip what was applied).
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('s', 2, 'Deposited', '{"amount": 2}')`)
	e.exec(`ALTER PUBLICATION pgscribe_events DROP TABLE other`)
	e.exec(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE $1`, e.prefix+"%")
	e.mustRun(0, "check", "-config", cfg)
	p.start()
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('s', 3, 'Deposited', '{"amount": 4}')`)
	waitFor(t, time.Minute, "the events after the resync", func() bool {
		p.requireRunning()
		return e.queryInt(`SELECT events * 100 + amount FROM rm_streams WHERE stream_id = 's'`) == 307
	})
	p.stop()
}
