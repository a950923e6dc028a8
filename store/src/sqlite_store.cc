// The SQLite backend. One connection per store, WAL mode so readers never wait
// for writers, BEGIN IMMEDIATE for every read-modify-write so two processes
// never deadlock upgrading read locks; see docs/metadata-store.md for the
// tables.
//
// Kept whole at about 800 lines: its one job is the RawStore interface over
// one SQLite database (open and schema checks, the transactions, the events
// table the watchers poll, heartbeat expiry). Every method is a short
// transaction around the same few prepared statements and the same busy
// handling; apart, they would share all of that through a header for no gain
// in reading.

#include "sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "metadata_store_internal.h"

namespace granary {

namespace sqlite_internal {
void DbDeleter::operator()(sqlite3* db) const { sqlite3_close_v2(db); }
}  // namespace sqlite_internal

namespace {

using sqlite_internal::DbPtr;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using store_internal::Backoff;
using store_internal::FormatDuration;

// 'GRNY': marks the file as a Granary store, so a stray SQLite file is refused
// instead of getting our tables added to it.
constexpr int kApplicationId = 0x47524e59;
constexpr int kSchemaVersion = 1;
constexpr int kMaxEventsPerBatch = 1024;

// The schema (kept verbatim in docs/metadata-store.md).
constexpr const char* kSchema = R"sql(
CREATE TABLE datasets (
  name       TEXT PRIMARY KEY,
  revision   INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  record     TEXT NOT NULL
);
CREATE TABLE manifests (
  id    TEXT PRIMARY KEY,
  bytes BLOB NOT NULL
);
CREATE TABLE nodes (
  id         TEXT PRIMARY KEY,
  pool       TEXT NOT NULL,
  identity   TEXT NOT NULL,
  record     TEXT NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX nodes_by_expiry ON nodes (expires_at);
CREATE TABLE progress (
  dataset TEXT NOT NULL,
  node    TEXT NOT NULL,
  record  TEXT NOT NULL,
  PRIMARY KEY (dataset, node)
);
CREATE TABLE plans (
  dataset TEXT NOT NULL,
  plan_id TEXT NOT NULL,
  record  TEXT NOT NULL,
  PRIMARY KEY (dataset, plan_id)
);
CREATE TABLE events (
  seq   INTEGER PRIMARY KEY AUTOINCREMENT,
  kind  TEXT NOT NULL,
  name  TEXT NOT NULL,
  at_ms INTEGER NOT NULL
);
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
INSERT INTO meta (key, value) VALUES ('events_pruned_through', 0);
PRAGMA application_id = 1196576345;
PRAGMA user_version = 1;
)sql";

static_assert(kApplicationId == 1196576345, "keep kSchema's application_id in step");

// A connection plus what its error messages need to name.
class Session {
 public:
  Session(sqlite3* db, const SqliteConfig& config) : db_(db), config_(config) {}

  sqlite3* db() const { return db_; }
  const SqliteConfig& config() const { return config_; }

  Status Error(int rc, std::string_view what) const {
    std::string m = std::string(what) + " on " + config_.display_url + ": " +
                    (db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc)) + " [SQLite " +
                    std::to_string(db_ != nullptr ? sqlite3_extended_errcode(db_) : rc) + "]";
    switch (rc & 0xff) {
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        return Status::Unavailable(
            m + " (still locked after the busy timeout of " + FormatDuration(config_.retry_budget) +
            "); another process holds the database: retry later, find it with 'fuser " +
            config_.path + "', or raise retry_ms in the URL");
      case SQLITE_CORRUPT:
      case SQLITE_NOTADB:
        return Status::Corruption(m + "; " + config_.path +
                                  " is damaged or not a SQLite database: move it aside (Granary "
                                  "creates a new, empty store on the next open) or restore it "
                                  "from a backup");
      case SQLITE_FULL:
        return Status::ResourceExhausted(m + "; free space on the file system holding " +
                                         config_.path);
      case SQLITE_READONLY:
      case SQLITE_PERM:
      case SQLITE_AUTH:
        return Status::PermissionDenied(m + "; make " + config_.path +
                                        " and its directory writable by this user");
      case SQLITE_CANTOPEN:
        return Status::IoError(m + "; check that the directory of " + config_.path +
                               " exists and is writable by this user");
      case SQLITE_IOERR:
        return Status::IoError(m + "; check the disk holding " + config_.path);
      case SQLITE_TOOBIG:
        return Status::InvalidArgument(m + "; the value is larger than SQLite accepts");
      default:
        return Status::Internal(m);
    }
  }

