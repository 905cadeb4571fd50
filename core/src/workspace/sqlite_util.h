#pragma once
// Small RAII helpers over SQLite's C API shared by the store, the registry and the data sets
// (private).
#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "lathe/core/error.h"

namespace lathe::core {

class Stmt {
public:
    Stmt(sqlite3* db, const char* sql) : m_db(db) {
        if (sqlite3_prepare_v2(db, sql, -1, &m_stmt, nullptr) != SQLITE_OK)
            throw StoreError(std::string("SQL prepare failed: ") + sqlite3_errmsg(db));
    }
    ~Stmt() { sqlite3_finalize(m_stmt); }
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;

    Stmt& bind(int i, int64_t v) { return check(sqlite3_bind_int64(m_stmt, i, v)); }
    Stmt& bind(int i, double v) { return check(sqlite3_bind_double(m_stmt, i, v)); }
    Stmt& bind(int i, const std::string& v) {
        return check(sqlite3_bind_text(m_stmt, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    }
    Stmt& bindNull(int i) { return check(sqlite3_bind_null(m_stmt, i)); }
    Stmt& bindBlob(int i, const void* data, size_t bytes) {
        return check(sqlite3_bind_blob64(m_stmt, i, data, bytes, SQLITE_TRANSIENT));
    }
    /// true while there is a row.
    bool step() {
        const int rc = sqlite3_step(m_stmt);
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        throw StoreError(std::string("SQL failed: ") + sqlite3_errmsg(m_db));
    }
    void run() {
        // Reset even when the step fails: a statement left mid-step refuses every later bind.
        struct Reset {
            Stmt* s;
            ~Reset() { s->reset(); }
        } guard{this};
        step();
    }
    void reset() {
        sqlite3_reset(m_stmt);
        sqlite3_clear_bindings(m_stmt);
    }
    int64_t i64(int c) const { return sqlite3_column_int64(m_stmt, c); }
    double f64(int c) const { return sqlite3_column_double(m_stmt, c); }
    bool isNull(int c) const { return sqlite3_column_type(m_stmt, c) == SQLITE_NULL; }
    /// Column c's bytes (a blob; valid until the next step or reset) and their count.
    const void* blob(int c, size_t& bytes) const {
        const void* p = sqlite3_column_blob(m_stmt, c);
        bytes = static_cast<size_t>(sqlite3_column_bytes(m_stmt, c));
        return p;
    }
    std::string text(int c) const {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(m_stmt, c));
        return p ? std::string(p, sqlite3_column_bytes(m_stmt, c)) : std::string();
    }

private:
    Stmt& check(int rc) {
        if (rc != SQLITE_OK) throw StoreError(std::string("SQL bind failed: ") + sqlite3_errmsg(m_db));
        return *this;
    }
    sqlite3* m_db;
    sqlite3_stmt* m_stmt = nullptr;
};

inline void exec(sqlite3* db, const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
        std::string msg = err ? err : sqlite3_errmsg(db);
        sqlite3_free(err);
        throw StoreError(msg);
    }
}

/// A connection of its own to a workspace file that Store has validated and migrated: read-write
/// (or read-only), a 10 s busy timeout, foreign keys enforced. Closed by sqlite3_close_v2.
inline sqlite3* openWorkspaceConnection(const std::string& path, bool readOnly = false) {
    sqlite3* db = nullptr;
    const int mode = readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
    if (sqlite3_open_v2(path.c_str(), &db, mode | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
        const std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
        sqlite3_close_v2(db);
        throw StoreError("cannot open workspace " + path + ": " + msg);
    }
    sqlite3_busy_timeout(db, 10000);
    exec(db, "PRAGMA foreign_keys=ON");
    return db;
}

/// Runs f() in a short write transaction and returns what it returns; rolls back and rethrows
/// when it throws. IMMEDIATE takes the write lock up front, so that two processes numbering the
/// next version of one thing cannot both read the same number.
template <class F>
auto writeTransaction(sqlite3* db, F&& f) {
    exec(db, "BEGIN IMMEDIATE");
    try {
        if constexpr (std::is_void_v<decltype(f())>) {
            f();
            exec(db, "COMMIT");
        } else {
            auto r = f();
            exec(db, "COMMIT");
            return r;
        }
    } catch (...) {
        sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
    }
}

}  // namespace lathe::core
