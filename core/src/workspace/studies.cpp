// Hyper-parameter studies in the workspace (studies.h): tables `studies`, `trials` and
// `trial_rungs` (schema 11).
#include "lathe/core/studies.h"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <nlohmann/json.hpp>

#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "workspace/sqlite_util.h"

namespace lathe::core {

namespace {

constexpr const char* kStudyColumns =
    "s.id, s.name, s.sampler, s.pruner, s.objective, s.direction, s.space, s.base_config, s.settings, "
    "s.state, s.status, s.created_at, s.updated_at";

StudyRecord readStudy(const Stmt& q) {
    StudyRecord s;
    s.id = q.i64(0);
    s.name = q.text(1);
    s.sampler = q.text(2);
    s.pruner = q.text(3);
    s.objective = q.text(4);
    s.direction = q.text(5);
    try {
        const auto j = nlohmann::json::parse(q.text(6));
        for (const auto& e : j) s.space.push_back(e.get<std::string>());
    } catch (const std::exception& e) {
        throw StoreError("study " + s.name + ": its search space is not readable (" + e.what() + ")");
    }
    s.baseConfig = q.text(7);
    s.settings = q.text(8);
    s.state = q.text(9);
    s.status = q.text(10);
    s.createdAt = q.f64(11);
    s.updatedAt = q.f64(12);
    return s;
}

std::map<std::string, std::string> readParams(const std::string& text) {
    std::map<std::string, std::string> out;
    try {
        const auto j = nlohmann::json::parse(text);
        for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value().get<std::string>();
    } catch (const std::exception& e) {
        throw StoreError(std::string("a trial's parameters are not readable (") + e.what() + ")");
    }
    return out;
}

}  // namespace

const char* toString(TrialState s) {
    switch (s) {
        case TrialState::Running:
            return "running";
        case TrialState::Complete:
            return "complete";
        case TrialState::Pruned:
            return "pruned";
        case TrialState::Failed:
            return "failed";
    }
    return "running";
}

TrialState parseTrialState(const std::string& text) {
    for (auto s : {TrialState::Running, TrialState::Complete, TrialState::Pruned, TrialState::Failed})
        if (text == toString(s)) return s;
    throw ConfigError("unknown trial state '" + text + "' (running, complete, pruned or failed)");
}

bool betterValue(double a, double b, const std::string& direction) {
    return direction == "min" ? a < b : a > b;
}

struct Studies::Impl {
    std::string path;
    sqlite3* db = nullptr;
    mutable std::mutex mutex;
    ~Impl() {
        if (db) sqlite3_close_v2(db);
    }

    // The summary columns of a study from its trials.
    void summarize(StudyRecord& s) const {
        Stmt q(db, "SELECT number, state, value FROM trials WHERE study_id = ?1 ORDER BY number");
        q.bind(1, s.id);
        while (q.step()) {
            ++s.trialsTotal;
            const auto state = parseTrialState(q.text(1));
            switch (state) {
                case TrialState::Complete:
                    ++s.complete;
                    break;
                case TrialState::Pruned:
                    ++s.pruned;
                    break;
                case TrialState::Failed:
                    ++s.failed;
                    break;
                case TrialState::Running:
                    ++s.running;
                    break;
            }
            if (state == TrialState::Complete && !q.isNull(2)) {
                const double v = q.f64(2);
                if (!s.bestValue || betterValue(v, *s.bestValue, s.direction)) {
                    s.bestValue = v;
                    s.bestTrial = q.i64(0);
                }
            }
        }
    }