  Status Exec(const char* sql, std::string_view what) const {
    int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? Status::Ok() : Error(rc, what);
  }

 private:
  sqlite3* db_;
  const SqliteConfig& config_;
};

class Statement {
 public:
  static Result<Statement> Prepare(const Session& session, std::string_view sql,
                                   std::string_view what) {
    sqlite3_stmt* stmt = nullptr;
    int rc =
        sqlite3_prepare_v2(session.db(), sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
    if (rc != SQLITE_OK) return session.Error(rc, what);
    return Statement(session, stmt, what);
  }
  Statement(Statement&& o) noexcept
      : session_(o.session_),
        stmt_(std::exchange(o.stmt_, nullptr)),
        what_(o.what_),
        bind_rc_(o.bind_rc_) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  Statement& Bind(int index, std::string_view text) {
    // An empty view may have a null data(), which SQLite would bind as NULL.
    Check(sqlite3_bind_text64(stmt_, index, text.empty() ? "" : text.data(), text.size(),
                              SQLITE_TRANSIENT, SQLITE_UTF8));
    return *this;
  }
  Statement& BindBlob(int index, std::string_view bytes) {
    // A zero-length blob must still be a blob, not NULL: give it a valid pointer.
    static const char kEmpty = 0;
    Check(sqlite3_bind_blob64(stmt_, index, bytes.empty() ? &kEmpty : bytes.data(), bytes.size(),
                              SQLITE_TRANSIENT));
    return *this;
  }
  Statement& Bind(int index, int64_t value) {
    Check(sqlite3_bind_int64(stmt_, index, value));
    return *this;
  }

  // true: a row is ready; false: done.
  Result<bool> Step() {
    if (bind_rc_ != SQLITE_OK) return session_.Error(bind_rc_, what_);
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return session_.Error(rc, what_);
  }
  // Steps a statement that returns no rows.
  Status Run() {
    GRANARY_ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return Status::Ok();
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const {
    const auto* p = sqlite3_column_blob(stmt_, col);
    auto n = static_cast<size_t>(sqlite3_column_bytes(stmt_, col));
    return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
  }

 private:
  Statement(const Session& session, sqlite3_stmt* stmt, std::string_view what)
      : session_(session), stmt_(stmt), what_(what) {}
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  const Session& session_;
  sqlite3_stmt* stmt_;
  std::string_view what_;  // outlives the statement: the caller's message
  int bind_rc_ = SQLITE_OK;
};

// Rolls back unless committed.
class Transaction {
 public:
  static Result<Transaction> Begin(const Session& session, bool write, std::string_view what) {
    GRANARY_RETURN_IF_ERROR(session.Exec(write ? "BEGIN IMMEDIATE" : "BEGIN", what));
    return Transaction(session, what);
  }
  Transaction(Transaction&& o) noexcept
      : session_(o.session_), what_(o.what_), open_(std::exchange(o.open_, false)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction() {
    if (open_) sqlite3_exec(session_.db(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Status Commit() {
    GRANARY_RETURN_IF_ERROR(session_.Exec("COMMIT", what_));
    open_ = false;
    return Status::Ok();
  }

 private:
  Transaction(const Session& session, std::string_view what) : session_(session), what_(what) {}
  const Session& session_;
  std::string_view what_;
  bool open_ = true;
};

Result<DbPtr> OpenConnectionOnce(const SqliteConfig& config, bool create, std::string_view what) {
  // A clearer message than SQLite's "unable to open database file".
  std::string dir = config.path.substr(0, config.path.rfind('/'));
  struct stat st {};
  if (!dir.empty() && ::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                  std::string(what) + " on " + config.display_url + ": directory " + dir +
                      " is not accessible (" + std::strerror(err) +
                      "); create it, or fix the path in the URL");
  }
  if (create) {
    // SQLite would create the file 0644 (less the umask), letting every user
    // on the host read the store (dataset names, owners, manifest ids). Made
    // here 0600 instead (its -wal and -shm files take the same mode); an
    // existing file (or a link to one an admin made) is left as it is.
    int fd = ::open(config.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
    } else if (errno != EEXIST) {
      int err = errno;
      return Status(err == EACCES ? StatusCode::kPermissionDenied : StatusCode::kIoError,
                    std::string(what) + " on " + config.display_url + ": create " + config.path +
                        ": " + std::strerror(err) +
                        "; make its directory writable by this user, or fix the path in the URL");
    }
  }
  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
  int rc = sqlite3_open_v2(config.path.c_str(), &raw, flags, nullptr);
  DbPtr db(raw);
  if (rc != SQLITE_OK) return Session(db.get(), config).Error(rc, what);
  sqlite3_busy_timeout(db.get(), static_cast<int>(config.retry_budget.count()));
  // The first statement reads the header: a file that is not a database fails here.
  Session session(db.get(), config);
  GRANARY_ASSIGN_OR_RETURN(Statement wal,
                           Statement::Prepare(session, "PRAGMA journal_mode = WAL", what));
  GRANARY_ASSIGN_OR_RETURN(bool row, wal.Step());
  if (row && wal.Text(0) != "wal") {
    GetLogger("store")->warn(
        "{}: journal mode is '{}', not WAL (a network file system?); readers will wait for "
        "writers",
        config.display_url, wal.Text(0));
  }
  // FULL: a write acknowledged to the caller survives power loss, not just a
  // crash of this process.
  GRANARY_RETURN_IF_ERROR(session.Exec("PRAGMA synchronous = FULL", what));
  return db;
}

Status InitSchema(const Session& session, std::string_view what);

// Opens a connection (and, for the store, checks or creates the schema),
// retrying on "database is locked" until the busy timeout is spent. Needed
// because switching a new file to WAL upgrades a read lock: when two processes
// do it at once, SQLite answers one of them SQLITE_BUSY at once instead of
// calling the busy handler (it would deadlock), and the answer is to retry.
Result<DbPtr> OpenConnection(const SqliteConfig& config, bool create, bool init_schema,
                             std::string_view what) {
  // Short pauses: the lock is held for the few milliseconds of a WAL switch
  // or a schema creation, not for an outage.
  Backoff backoff(config.retry_budget, milliseconds(5), milliseconds(100));
  Status status;
  do {
    auto db = OpenConnectionOnce(config, create, what);
    status = db.status();
    if (db.ok() && init_schema) status = InitSchema(Session(db->get(), config), what);
    if (status.ok()) return db;
    if (status.code() != StatusCode::kUnavailable) return status;
  } while (backoff.Wait());
  return status;
}

Status InitSchema(const Session& session, std::string_view what) {
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  int64_t app_id = 0;
  int64_t version = 0;
  int64_t tables = 0;
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s, Statement::Prepare(session,
                                        "SELECT (SELECT application_id FROM pragma_application_id),"
                                        " (SELECT user_version FROM pragma_user_version),"
                                        " (SELECT count(*) FROM sqlite_schema)",
                                        what));
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return Status::Internal(std::string(what) + ": schema query returned no row");
    app_id = s.Int(0);
    version = s.Int(1);
    tables = s.Int(2);
  }
  const SqliteConfig& config = session.config();
  if (app_id == 0 && version == 0 && tables == 0) {
    GRANARY_RETURN_IF_ERROR(session.Exec(kSchema, what));
    GetLogger("store")->info("created metadata store {}", config.display_url);
    return tx.Commit();
  }
  if (app_id != kApplicationId) {
    return Status::FailedPrecondition(std::string(what) + " on " + config.display_url + ": " +
                                      config.path +
                                      " is a SQLite database but not a Granary store; point the "
                                      "URL at another file");
  }
  if (version != kSchemaVersion) {
    return Status::VersionMismatch(
        std::string(what) + " on " + config.display_url + ": the store has schema version " +
        std::to_string(version) + " and this build reads version " +
        std::to_string(kSchemaVersion) + "; run a Granary build that matches the store");
  }
  return tx.Commit();
}

// The membership version (MetadataStore::NodesVersion), in meta; a store
// made before it existed starts at 0 (no row).
Status BumpNodesVersion(const Session& session, std::string_view what) {
  GRANARY_ASSIGN_OR_RETURN(
      Statement s, Statement::Prepare(session,
                                      "INSERT INTO meta (key, value) VALUES ('nodes_version', 1) "
                                      "ON CONFLICT (key) DO UPDATE SET value = value + 1",
                                      what));
  return s.Run();
}

Status Publish(const Session& session, const Event& event, std::string_view what) {
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s, Statement::Prepare(
                         session, "INSERT INTO events (kind, name, at_ms) VALUES (?, ?, ?)", what));
    GRANARY_RETURN_IF_ERROR(s.Bind(1, EventKindName(event.kind))
                                .Bind(2, event.name)
                                .Bind(3, session.config().clock->NowMillis())
                                .Run());
  }
  const int64_t cutoff =
      sqlite3_last_insert_rowid(session.db()) - static_cast<int64_t>(session.config().event_rows);
  if (cutoff <= 0) return Status::Ok();
  GRANARY_ASSIGN_OR_RETURN(Statement prune,
                           Statement::Prepare(session, "DELETE FROM events WHERE seq <= ?", what));
  GRANARY_RETURN_IF_ERROR(prune.Bind(1, cutoff).Run());
  if (sqlite3_changes(session.db()) == 0) return Status::Ok();
  // Watchers compare this with the last seq they saw to know they missed some.
  GRANARY_ASSIGN_OR_RETURN(Statement mark,
                           Statement::Prepare(session,
                                              "UPDATE meta SET value = max(value, ?) WHERE key = "
                                              "'events_pruned_through'",
                                              what));
  return mark.Bind(1, cutoff).Run();
}

Result<bool> DatasetExists(const Session& session, std::string_view name, std::string_view what) {
  GRANARY_ASSIGN_OR_RETURN(
      Statement s, Statement::Prepare(session, "SELECT 1 FROM datasets WHERE name = ?", what));
  return s.Bind(1, name).Step();
}

class SqliteWatcher final : public MetadataStore::Watcher {
 public:
  SqliteWatcher(SqliteConfig config, DbPtr db, int64_t last_seq)
      : config_(std::move(config)), db_(std::move(db)), last_seq_(last_seq) {}

