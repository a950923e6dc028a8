#pragma once

// SqliteWriteLock: another writer holding an SQLite file locked (BEGIN
// EXCLUSIVE on a connection of its own) until Unlock or destruction, as a
// store busy with other daemons' writes is. Readers of a WAL database go on;
// writers wait out their busy timeout. Tests that link it link SQLite.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

namespace granary::testing {

class SqliteWriteLock {
 public:
  explicit SqliteWriteLock(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK) << path;
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK) << path;
  }
  SqliteWriteLock(const SqliteWriteLock&) = delete;
  SqliteWriteLock& operator=(const SqliteWriteLock&) = delete;
  ~SqliteWriteLock() { Unlock(); }

  // Lets go (a no-op the second time).
  void Unlock() {
    if (db_ == nullptr) return;
    EXPECT_EQ(sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db_);
    db_ = nullptr;
  }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace granary::testing