    std::vector<TrialRecord> readTrials(const char* where, int64_t key) const {
        const std::string sql =
            std::string(
                "SELECT id, study_id, number, run_id, state, params, value, pruned_at, error, host, pid, "
                "started_at, ended_at FROM trials WHERE ") +
            where + " ORDER BY number";
        Stmt q(db, sql.c_str());
        q.bind(1, key);
        std::vector<TrialRecord> out;
        while (q.step()) {
            TrialRecord t;
            t.id = q.i64(0);
            t.studyId = q.i64(1);
            t.number = q.i64(2);
            t.runId = q.isNull(3) ? 0 : q.i64(3);
            t.state = parseTrialState(q.text(4));
            t.params = readParams(q.text(5));
            if (!q.isNull(6)) t.value = q.f64(6);
            t.prunedAt = q.f64(7);
            t.error = q.text(8);
            t.host = q.text(9);
            t.pid = q.i64(10);
            t.startedAt = q.f64(11);
            t.endedAt = q.f64(12);
            out.push_back(std::move(t));
        }
        Stmt r(db, "SELECT rung, budget, value, promoted FROM trial_rungs WHERE trial_id = ?1 ORDER BY rung");
        for (auto& t : out) {
            r.bind(1, t.id);
            while (r.step())
                t.rungs.push_back({static_cast<int>(r.i64(0)), r.f64(1), r.f64(2), r.i64(3) != 0});
            r.reset();
        }
        return out;
    }
};

Studies::Studies(const std::string& workspacePath) : d(std::make_unique<Impl>()) {
    {
        Store store(workspacePath);  // validates and migrates the file
        d->path = store.path();
    }
    d->db = openWorkspaceConnection(d->path);
}

Studies::~Studies() = default;

void Studies::validateName(const std::string& name) {
    if (name.empty() || name.size() > 64)
        throw ConfigError("study name '" + name + "' must be 1 to 64 characters");
    for (char c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
            throw ConfigError("study name '" + name + "' may hold only letters, digits, '-', '_' and '.'");
}

int64_t Studies::create(const StudyRecord& s) {
    validateName(s.name);
    std::lock_guard<std::mutex> lk(d->mutex);
    return writeTransaction(d->db, [&] {
        Stmt exists(d->db, "SELECT 1 FROM studies WHERE name = ?1");
        exists.bind(1, s.name);
        if (exists.step())
            throw ConfigError("a study named '" + s.name + "' exists in " + d->path +
                              " (continue it with lathectl tune --resume " + s.name +
                              ", or pick another --study)");
        nlohmann::json space = nlohmann::json::array();
        for (const auto& p : s.space) space.push_back(p);
        const double now = nowSeconds();
        Stmt q(
            d->db,
            "INSERT INTO studies(name, sampler, pruner, objective, direction, space, base_config, settings, "
            "state, status, created_at, updated_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
            "?11)");
        q.bind(1, s.name)
            .bind(2, s.sampler)
            .bind(3, s.pruner)
            .bind(4, s.objective)
            .bind(5, s.direction)
            .bind(6, space.dump())
            .bind(7, s.baseConfig)
            .bind(8, s.settings)
            .bind(9, s.state)
            .bind(10, s.status)
            .bind(11, now);
        q.run();
        return static_cast<int64_t>(sqlite3_last_insert_rowid(d->db));
    });
}

std::optional<StudyRecord> Studies::study(const std::string& name) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt q(d->db, (std::string("SELECT ") + kStudyColumns + " FROM studies s WHERE s.name = ?1").c_str());
    q.bind(1, name);
    if (!q.step()) return std::nullopt;
    auto s = readStudy(q);
    d->summarize(s);
    return s;
}

std::optional<StudyRecord> Studies::studyById(int64_t id) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt q(d->db, (std::string("SELECT ") + kStudyColumns + " FROM studies s WHERE s.id = ?1").c_str());
    q.bind(1, id);
    if (!q.step()) return std::nullopt;
    auto s = readStudy(q);
    d->summarize(s);
    return s;
}

std::vector<StudyRecord> Studies::list() const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt q(d->db, (std::string("SELECT ") + kStudyColumns + " FROM studies s ORDER BY s.id DESC").c_str());
    std::vector<StudyRecord> out;
    while (q.step()) out.push_back(readStudy(q));
    for (auto& s : out) d->summarize(s);
    return out;
}

void Studies::setStatus(int64_t studyId, const std::string& status) {
    std::lock_guard<std::mutex> lk(d->mutex);
    writeTransaction(d->db, [&] {
        Stmt q(d->db, "UPDATE studies SET status = ?2, updated_at = ?3 WHERE id = ?1");
        q.bind(1, studyId).bind(2, status).bind(3, nowSeconds()).run();
    });
}

void Studies::setState(int64_t studyId, const std::string& stateJson) {
    std::lock_guard<std::mutex> lk(d->mutex);
    writeTransaction(d->db, [&] {
        Stmt q(d->db, "UPDATE studies SET state = ?2, updated_at = ?3 WHERE id = ?1");
        q.bind(1, studyId).bind(2, stateJson).bind(3, nowSeconds()).run();
    });
}

void Studies::setSettings(int64_t studyId, const std::string& settingsJson) {
    std::lock_guard<std::mutex> lk(d->mutex);
    writeTransaction(d->db, [&] {
        Stmt q(d->db, "UPDATE studies SET settings = ?2, updated_at = ?3 WHERE id = ?1");
        q.bind(1, studyId).bind(2, settingsJson).bind(3, nowSeconds()).run();
    });
}