  Result<std::vector<Event>> Next(milliseconds timeout) override {
    const auto deadline = steady_clock::now() + timeout;
    while (true) {
      GRANARY_ASSIGN_OR_RETURN(std::vector<Event> events, Poll());
      if (!events.empty()) return events;
      auto now = steady_clock::now();
      if (now >= deadline) return events;
      std::this_thread::sleep_for(
          std::min<steady_clock::duration>(config_.poll_interval, deadline - now));
    }
  }

 private:
  Result<std::vector<Event>> Poll() {
    const std::string what = "watch events";
    Session session(db_.get(), config_);
    std::vector<Event> events;
    // One read transaction: the prune mark and the rows are one snapshot.
    GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, false, what));
    {
      GRANARY_ASSIGN_OR_RETURN(
          Statement s,
          Statement::Prepare(session, "SELECT value FROM meta WHERE key = 'events_pruned_through'",
                             what));
      GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
      if (row && s.Int(0) > last_seq_) {
        events.push_back(Event{EventKind::kResync, ""});
        last_seq_ = s.Int(0);
      }
    }
    GRANARY_ASSIGN_OR_RETURN(Statement s,
                             Statement::Prepare(session,
                                                "SELECT seq, kind, name FROM events WHERE seq > ? "
                                                "ORDER BY seq LIMIT ?",
                                                what));
    s.Bind(1, last_seq_).Bind(2, int64_t{kMaxEventsPerBatch});
    while (true) {
      GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      last_seq_ = s.Int(0);
      std::string kind = s.Text(1);
      bool known = false;
      for (EventKind k :
           {EventKind::kDataset, EventKind::kNode, EventKind::kProgress, EventKind::kPlan}) {
        if (EventKindName(k) == kind) {
          events.push_back(Event{k, s.Text(2)});
          known = true;
        }
      }
      if (!known && !warned_unknown_) {
        GetLogger("store")->warn("ignoring events of unknown kind '{}' in {}", kind,
                                 config_.display_url);
        warned_unknown_ = true;
      }
    }
    GRANARY_RETURN_IF_ERROR(tx.Commit());
    return events;
  }

