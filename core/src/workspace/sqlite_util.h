#pragma once
// Small RAII helpers over SQLite's C API shared by the store and the registry (private).
#include <sqlite3.h>

#include <cstdint>
#include <string>

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

}  // namespace lathe::core
