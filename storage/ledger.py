"""The sweep ledger: which trials exist, their status and MLflow run, who runs them, and their result.

It is what makes resume exact: a trial is `finished` only once its MLflow run is complete, and the
ledger row is written last, so a crash at any point leaves at worst an unfinished row to redo.

It is also what lets several drivers (two terminals, two people) work on one sweep: a driver *leases*
a trial before running it (a compare-and-set UPDATE, atomic on SQLite and PostgreSQL alike), renews
its leases while it runs (heartbeat) and gives them back when it records the result. A driver that
dies stops renewing, so its leases expire (`PRIVBENCH_LEASE_S`, default 60 s) and another driver
takes the trials over; a dead driver on the same host is noticed at once (its pid is gone).

Every time a lease is written or compared with is the database's clock (`now_sql`), never a driver's:
drivers on machines whose clocks disagree still agree on when a lease lapses. A PostgreSQL ledger uses
the server's clock; a SQLite ledger is a file on one machine, whose clock all its drivers share.
A driver also registers itself on the sweep it runs (`privbench_drivers`), with the identity of its
grid (`grid_key`): a sweep name belongs to one grid at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
import struct
import time
import urllib.parse
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from storage.errors import StoreError
from storage.location import mask_uri, sqlite_path

metadata = sa.MetaData()

meta = sa.Table(
    "privbench_meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

sweeps = sa.Table(
    "privbench_sweeps", metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("experiment_id", sa.String(64), nullable=False),
    sa.Column("grid_yaml", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("sweep_id", sa.String(64)),  # the identity its experiment and runs carry as tags
)

trials = sa.Table(
    "privbench_trials", metadata,
    sa.Column("sweep", sa.String(200), primary_key=True),
    sa.Column("trial_key", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),  # pending | running | finished | failed | superseded
    sa.Column("run_id", sa.String(64)),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("dataset", sa.String(200)),
    sa.Column("model", sa.String(200)),
    sa.Column("mechanism", sa.String(100)),
    sa.Column("epsilon", sa.Float),
    sa.Column("seed", sa.BigInteger),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("result_json", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("lease_owner", sa.String(200)),  # host:pid:nonce of the driver running the trial
    sa.Column("lease_expires", sa.Float),
    # A trial's accelerator-phase output (JSON), kept until its record is written: a lost analysis phase
    # reruns from it without retraining.
    sa.Column("phase_json", sa.Text),
)

# The drivers running a sweep right now and the grid each runs (the hash of its trial keys): a second
# driver with another grid under the same name is refused (`register_driver`), instead of superseding
# the first one's trials while it runs. A row lives as long as a lease (renewed by the heartbeat).
drivers = sa.Table(
    "privbench_drivers", metadata,
    sa.Column("sweep", sa.String(200), primary_key=True),
    sa.Column("owner", sa.String(200), primary_key=True),
    sa.Column("grid_key", sa.String(64), nullable=False),
    sa.Column("trials", sa.Integer, nullable=False),
    sa.Column("expires", sa.Float, nullable=False),
)

# One row per `sweep run` that ran trials: its wall time and the driver's account of it (`timing_json`:
# orchestrator.submit.DriverTiming and the runner's start and end), which `sweep status --timing` sets beside the
# trials' own breakdowns.
driver_runs = sa.Table(
    "privbench_driver_runs", metadata,
    sa.Column("sweep", sa.String(200), primary_key=True),
    sa.Column("owner", sa.String(200), primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("wall_s", sa.Float, nullable=False),
    sa.Column("timing_json", sa.Text, nullable=False),
)

# Privacy plans by the settings they depend on (orchestrator/plan_cache.py says what the key covers): a sweep of a
# geometry planned before reads its plans here instead of calibrating again.
calibrations = sa.Table(
    "privbench_calibrations", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("view_json", sa.Text, nullable=False),  # what the key was made of, readable
    sa.Column("plan_blob", sa.LargeBinary, nullable=False),
)

SQLITE_BUSY_TIMEOUT_MS = 30_000
DONE = ("finished", "superseded")
INSERT_BATCH = 5_000  # new trial rows per INSERT when a large grid is opened
KEY_BATCH = 500  # trial keys per `unfinished` query (SQLite allows 999 bound values in older builds)
PG_LOCK_KEY = 0x7072697662656E63  # "privbenc": the advisory lock serialising store creation


def lease_seconds() -> float:
    """How long a lease lives without renewal (`PRIVBENCH_LEASE_S`, seconds, default 60)."""
    raw = os.environ.get("PRIVBENCH_LEASE_S", "60")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):  # 0 or less: every lease expired at once, trials run twice
        raise StoreError(f"PRIVBENCH_LEASE_S must be a positive number of seconds, got {raw[:40]!r}")
    return value


def new_owner() -> str:
    """A driver's lease identity: host and pid (to notice a dead local driver at once) and a nonce."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_dead(owner: str) -> bool:
    """Whether a lease's driver ran on this host and its process is gone (elsewhere: unknown, False)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine: only the lease's expiry tells
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _sqlite_ro_connect(path: Path) -> Callable[[], sqlite3.Connection]:
    """Read-only SQLite that never creates or changes a file.

    A cleanly closed store has no `-wal` file, and no writer has it open (a writer in WAL mode keeps
    one): it is opened `immutable=1`, because even `mode=ro` would create `-wal` and `-shm` sidecars
    next to it. While a writer runs (`-wal` present) it is opened `mode=ro`, which reads the writer's
    latest commits through those sidecars. Where that is refused (a store this user can read but not
    write: SQLite reports "attempt to write a readonly database" or "unable to open") it falls back to
    `immutable=1`: the committed state of the main file, as of the last checkpoint."""
    quoted = urllib.parse.quote(str(path))

    def immutable() -> sqlite3.Connection:
        return sqlite3.connect(f"file:{quoted}?mode=ro&immutable=1", uri=True, timeout=30, check_same_thread=False)

    def connect() -> sqlite3.Connection:
        if not path.with_name(path.name + "-wal").exists():
            return immutable()
        try:
            conn = sqlite3.connect(f"file:{quoted}?mode=ro", uri=True, timeout=30, check_same_thread=False)
            conn.execute("select count(*) from sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as e:
            if not any(s in str(e) for s in ("unable to open", "readonly database", "read-only")) or not path.exists():
                raise
        return immutable()

    return connect


def sqlite_damage(path: Path, *, full: bool = False) -> str | None:
    """What SQLite finds wrong with the file at `path` (its first problem), or None.

    `PRAGMA quick_check` reads every page and b-tree of the file (about the time a full read of it takes),
    so a torn or zeroed page is found before a query silently returns fewer rows than the file holds: a
    damaged index page makes `SELECT ... WHERE sweep = ?` return nothing, and a store would read as
    empty. `full` runs `PRAGMA integrity_check` instead, which also matches every index entry with its
    row (an index that lists a trial key no row has passes quick_check) and sees more damage inside
    rows. Before either, the file's length is checked against its header (a file cut short reads its
    lost pages as zeros) and a write-ahead log's header against its checksum (a torn one makes SQLite
    ignore every commit in it, and the store reads as it was at the last checkpoint). It never writes:
    the file is opened read-only, as read commands open it."""
    problem = _short_file(path) or _torn_wal(path)
    if problem is not None:
        return problem
    try:
        with contextlib.closing(_sqlite_ro_connect(path)()) as conn:
            rows = conn.execute("PRAGMA integrity_check" if full else "PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as e:  # not a database at all, or a header too damaged to open
        return "not a SQLite database: overwritten or truncated" if "not a database" in str(e) else str(e)
    lines = [line.strip() for row in rows for line in str(row[0]).splitlines()]
    lines = [line for line in lines if line and not line.startswith("*** in database")]
    return None if lines == ["ok"] else (lines[0] if lines else "integrity check failed")


def _short_file(path: Path) -> str | None:
    """A SQLite file shorter than SQLite reads it: a page of the database that is neither in the file nor in
    its write-ahead log (a file cut short reads its lost pages as zeros).

    The database's size is the larger of its header's (valid when its "version valid for" equals its change
    counter) and the one its log's last commit records. A WAL-mode database may be shorter than that on disk: its
    newest pages sit in the log until a checkpoint copies them in, and a disk that fills during a checkpoint
    leaves the header copied and the file not yet grown. Such a file is sound; SQLite reads it whole."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return None  # SQLite's own open says what is wrong
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        return None
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big") if header[24:28] == header[92:96] else 0
    if size >= pages * page and not (page >= 512 and size % page):
        return None  # whole as its header says (a checkpoint copies the header with the pages it sizes)
    logged, in_log = _wal_pages(path, page)  # only now: the log is read whole, with its checksums
    said = "its write-ahead log says" if logged > pages else "its header says"
    pages = max(pages, logged)  # privbench's stores never shrink: a log that says fewer lost the rest
    lost = [p for p in range(size // page + 1, pages + 1) if p not in in_log]
    if lost:
        return (f"cut short: {size} bytes where {said} {pages} pages of {page} bytes ({pages * page})"
                + (f", {len(lost)} of them not in the log either" if in_log else ""))
    if page >= 512 and size % page and (size // page + 1) not in in_log:
        return f"cut short: {size} bytes is not a whole number of {page}-byte pages"
    return None


WAL_MAGIC = (0x377F0682, 0x377F0683)


def _wal_checksum(data: bytes, order: str, s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum of `data` (a multiple of 8 bytes), continued from (s0, s1)."""
    words = struct.unpack(f"{'>' if order == 'big' else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def _wal_header(path: Path) -> tuple[bytes, str] | str | None:
    """The write-ahead log's 32-byte header and byte order; a problem when the header is torn (SQLite would
    silently drop every commit in it); None without a log."""
    wal = path.with_name(path.name + "-wal")
    try:
        with open(wal, "rb") as fh:
            header = fh.read(32)
    except OSError:
        return None
    if not header:
        return None
    if len(header) < 32:
        return f"its write-ahead log {wal.name} is torn ({len(header)}-byte header): its commits are lost"
    magic = int.from_bytes(header[:4], "big")
    if magic not in WAL_MAGIC:
        return f"its write-ahead log {wal.name} has a torn header (bad magic number): its commits are lost"
    order = "big" if magic & 1 else "little"
    if _wal_checksum(header[:24], order, 0, 0) != (int.from_bytes(header[24:28], "big"),
                                                  int.from_bytes(header[28:32], "big")):
        return f"its write-ahead log {wal.name} has a torn header (bad checksum): its commits are lost"
    return header, order


def _torn_wal(path: Path) -> str | None:
    """A write-ahead log beside the file whose header is torn (a driver killed while writing it)."""
    found = _wal_header(path)
    return found if isinstance(found, str) else None


def _wal_pages(path: Path, page: int) -> tuple[int, set[int]]:
    """What the write-ahead log adds to the database as SQLite reads it: the size in pages its last commit
    records (0: no commit) and the pages its frames up to that commit hold. A frame counts while its salts
    are the header's and the running checksum holds, as SQLite's own recovery counts it."""
    found = _wal_header(path)
    if not isinstance(found, tuple) or int.from_bytes(found[0][8:12], "big") != page:
        return 0, set()
    header, order = found
    sums = (int.from_bytes(header[24:28], "big"), int.from_bytes(header[28:32], "big"))
    size, held, pending = 0, set(), set()
    with open(path.with_name(path.name + "-wal"), "rb") as fh:
        fh.seek(32)
        while len(frame := fh.read(24 + page)) == 24 + page:
            if frame[8:16] != header[16:24]:
                break
            sums = _wal_checksum(frame[24:], order, *_wal_checksum(frame[:8], order, *sums))
            if sums != (int.from_bytes(frame[16:20], "big"), int.from_bytes(frame[20:24], "big")):
                break
            pending.add(int.from_bytes(frame[:4], "big"))
            if commit := int.from_bytes(frame[4:8], "big"):
                size, held = commit, held | pending
                pending = set()
    return size, held


def ledger_row_damage(path: Path) -> str | None:
    """The first ledger row that does not read as privbench wrote it, or None: a config or result that is
    not a JSON object (a changed byte inside a row passes SQLite's checks), a trial of a sweep the ledger
    does not list, or keys that differ when read through the primary key's index and past it. Read-only,
    like `sqlite_damage`."""
    try:
        with contextlib.closing(_sqlite_ro_connect(path)()) as conn:
            tables = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
            if not {"privbench_trials", "privbench_sweeps"} <= tables:
                return "missing the tables privbench_sweeps and privbench_trials (truncated, or not a privbench ledger)"
            sweeps_known = {r[0] for r in conn.execute("select name from privbench_sweeps")}
            scanned = set()
            for sweep, key, config, result in conn.execute(
                    "select sweep, trial_key, config_json, result_json from privbench_trials not indexed"):
                scanned.add((sweep, key))
                where = f"trial {key!r} of sweep {sweep!r}"
                if sweep not in sweeps_known:
                    return f"{where} belongs to no sweep the ledger lists"
                for column, text in (("config_json", config), ("result_json", result)):
                    if text is None and column == "result_json":
                        continue
                    try:
                        value = json.loads(text)
                    except (TypeError, ValueError):
                        return f"the {column} of {where} is not JSON"
                    if not isinstance(value, dict):
                        return f"the {column} of {where} is not a JSON object"
            indexed = set(conn.execute("select sweep, trial_key from privbench_trials order by sweep, trial_key"))
    except sqlite3.DatabaseError as e:
        return str(e)
    if indexed != scanned:
        odd = sorted(indexed ^ scanned)[0]
        return f"its index and its rows disagree (trial {odd[1]!r} of sweep {odd[0]!r})"
    return None


def engine_for(uri: str, *, read_only: bool = False) -> sa.Engine:
    path = sqlite_path(uri)
    if path is not None and read_only:
        return sa.create_engine("sqlite://", creator=_sqlite_ro_connect(path), poolclass=sa.pool.NullPool)
    eng = sa.create_engine(uri)
    if eng.dialect.name == "sqlite":
        write_like_the_driver(eng)
    return eng


def sqlite_writer_pragmas(dbapi_conn: Any, _: Any = None) -> None:
    """How the driver writes SQLite (the ledger and MLflow's `mlflow.db`): WAL, so that readers
    (leaderboard, UI) and writers do not block each other, and `synchronous = NORMAL`: a commit is
    in the write-ahead log (the OS has it) without an fsync. A killed driver loses nothing it
    committed; only an OS crash or power cut can roll back the last commits, which resume repairs like
    any interrupted write (a ledger row without its MLflow run is redone, a run without its ledger row
    is deleted and redone). An fsync per commit cost ~10 ms, and MLflow commits ~10 times per run."""
    if not isinstance(dbapi_conn, sqlite3.Connection):
        return
    dbapi_conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")  # concurrent readers wait
    dbapi_conn.execute("PRAGMA journal_mode = WAL")
    dbapi_conn.execute("PRAGMA synchronous = NORMAL")


def write_like_the_driver(engine: sa.Engine) -> None:
    """Give a SQLite engine the driver's write settings (`sqlite_writer_pragmas`): the ledger's, and MLflow's
    engine on `mlflow.db`. New connections get them from the listener; pooled ones opened before it (MLflow's
    migrations) are closed."""
    if not event.contains(engine, "connect", sqlite_writer_pragmas):
        event.listen(engine, "connect", sqlite_writer_pragmas)
    engine.dispose()



def _rekeyed(record: dict[str, Any], key: str) -> dict[str, Any]:
    """A stored result record under its trial's new key (top level and config)."""
    config = record.get("config")
    return record | {"trial_key": key} | ({"config": config | {"trial_key": key}} if isinstance(config, dict) else {})

class Ledger:
    def __init__(self, uri: str, *, create: bool = False, read_only: bool = False) -> None:
        self.uri = uri
        self.path = sqlite_path(uri)
        self.read_only = read_only and not create
        self.engine = engine_for(uri, read_only=self.read_only)
        self._columns: list[sa.Column] | None = None
        # What a damaged row's message tells the user to do; the store that opened the ledger names its
        # own recovery command (`storage.store.damaged`).
        self.damaged: Callable[[str], StoreError] = lambda problem: StoreError(
            f"store {self.where}: {problem}; restore the ledger from a backup")
        if create:
            self.migrate()

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else mask_uri(self.uri)

    def migrate(self) -> None:
        """Create the tables, and add the columns that older ledgers lack (call under `lock()`)."""
        metadata.create_all(self.engine)
        inspector = sa.inspect(self.engine)
        for table in (sweeps, trials):
            have = {c["name"] for c in inspector.get_columns(table.name)}
            for column in table.columns:
                if column.name not in have:
                    ddl = column.type.compile(dialect=self.engine.dialect)
                    with self.engine.begin() as c:
                        c.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {ddl}"))
        self._columns = None

    def has_schema(self) -> bool:
        return sa.inspect(self.engine).has_table("privbench_trials")

    def check(self) -> None:
        """Raise a one-line StoreError when the ledger is empty, truncated or not a privbench ledger (damaged
        pages are `sqlite_damage`'s, checked by the store, which knows how to recover each of its files)."""
        if self.path is not None and self.path.is_dir():
            raise StoreError(f"store {self.path} is a folder, not a ledger file; move it aside")
        if self.path is not None and self.path.exists() and self.path.stat().st_size == 0:
            raise StoreError(f"store {self.path} is empty (0 bytes: truncated?); restore it from a backup "
                             "or move the store aside")
        inspector = sa.inspect(self.engine)
        missing = [t for t in ("privbench_sweeps", "privbench_trials") if not inspector.has_table(t)]
        if missing:
            raise StoreError(f"store {self.where} is missing the tables {', '.join(missing)} "
                             "(truncated, or not a privbench store)")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise store creation and sweep opening between drivers: a file lock next to a SQLite
        ledger, an advisory lock on PostgreSQL."""
        if self.path is not None:
            with file_lock(self.path):
                yield
        elif self.engine.dialect.name == "postgresql":
            with self.engine.connect() as c:
                c.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": PG_LOCK_KEY})
                c.commit()
                try:
                    yield
                finally:
                    c.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": PG_LOCK_KEY})
                    c.commit()
        else:
            yield

    # the database's clock -------------------------------------------------------------------------
    def now_sql(self) -> Any:
        """The database's clock in seconds since the epoch, as a SQL expression: what every lease is
        written and compared with, so that drivers whose own clocks disagree agree on a lease."""
        if self.engine.dialect.name == "postgresql":
            return sa.cast(sa.func.extract("epoch", sa.func.clock_timestamp()), sa.Float)
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float)

    def now(self) -> float:
        with self.engine.connect() as c:
            return float(c.execute(sa.select(self.now_sql())).scalar())

    # the ledger's own identity ------------------------------------------------------------------
    def meta_value(self, key: str) -> str | None:
        with self.engine.connect() as c:
            return c.execute(sa.select(meta.c.value).where(meta.c.key == key)).scalar()

    def ensure_meta(self, key: str, default: str) -> str:
        """The recorded value, or `default` recorded now (call under `lock()`)."""
        value = self.meta_value(key)
        if value is None:
            with self.engine.begin() as c:
                c.execute(meta.insert().values(key=key, value=default))
            value = default
        return value

    def ledger_id(self) -> str:
        return self.ensure_meta("ledger_id", uuid.uuid4().hex)

    # sweeps -------------------------------------------------------------------------------------
    def create_sweep(self, name: str, sweep_id: str, experiment_id: str, grid_yaml: str) -> None:
        now = self.now_sql()
        with self.engine.begin() as c:
            c.execute(sweeps.insert().values(name=name, experiment_id=experiment_id, grid_yaml=grid_yaml,
                                             sweep_id=sweep_id, created_at=now, updated_at=now))

    def update_sweep(self, name: str, **values: Any) -> None:
        with self.engine.begin() as c:
            c.execute(sweeps.update().where(sweeps.c.name == name).values(updated_at=self.now_sql(), **values))

    def sweep(self, name: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            row = c.execute(sa.select(sweeps).where(sweeps.c.name == name)).mappings().first()
        return dict(row) if row else None

    def sweep_names(self) -> list[str]:
        with self.engine.connect() as c:
            return [r[0] for r in c.execute(sa.select(sweeps.c.name).order_by(sweeps.c.updated_at.desc()))]

    # drivers ------------------------------------------------------------------------------------
    def register_driver(self, sweep: str, owner: str, grid_key: str, count: int) -> list[tuple[str, int]]:
        """Register `owner` as running `sweep` with the grid whose trial keys hash to `grid_key` (call under
        `lock()`), unless live drivers run the sweep with another grid: then nothing is written and those
        drivers are returned as (owner, their grid's trial count). Dead and lapsed registrations go."""
        now = self.now()
        with self.engine.begin() as c:
            rows = c.execute(sa.select(drivers).where(drivers.c.sweep == sweep)).all()
            gone = [r.owner for r in rows if r.expires < now or owner_dead(r.owner)]
            if gone:
                c.execute(drivers.delete().where((drivers.c.sweep == sweep) & drivers.c.owner.in_(gone)))
            others = [(r.owner, r.trials) for r in rows
                      if r.owner not in gone and r.owner != owner and r.grid_key != grid_key]
            if others:
                return others
            c.execute(drivers.delete().where((drivers.c.sweep == sweep) & (drivers.c.owner == owner)))
            c.execute(drivers.insert().values(sweep=sweep, owner=owner, grid_key=grid_key, trials=count,
                                              expires=now + lease_seconds()))
        return []

    # trials -------------------------------------------------------------------------------------
    def sync_trials(self, sweep: str, configs: Iterable[Mapping[str, Any]],
                    key_of: Callable[[dict[str, Any]], str] | None = None, *,
                    current: Collection[str] | None = None) -> tuple[list[str], dict[str, str]]:
        """Make the sweep's trials those of its current grid: insert new ones (pending), mark known ones
        that left the grid `superseded` (an edited grid must not mix old settings into the leaderboard as
        extra seeds, nor retry them), and give a trial that came back the status its result says.

        `key_of` re-derives a known trial's key from its stored config: a row whose key was made by an
        older formula is renamed rather than superseded. Returns the MLflow run ids that became
        superseded, and {run_id: new key} of renamed trials. Call under `lock()`.

        `current`: the grid's trial keys, given when `configs` is a stream made once (a grid of 10^6 trials):
        the known rows are read by key and status only, their JSON only for the few that change, the new rows
        are inserted in batches as `configs` makes them, and `configs` is not read at all when every key is
        known already.
        """
        now = self.now()
        if current is None:
            configs = list(configs)
            current = {cfg["trial_key"] for cfg in configs}
        superseded: list[str] = []
        renamed: dict[str, str] = {}
        with self.engine.begin() as c:
            known = {r.trial_key: (r.status, r.run_id) for r in c.execute(
                sa.select(trials.c.trial_key, trials.c.status, trials.c.run_id).where(trials.c.sweep == sweep))}

            def stored(key: str) -> Any:
                return c.execute(sa.select(trials.c.config_json, trials.c.result_json).where(
                    (trials.c.sweep == sweep) & (trials.c.trial_key == key))).one()

            for key, (_, run_id) in list(known.items()):
                if key in current or key_of is None:
                    continue
                row = stored(key)
                config = json.loads(row.config_json)
                new = key_of(config)
                if new in current and new not in known:  # the key inside the config and the record follows
                    result = json.loads(row.result_json) if row.result_json else None
                    c.execute(trials.update().where((trials.c.sweep == sweep) & (trials.c.trial_key == key))
                              .values(trial_key=new, config_json=json.dumps(config | {"trial_key": new}),
                                      result_json=None if result is None else json.dumps(_rekeyed(result, new))))
                    known[new] = known.pop(key)
                    renamed |= {run_id: new} if run_id else {}
            for key, (status, run_id) in known.items():
                if key not in current and status != "superseded":
                    status = "superseded"
                    superseded += [run_id] if run_id else []
                elif key in current and status == "superseded":
                    result_json = stored(key).result_json
                    status = json.loads(result_json)["status"] if result_json else "pending"
                else:
                    continue
                c.execute(trials.update().where((trials.c.sweep == sweep) & (trials.c.trial_key == key))
                          .values(status=status, updated_at=now))
            if sum(1 for key in known if key in current) < len(current):
                rows: list[dict[str, Any]] = []
                for cfg in configs:
                    if cfg["trial_key"] in known:
                        continue
                    rows.append(dict(sweep=sweep, trial_key=cfg["trial_key"], status="pending", attempts=0,
                                     dataset=cfg["dataset"], model=cfg["model"], mechanism=cfg["mechanism"],
                                     epsilon=cfg.get("epsilon"), seed=cfg["seed"], config_json=json.dumps(cfg),
                                     updated_at=now))
                    if len(rows) >= INSERT_BATCH:
                        c.execute(trials.insert(), rows)
                        rows = []
                if rows:
                    c.execute(trials.insert(), rows)
        return superseded, renamed

    def open_leases(self, sweep: str) -> dict[str, tuple[str | None, float | None]]:
        """{trial key: (lease owner, lease expiry)} of the sweep's pending and running trials (three columns of
        those rows only: a driver watching other drivers polls this)."""
        with self.engine.connect() as c:
            return {r[0]: (r[1], r[2]) for r in c.execute(
                sa.select(trials.c.trial_key, trials.c.lease_owner, trials.c.lease_expires).where(
                    (trials.c.sweep == sweep) & trials.c.status.in_(("pending", "running"))))}

    def finished_keys(self, sweep: str) -> set[str]:
        """The keys of the sweep's finished trials (read as keys alone: a large sweep's rows are not loaded)."""
        with self.engine.connect() as c:
            return {r[0] for r in c.execute(sa.select(trials.c.trial_key).where(
                (trials.c.sweep == sweep) & (trials.c.status == "finished")))}

    def unfinished(self, sweep: str, keys: Sequence[str], statuses: Sequence[str] | None = None) -> set[str]:
        """Which of `keys` (at most `KEY_BATCH` at a time) are trials of the sweep not finished (pending, running,
        failed; or of these `statuses`): a large grid's driver asks this batch by batch instead of reading every
        row (`pending`)."""
        status = trials.c.status.not_in(DONE) if statuses is None else trials.c.status.in_(list(statuses))
        with self.engine.connect() as c:
            return {r[0] for r in c.execute(sa.select(trials.c.trial_key).where(
                (trials.c.sweep == sweep) & trials.c.trial_key.in_(list(keys)) & status))}

    def restore(self, sweep: str, record: Mapping[str, Any], run_id: str, status: str) -> None:
        """A trial row rebuilt from its MLflow run (`storage.recovery`): the record as the run stored it."""
        cfg = record.get("config") or {}
        with self.engine.begin() as c:
            c.execute(trials.insert().values(
                sweep=sweep, trial_key=record["trial_key"], status=status, run_id=run_id, attempts=1,
                dataset=cfg.get("dataset"), model=cfg.get("model"), mechanism=cfg.get("mechanism"),
                epsilon=cfg.get("epsilon"), seed=cfg.get("seed"), config_json=json.dumps(cfg),
                result_json=json.dumps(record), error=record.get("error"), updated_at=self.now_sql()))

    # leases -------------------------------------------------------------------------------------
    def clear_dead_leases(self, sweep: str) -> int:
        """Drop the leases of drivers on this host whose process is gone (no need to wait for expiry)."""
        with self.engine.connect() as c:
            owners = [r[0] for r in c.execute(sa.select(trials.c.lease_owner).distinct()
                                              .where((trials.c.sweep == sweep) & trials.c.lease_owner.is_not(None)))]
        dead = [o for o in owners if owner_dead(o)]
        if dead:
            with self.engine.begin() as c:
                c.execute(trials.update().where((trials.c.sweep == sweep) & trials.c.lease_owner.in_(dead))
                          .values(lease_owner=None, lease_expires=None))
        return len(dead)

    def claim(self, sweep: str, trial_key: str, owner: str, since: float) -> bool:
        """Lease one trial for `owner` unless it is done, leased by a live driver, or failed after
        `since` (another driver just tried it; the database's time). Atomic: of two drivers, one wins."""
        now = self.now_sql()
        free = trials.c.lease_owner.is_(None) | (trials.c.lease_owner == owner) | (trials.c.lease_expires < now)
        with self.engine.begin() as c:
            result = c.execute(
                trials.update()
                .where((trials.c.sweep == sweep) & (trials.c.trial_key == trial_key) & free
                       & trials.c.status.not_in(DONE)
                       & ~((trials.c.status == "failed") & (trials.c.updated_at > since)))
                .values(status="running", attempts=trials.c.attempts + 1, lease_owner=owner,
                        lease_expires=now + lease_seconds(), updated_at=now))
        return result.rowcount == 1

    def renew(self, sweep: str, owner: str, trial_key: str | None = None) -> int:
        """Heartbeat: push back the expiry of `owner`'s leases (one trial's, or all, and then its driver
        registration too). Returns how many trial leases."""
        cond = (trials.c.sweep == sweep) & (trials.c.lease_owner == owner)
        if trial_key is not None:
            cond &= trials.c.trial_key == trial_key
        expires = self.now_sql() + lease_seconds()
        with self.engine.begin() as c:
            if trial_key is None:
                c.execute(drivers.update().where((drivers.c.sweep == sweep) & (drivers.c.owner == owner))
                          .values(expires=expires))
            return c.execute(trials.update().where(cond).values(lease_expires=expires)).rowcount

    def release(self, sweep: str, owner: str | None) -> None:
        """Give back every lease of `owner` and its driver registration (a driver that stops early lets
        others go on at once); with None, every lease of the sweep (`--steal-leases`: its drivers are
        known to be dead)."""
        held = trials.c.lease_owner == owner if owner is not None else trials.c.lease_owner.is_not(None)
        # a trial given back unrecorded is not "running": it waits for the next driver (its earlier result,
        # a failure, if it has one)
        back = sa.case((trials.c.status != "running", trials.c.status),
                       (trials.c.result_json.is_(None), "pending"), else_="failed")
        with self.engine.begin() as c:
            c.execute(trials.update().where((trials.c.sweep == sweep) & held)
                      .values(status=back, lease_owner=None, lease_expires=None))
            if owner is not None:
                c.execute(drivers.delete().where((drivers.c.sweep == sweep) & (drivers.c.owner == owner)))

    def leases(self, sweep: str) -> list[tuple[str, float]]:
        """(owner, seconds until it lapses) of the sweep's live leases (what keeps a driver from running
        those trials), measured on the database's clock."""
        now = self.now_sql()
        with self.engine.connect() as c:
            return [(r[0], float(r[1])) for r in c.execute(
                sa.select(trials.c.lease_owner, trials.c.lease_expires - now).where(
                    (trials.c.sweep == sweep) & trials.c.lease_owner.is_not(None) & (trials.c.lease_expires >= now)))]

    def leased_by_others(self, sweep: str, owner: str | None) -> set[str]:
        now = self.now_sql()
        with self.engine.connect() as c:
            return {r[0] for r in c.execute(
                sa.select(trials.c.trial_key).where(
                    (trials.c.sweep == sweep) & trials.c.lease_owner.is_not(None)
                    & (trials.c.lease_owner != (owner or "")) & (trials.c.lease_expires >= now)))}

    def record(self, record: Mapping[str, Any], run_id: str | None, owner: str | None = None, *,
               unless_finished: bool = False) -> bool:
        """The trial's final row (and its lease given back). With `owner`, only while it holds the lease;
        with `unless_finished`, only while the row is not finished (a run adopted by reconciliation)."""
        cond = (trials.c.sweep == record["sweep"]) & (trials.c.trial_key == record["trial_key"])
        if owner is not None:
            cond &= trials.c.lease_owner == owner
        if unless_finished:
            cond &= trials.c.status.not_in(DONE)
        with self.engine.begin() as c:
            result = c.execute(trials.update().where(cond)
                               .values(status=record["status"], run_id=run_id, result_json=json.dumps(record),
                                       error=record.get("error"), updated_at=self.now_sql(), lease_owner=None,
                                       lease_expires=None, phase_json=None))
        return result.rowcount == 1

    def set_run_id(self, sweep: str, trial_key: str, run_id: str) -> None:
        """Point a recorded trial at its MLflow run again (the run was rewritten from the ledger's record)."""
        with self.engine.begin() as c:
            c.execute(trials.update().where((trials.c.sweep == sweep) & (trials.c.trial_key == trial_key))
                      .values(run_id=run_id))

    def repoint(self, experiments: Mapping[str, str], runs: Mapping[tuple[str, str], str]) -> None:
        """Point sweeps at new MLflow experiments and trials at new runs, all in one transaction (a rebuilt
        mirror: the ledger never names runs of two different MLflow files)."""
        now = self.now_sql()
        with self.engine.begin() as c:
            for name, experiment_id in experiments.items():
                c.execute(sweeps.update().where(sweeps.c.name == name)
                          .values(experiment_id=experiment_id, updated_at=now))
            for (sweep, key), run_id in runs.items():
                c.execute(trials.update().where((trials.c.sweep == sweep) & (trials.c.trial_key == key))
                          .values(run_id=run_id))

    def save_phase(self, sweep: str, trial_key: str, owner: str, phase_json: str) -> bool:
        """Keep a trial's accelerator-phase output while `owner` holds its lease (False: it does not)."""
        cond = (trials.c.sweep == sweep) & (trials.c.trial_key == trial_key) & (trials.c.lease_owner == owner)
        with self.engine.begin() as c:
            return c.execute(trials.update().where(cond).values(phase_json=phase_json)).rowcount == 1

    def phase(self, sweep: str, trial_key: str) -> str | None:
        """The stored accelerator-phase output of an unrecorded trial, if any."""
        with self.engine.connect() as c:
            return c.execute(sa.select(trials.c.phase_json).where(
                (trials.c.sweep == sweep) & (trials.c.trial_key == trial_key))).scalar()

    def run_state(self, sweep: str, trial_key: str) -> tuple[str | None, int]:
        """The trial's recorded MLflow run (None if none) and how many times it was claimed."""
        with self.engine.connect() as c:
            row = c.execute(sa.select(trials.c.run_id, trials.c.attempts).where(
                (trials.c.sweep == sweep) & (trials.c.trial_key == trial_key))).first()
        return (row[0], row[1] or 0) if row else (None, 0)

    def loads(self, row: Mapping[str, Any], column: str) -> Any:
        """A JSON column of a trial row; a damaged one is a one-line StoreError naming the trial."""
        try:
            return json.loads(row[column])
        except (TypeError, ValueError):
            raise self.damaged(f"the {column} of trial {row['trial_key']!r} of sweep {row['sweep']!r} "
                               "is not JSON") from None

    def _present(self) -> list[sa.Column]:
        """The trial columns this ledger has: a store written by an older privbench lacks the newer ones
        until a driver migrates it, and a read command (read-only) must still read it."""
        if self._columns is None:
            have = {c["name"] for c in sa.inspect(self.engine).get_columns(trials.name)}
            self._columns = [c for c in trials.columns if c.name in have]
        return self._columns

    def trials(self, sweep: str, *, recorded: bool = False, keys: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The sweep's trial rows in the ledger's order; `recorded`: only those with an MLflow run; `keys`: only
        these (what reconciling a large sweep reads, rather than every row)."""
        cond = trials.c.sweep == sweep
        if recorded:
            cond &= trials.c.run_id.is_not(None)
        if keys is not None:
            found: list[dict[str, Any]] = []
            for i in range(0, len(keys), KEY_BATCH):
                found += self._rows(cond & trials.c.trial_key.in_(list(keys[i:i + KEY_BATCH])))
            return found
        return self._rows(cond)

    def _rows(self, cond: Any) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(*self._present()).where(cond)
                             .order_by(trials.c.dataset, trials.c.model, trials.c.mechanism,
                                       trials.c.epsilon, trials.c.seed)).mappings().all()
        return [dict(r) for r in rows]

    def add_driver_run(self, sweep: str, owner: str, started_at: float, wall_s: float, timing_json: str) -> None:
        with self.engine.begin() as c:
            c.execute(driver_runs.delete().where((driver_runs.c.sweep == sweep) & (driver_runs.c.owner == owner)))
            c.execute(driver_runs.insert().values(sweep=sweep, owner=owner, started_at=started_at, wall_s=wall_s,
                                                  timing_json=timing_json))

    def driver_runs(self, sweep: str) -> list[dict[str, Any]]:
        """The sweep's driver runs, oldest first ([] in a ledger made before the table)."""
        if not sa.inspect(self.engine).has_table(driver_runs.name):
            return []
        with self.engine.connect() as c:
            rows = c.execute(sa.select(driver_runs).where(driver_runs.c.sweep == sweep)
                             .order_by(driver_runs.c.started_at)).mappings().all()
        return [dict(r) for r in rows]

    def calibration(self, key: str) -> bytes | None:
        if not sa.inspect(self.engine).has_table(calibrations.name):
            return None
        with self.engine.connect() as c:
            return c.execute(sa.select(calibrations.c.plan_blob).where(calibrations.c.key == key)).scalar()

    def add_calibration(self, key: str, view_json: str, blob: bytes) -> None:
        with self.engine.begin() as c:
            c.execute(calibrations.delete().where(calibrations.c.key == key))
            c.execute(calibrations.insert().values(key=key, created_at=time.time(), view_json=view_json,
                                                   plan_blob=blob))

    def status_counts(self, sweep: str) -> dict[str, int]:
        with self.engine.connect() as c:
            rows = c.execute(sa.select(trials.c.status, sa.func.count()).where(trials.c.sweep == sweep)
                             .group_by(trials.c.status)).all()
        return {s: n for s, n in rows}


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """The lock that serialises drivers opening a SQLite store: `flock` on `<ledger>.lock` beside it (the
    ledger itself may be damaged or missing: rebuilding it takes the same lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