  const SqliteConfig config_;
  DbPtr db_;
  int64_t last_seq_;
  bool warned_unknown_ = false;
};

}  // namespace

namespace {
// A table of records that belong to a dataset, keyed by (dataset, key):
// progress by node id, plans by plan id.
struct ChildTable {
  const char* name;
  const char* upsert;  // binds dataset, key, record
  const char* select;  // binds dataset; yields key, record in key order
};
constexpr ChildTable kProgressTable = {
    "progress", "INSERT OR REPLACE INTO progress (dataset, node, record) VALUES (?, ?, ?)",
    "SELECT node, record FROM progress WHERE dataset = ? ORDER BY node"};
constexpr ChildTable kPlansTable = {
    "plans", "INSERT OR REPLACE INTO plans (dataset, plan_id, record) VALUES (?, ?, ?)",
    "SELECT plan_id, record FROM plans WHERE dataset = ? ORDER BY plan_id"};

const ChildTable& TableOf(store_internal::RecordStore::RecordKind kind) {
  return kind == store_internal::RecordStore::RecordKind::kProgress ? kProgressTable : kPlansTable;
}
}  // namespace

SqliteStore::SqliteStore(SqliteConfig config, DbPtr db)
    : RecordStore(config.clock), config_(std::move(config)), db_(std::move(db)) {}