int64_t Studies::addTrial(int64_t studyId, int64_t number, const std::map<std::string, std::string>& params,
                          const std::string& host) {
    std::lock_guard<std::mutex> lk(d->mutex);
    nlohmann::json p = nlohmann::json::object();
    for (const auto& [k, v] : params) p[k] = v;
    return writeTransaction(d->db, [&] {
        Stmt exists(d->db, "SELECT 1 FROM trials WHERE study_id = ?1 AND number = ?2");
        exists.bind(1, studyId).bind(2, number);
        if (exists.step()) throw ConfigError("the study already has a trial " + std::to_string(number));
        Stmt q(d->db,
               "INSERT INTO trials(study_id, number, state, params, host, started_at) VALUES(?1, ?2, "
               "'running', ?3, "
               "?4, ?5)");
        q.bind(1, studyId).bind(2, number).bind(3, p.dump()).bind(4, host).bind(5, nowSeconds()).run();
        const auto id = static_cast<int64_t>(sqlite3_last_insert_rowid(d->db));
        Stmt u(d->db, "UPDATE studies SET updated_at = ?2 WHERE id = ?1");
        u.bind(1, studyId).bind(2, nowSeconds()).run();
        return id;
    });
}

void Studies::attachRun(int64_t trialId, int64_t runId, int64_t pid) {
    std::lock_guard<std::mutex> lk(d->mutex);
    writeTransaction(d->db, [&] {
        Stmt q(d->db, "UPDATE trials SET run_id = ?2, pid = ?3 WHERE id = ?1");
        q.bind(1, trialId).bind(2, runId).bind(3, pid).run();
        if (sqlite3_changes(d->db) == 0)
            throw ConfigError("no trial " + std::to_string(trialId) + " in " + d->path);
    });
}

void Studies::finishTrial(int64_t trialId, TrialState state, std::optional<double> value,
                          const std::string& error, double prunedAt) {
    std::lock_guard<std::mutex> lk(d->mutex);
    writeTransaction(d->db, [&] {
        Stmt q(d->db,
               "UPDATE trials SET state = ?2, value = ?3, error = ?4, pruned_at = ?5, ended_at = ?6 WHERE id "
               "= ?1");
        q.bind(1, trialId).bind(2, std::string(toString(state)));
        if (value)
            q.bind(3, *value);
        else
            q.bindNull(3);
        q.bind(4, error).bind(5, prunedAt).bind(6, nowSeconds()).run();
        Stmt u(d->db,
               "UPDATE studies SET updated_at = ?2 WHERE id = (SELECT study_id FROM trials WHERE id = ?1)");
        u.bind(1, trialId).bind(2, nowSeconds()).run();
    });
}

void Studies::addRung(int64_t trialId, const RungRecord& r) {
    std::lock_guard<std::mutex> lk(d->mutex);
    writeTransaction(d->db, [&] {
        Stmt q(d->db,
               "INSERT OR REPLACE INTO trial_rungs(trial_id, rung, budget, value, promoted) VALUES(?1, ?2, "
               "?3, ?4, ?5)");
        q.bind(1, trialId)
            .bind(2, static_cast<int64_t>(r.rung))
            .bind(3, r.budget)
            .bind(4, r.value)
            .bind(5, static_cast<int64_t>(r.promoted ? 1 : 0))
            .run();
    });
}

std::vector<TrialRecord> Studies::trials(int64_t studyId) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    return d->readTrials("study_id = ?1", studyId);
}

std::optional<TrialRecord> Studies::trial(int64_t trialId) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    auto v = d->readTrials("id = ?1", trialId);
    if (v.empty()) return std::nullopt;
    return v.front();
}

std::optional<std::pair<std::string, int64_t>> Studies::trialOfRun(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt q(d->db,
           "SELECT s.name, t.number FROM trials t JOIN studies s ON s.id = t.study_id WHERE t.run_id = ?1");
    q.bind(1, runId);
    if (!q.step()) return std::nullopt;
    return std::make_pair(q.text(0), q.i64(1));
}

bool Studies::remove(const std::string& name) {
    std::lock_guard<std::mutex> lk(d->mutex);
    return writeTransaction(d->db, [&] {
        Stmt q(d->db, "DELETE FROM studies WHERE name = ?1");
        q.bind(1, name).run();
        return sqlite3_changes(d->db) > 0;
    });
}

}  // namespace lathe::core