SqliteStore::~SqliteStore() = default;

Result<std::unique_ptr<MetadataStore>> SqliteStore::Open(SqliteConfig config) {
  const std::string what = "open metadata store";
  GRANARY_ASSIGN_OR_RETURN(DbPtr db,
                           OpenConnection(config, /*create=*/true, /*init_schema=*/true, what));
  return std::unique_ptr<MetadataStore>(new SqliteStore(std::move(config), std::move(db)));
}

std::string SqliteStore::Location(RecordKind kind, std::string_view name,
                                  std::string_view key) const {
  switch (kind) {
    case RecordKind::kDataset:
      return "row of table datasets";
    case RecordKind::kNode:
      return "row of table nodes";
    case RecordKind::kProgress:
    case RecordKind::kPlan:
      return "row " + Quoted(name) + ", " + Quoted(key) + " of table " + TableOf(kind).name;
  }
  return {};
}

Result<SqliteStore::DatasetRow> SqliteStore::DatasetFromRow(std::string name, int64_t revision,
                                                            int64_t created_ms,
                                                            std::string record) const {
  if (revision < 1) {
    return store_internal::CorruptRecord(
        Where(RecordKind::kDataset, name),
        "revision is " + std::to_string(revision) + "; stored revisions start at 1");
  }
  DatasetRow row;
  row.name = std::move(name);
  row.revision = static_cast<uint64_t>(revision);
  row.created_ms = created_ms;
  row.record = std::move(record);
  return row;
}

Result<bool> SqliteStore::InsertDataset(std::string_view what, std::string_view name,
                                        int64_t created_ms, const std::string& record,
                                        const Event& event) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  GRANARY_ASSIGN_OR_RETURN(
      Statement s, Statement::Prepare(session,
                                      "INSERT INTO datasets (name, revision, created_ms, record) "
                                      "VALUES (?, 1, ?, ?) ON CONFLICT (name) DO NOTHING",
                                      what));
  GRANARY_RETURN_IF_ERROR(s.Bind(1, name).Bind(2, created_ms).Bind(3, record).Run());
  if (sqlite3_changes(db_.get()) == 0) return false;
  GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<std::optional<SqliteStore::DatasetRow>> SqliteStore::ReadDataset(std::string_view what,
                                                                        std::string_view name) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(
      Statement s,
      Statement::Prepare(session,
                         "SELECT revision, created_ms, record FROM datasets WHERE name = ?", what));
  GRANARY_ASSIGN_OR_RETURN(bool row, s.Bind(1, name).Step());
  if (!row) return std::optional<DatasetRow>();
  GRANARY_ASSIGN_OR_RETURN(DatasetRow dataset,
                           DatasetFromRow(std::string(name), s.Int(0), s.Int(1), s.Text(2)));
  return std::optional<DatasetRow>(std::move(dataset));
}

Status SqliteStore::ReadDatasets(std::string_view what,
                                 const std::function<Status(const DatasetRow&)>& each) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(
      Statement s,
      Statement::Prepare(
          session, "SELECT name, revision, created_ms, record FROM datasets ORDER BY name", what));
  while (true) {
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    GRANARY_ASSIGN_OR_RETURN(DatasetRow dataset,
                             DatasetFromRow(s.Text(0), s.Int(1), s.Int(2), s.Text(3)));
    GRANARY_RETURN_IF_ERROR(each(dataset));
  }
  return Status::Ok();
}

Result<SqliteStore::DatasetSwap> SqliteStore::SwapDataset(
    std::string_view what, std::string_view name, uint64_t expected_revision, uint64_t new_revision,
    const std::string& record, const Event& event) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  DatasetSwap swap;
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(session, "SELECT revision, created_ms FROM datasets WHERE name = ?",
                           what));
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Bind(1, name).Step());
    if (!row) {
      swap.outcome = DatasetSwap::Outcome::kAbsent;
      return swap;
    }
    if (static_cast<uint64_t>(s.Int(0)) != expected_revision) {
      swap.outcome = DatasetSwap::Outcome::kRevisionDiffers;
      return swap;
    }
    swap.created_ms = s.Int(1);
  }
  GRANARY_ASSIGN_OR_RETURN(
      Statement u,
      Statement::Prepare(session, "UPDATE datasets SET revision = ?, record = ? WHERE name = ?",
                         what));
  GRANARY_RETURN_IF_ERROR(
      u.Bind(1, static_cast<int64_t>(new_revision)).Bind(2, record).Bind(3, name).Run());
  GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return swap;
}

Result<bool> SqliteStore::EraseDataset(std::string_view what, std::string_view name,
                                       const Event& event) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s, Statement::Prepare(session, "DELETE FROM datasets WHERE name = ?", what));
    GRANARY_RETURN_IF_ERROR(s.Bind(1, name).Run());
    if (sqlite3_changes(db_.get()) == 0) return false;
  }
  for (const char* sql :
       {"DELETE FROM progress WHERE dataset = ?", "DELETE FROM plans WHERE dataset = ?"}) {
    GRANARY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(session, sql, what));
    GRANARY_RETURN_IF_ERROR(s.Bind(1, name).Run());
  }
  GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Status SqliteStore::WriteManifest(std::string_view what, std::string_view manifest_id,
                                  std::string_view bytes) {
  Session session(db_.get(), config_);
  // OR IGNORE: the id names the content, so an existing blob is already this one.
  GRANARY_ASSIGN_OR_RETURN(
      Statement s, Statement::Prepare(
                       session, "INSERT OR IGNORE INTO manifests (id, bytes) VALUES (?, ?)", what));
  return s.Bind(1, manifest_id).BindBlob(2, bytes).Run();
}

Result<std::optional<std::string>> SqliteStore::ReadManifest(std::string_view what,
                                                             std::string_view manifest_id) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(
      Statement s, Statement::Prepare(session, "SELECT bytes FROM manifests WHERE id = ?", what));
  GRANARY_ASSIGN_OR_RETURN(bool row, s.Bind(1, manifest_id).Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(s.Text(0));
}

Status SqliteStore::WriteNode(std::string_view what, const NodeRecord& node,
                              const std::string& identity, const std::string& record,
                              int64_t now_ms, milliseconds ttl, const Event& event) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  bool changed = true;
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(session, "SELECT identity FROM nodes WHERE id = ? AND expires_at > ?",
                           what));
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Bind(1, node.id).Bind(2, now_ms).Step());
    changed = !row || s.Text(0) != identity;
  }
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(session,
                           "INSERT INTO nodes (id, pool, identity, record, expires_at) "
                           "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                           "pool = excluded.pool, identity = excluded.identity, "
                           "record = excluded.record, expires_at = excluded.expires_at",
                           what));
    GRANARY_RETURN_IF_ERROR(s.Bind(1, node.id)
                                .Bind(2, node.pool)
                                .Bind(3, identity)
                                .Bind(4, record)
                                .Bind(5, now_ms + ttl.count())
                                .Run());
  }
  bool swept = false;
  {
    // Expired rows are dead weight; heartbeats are frequent enough to sweep them.
    GRANARY_ASSIGN_OR_RETURN(
        Statement s, Statement::Prepare(session, "DELETE FROM nodes WHERE expires_at <= ?", what));
    GRANARY_RETURN_IF_ERROR(s.Bind(1, now_ms).Run());
    swept = sqlite3_changes(session.db()) > 0;
  }
  if (changed || swept) GRANARY_RETURN_IF_ERROR(BumpNodesVersion(session, what));
  if (changed) GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  return tx.Commit();
}

Result<uint64_t> SqliteStore::ReadNodesVersion(std::string_view what) {
  const int64_t now = config_.clock->NowMillis();  // under the mutex, as in ReadNodes
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(
      Statement s,
      Statement::Prepare(session,
                         "SELECT (SELECT value FROM meta WHERE key = 'nodes_version'), "
                         "(SELECT count(*) FROM nodes WHERE expires_at <= ?)",
                         what));
  GRANARY_ASSIGN_OR_RETURN(bool row, s.Bind(1, now).Step());
  if (!row) return Status::Internal(std::string(what) + ": no row");
  const int64_t version = s.Int(0);
  const int64_t expired = s.Int(1);
  if (version < 0 || expired < 0) {
    return Status::Internal(std::string(what) + ": a negative nodes_version or count");
  }
  // As in the Redis store: rows expired and not swept yet count in.
  return (static_cast<uint64_t>(version) << 20) +
         std::min<uint64_t>(static_cast<uint64_t>(expired), (1u << 20) - 1);
}

Status SqliteStore::ReadNodes(std::string_view what, std::string_view pool,
                              const std::function<Status(const NodeRow&)>& each) {
  // Read with RecordStore's mutex held, as Heartbeat's time is: never stale
  // after a wait for another call.
  const int64_t now = config_.clock->NowMillis();
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(
      Statement s, Statement::Prepare(session,
                                      "SELECT id, pool, record FROM nodes WHERE expires_at > ? AND "
                                      "(? = '' OR pool = ?) ORDER BY id",
                                      what));
  s.Bind(1, now).Bind(2, pool).Bind(3, pool);
  while (true) {
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    NodeRow node;
    node.id = s.Text(0);
    node.pool_column = s.Text(1);
    node.record = s.Text(2);
    GRANARY_RETURN_IF_ERROR(each(node));
  }
  return Status::Ok();
}

Result<bool> SqliteStore::EraseNode(std::string_view what, std::string_view node_id,
                                    const Event& event) {
  const int64_t now = config_.clock->NowMillis();  // under the mutex, as in ReadNodes
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  bool live = false;
  {
    GRANARY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(session, "SELECT 1 FROM nodes WHERE id = ? AND expires_at > ?", what));
    GRANARY_ASSIGN_OR_RETURN(live, s.Bind(1, node_id).Bind(2, now).Step());
  }
  GRANARY_ASSIGN_OR_RETURN(Statement s,
                           Statement::Prepare(session, "DELETE FROM nodes WHERE id = ?", what));
  GRANARY_RETURN_IF_ERROR(s.Bind(1, node_id).Run());
  if (sqlite3_changes(session.db()) > 0) GRANARY_RETURN_IF_ERROR(BumpNodesVersion(session, what));
  // Not live: the sweep of an expired row is still worth keeping.
  if (live) GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return live;
}

Result<bool> SqliteStore::WriteChild(std::string_view what, RecordKind kind,
                                     std::string_view dataset, std::string_view key,
                                     const std::string& record, const Event& event) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  GRANARY_ASSIGN_OR_RETURN(bool exists, DatasetExists(session, dataset, what));
  if (!exists) return false;
  GRANARY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(session, TableOf(kind).upsert, what));
  GRANARY_RETURN_IF_ERROR(s.Bind(1, dataset).Bind(2, key).Bind(3, record).Run());
  GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<std::optional<std::map<std::string, std::string>>> SqliteStore::ReadChildren(
    std::string_view what, RecordKind kind, std::string_view dataset) {
  using Children = std::map<std::string, std::string>;
  Session session(db_.get(), config_);
  // One read transaction: the existence check and the rows are one snapshot.
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, false, what));
  GRANARY_ASSIGN_OR_RETURN(bool exists, DatasetExists(session, dataset, what));
  if (!exists) return std::optional<Children>();
  GRANARY_ASSIGN_OR_RETURN(Statement s, Statement::Prepare(session, TableOf(kind).select, what));
  s.Bind(1, dataset);
  Children out;
  while (true) {
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.emplace(s.Text(0), s.Text(1));
  }
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return std::optional<Children>(std::move(out));
}

Result<SqliteStore::PlanErase> SqliteStore::ErasePlan(std::string_view what,
                                                      std::string_view dataset,
                                                      std::string_view plan_id,
                                                      const Event& event) {
  Session session(db_.get(), config_);
  GRANARY_ASSIGN_OR_RETURN(Transaction tx, Transaction::Begin(session, true, what));
  GRANARY_ASSIGN_OR_RETURN(bool exists, DatasetExists(session, dataset, what));
  if (!exists) return PlanErase::kNoDataset;
  GRANARY_ASSIGN_OR_RETURN(
      Statement s,
      Statement::Prepare(session, "DELETE FROM plans WHERE dataset = ? AND plan_id = ?", what));
  GRANARY_RETURN_IF_ERROR(s.Bind(1, dataset).Bind(2, plan_id).Run());
  if (sqlite3_changes(db_.get()) == 0) return PlanErase::kNoPlan;
  GRANARY_RETURN_IF_ERROR(Publish(session, event, what));
  GRANARY_RETURN_IF_ERROR(tx.Commit());
  return PlanErase::kErased;
}

Result<std::unique_ptr<MetadataStore::Watcher>> SqliteStore::Watch() {
  const std::string what = "watch events";
  GRANARY_ASSIGN_OR_RETURN(DbPtr db,
                           OpenConnection(config_, /*create=*/false, /*init_schema=*/false, what));
  int64_t last = 0;
  {
    // Start after everything already there, pruned or not.
    Session session(db.get(), config_);
    GRANARY_ASSIGN_OR_RETURN(
        Statement s,
        Statement::Prepare(session,
                           "SELECT max((SELECT coalesce(max(seq), 0) FROM events), (SELECT value "
                           "FROM meta WHERE key = 'events_pruned_through'))",
                           what));
    GRANARY_ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) last = s.Int(0);
  }
  return std::unique_ptr<Watcher>(new SqliteWatcher(config_, std::move(db), last));
}

}  // namespace granary
