#include "lathe/core/registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "workspace/sqlite_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace lathe::core {

// ---- signatures and references -----------------------------------------------------------

std::string signatureToJson(const ModelSignature& s) {
    auto specs = [](const std::vector<TensorSpec>& v) {
        json a = json::array();
        for (const auto& t : v) a.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
        return a;
    };
    json j{{"inputs", specs(s.inputs)}, {"outputs", specs(s.outputs)}};
    if (!s.classNames.empty()) j["classes"] = s.classNames;
    return j.dump();
}

ModelSignature signatureFromJson(const std::string& text) {
    try {
        const auto j = json::parse(text);
        ModelSignature s;
        auto read = [](const json& a, std::vector<TensorSpec>& out) {
            for (const auto& t : a)
                out.push_back({t.at("name").get<std::string>(), t.at("datatype").get<std::string>(),
                               t.at("shape").get<std::vector<int64_t>>()});
        };
        read(j.at("inputs"), s.inputs);
        read(j.at("outputs"), s.outputs);
        if (j.contains("classes")) s.classNames = j.at("classes").get<std::vector<std::string>>();
        return s;
    } catch (const json::exception& ex) {
        throw ConfigError(std::string("not a model signature: ") + ex.what());
    }
}

void checkModelName(const std::string& name, const char* what) {
    bool ok = !name.empty() && name.size() <= 64 && std::isalnum(static_cast<unsigned char>(name[0]));
    for (char c : name)
        ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
    if (!ok)
        throw ConfigError(std::string(what) + " '" + name +
                          "' is not valid: use letters, digits, '.', '_' and '-' (at most 64, starting "
                          "with a letter or digit)");
}

std::string ModelRef::str() const {
    if (version > 0) return name + ":" + std::to_string(version);
    if (!alias.empty()) return name + "@" + alias;
    return name;
}

ModelRef parseModelRef(const std::string& text) {
    ModelRef r;
    const auto colon = text.find(':');
    const auto at = text.find('@');
    if (colon != std::string::npos && at != std::string::npos)
        throw ConfigError("model reference '" + text +
                          "': give a version (NAME:V) or an alias (NAME@ALIAS), not both");
    if (colon != std::string::npos) {
        r.name = text.substr(0, colon);
        const auto v = text.substr(colon + 1);
        if (v.empty()) throw ConfigError("model reference '" + text + "' has no version after ':'");
        for (char c : v)
            if (!std::isdigit(static_cast<unsigned char>(c)) || v.size() > 12)
                throw ConfigError("model reference '" + text + "': version '" + v +
                                  "' is not a positive number");
        r.version = std::stoll(v);
        if (r.version <= 0) throw ConfigError("model reference '" + text + "': versions start at 1");
    } else if (at != std::string::npos) {
        r.name = text.substr(0, at);
        r.alias = text.substr(at + 1);
        if (r.alias.empty()) throw ConfigError("model reference '" + text + "' has no alias after '@'");
        checkModelName(r.alias, "alias");
    } else {
        r.name = text;
    }
    checkModelName(r.name);
    return r;
}

// ---- the registry ----------------------------------------------------------------------

struct Registry::Impl {
    std::string path;
    sqlite3* db = nullptr;
    mutable std::mutex mutex;  // one connection, used by one thread at a time

    ~Impl() {
        if (db) sqlite3_close_v2(db);
    }

    // Two processes adding versions of one model never read the same "next version".
    template <class F>
    auto write(F&& f) {
        return writeTransaction(db, std::forward<F>(f));
    }

    int64_t modelId(const std::string& name) const {
        Stmt s(db, "SELECT id FROM models WHERE name = ?");
        s.bind(1, name);
        return s.step() ? s.i64(0) : 0;
    }

    ModelVersion readVersion(Stmt& s, const std::string& name) const {
        ModelVersion v;
        v.name = name;
        v.version = s.i64(0);
        v.path = s.text(1);
        v.sha256 = s.text(2);
        v.sizeBytes = s.i64(3);
        v.signature = signatureFromJson(s.text(4));
        try {
            const auto metrics = json::parse(s.text(5));  // kept alive: items() refers to it
            for (const auto& [k, val] : metrics.items())
                if (val.is_number()) v.metrics[k] = val.get<double>();
        } catch (const json::exception&) {
        }
        v.runId = s.isNull(6) ? 0 : s.i64(6);
        v.data = s.text(7);
        v.parentVersion = s.isNull(8) ? 0 : s.i64(8);
        v.source = s.text(9);
        v.createdAt = s.f64(10);
        v.parentModel = s.text(11);
        v.derivation = s.text(12);
        v.report = s.text(13);
        return v;
    }

    std::vector<std::string> aliasesOf(int64_t id, int64_t version) const {
        std::vector<std::string> out;
        Stmt a(db, "SELECT alias FROM model_aliases WHERE model_id = ? AND version = ? ORDER BY alias");
        a.bind(1, id).bind(2, version);
        while (a.step()) out.push_back(a.text(0));
        return out;
    }

    static constexpr const char* kVersionColumns =
        "version, path, sha256, size_bytes, signature, metrics, run_id, data, parent_version, source, "
        "created_at, parent_model, derivation, report";
};

namespace {

Deployment readDeployment(Stmt& s) {
    Deployment d;
    d.id = s.i64(0);
    d.model = s.text(1);
    d.version = s.i64(2);
    d.target = s.text(3);
    d.url = s.text(4);
    d.pid = s.isNull(5) ? 0 : s.i64(5);
    d.logPath = s.text(6);
    d.actor = s.text(7);
    d.action = s.text(8);
    d.reason = s.text(9);
    d.startedAt = s.f64(10);
    d.endedAt = s.isNull(11) ? 0 : s.f64(11);
    d.endReason = s.text(12);
    d.instance = s.text(13);
    return d;
}
constexpr const char* kDeploymentColumns =
    "id, model, version, target, url, pid, log_path, actor, action, reason, started_at, ended_at, "
    "end_reason, instance";

}  // namespace

Registry::Registry(const std::string& workspacePath) : d(std::make_unique<Impl>()) {
    // The Store validates the file (ours, not newer) and migrates it; then it is closed again
    // and the registry keeps a connection of its own.
    {
        Store store(workspacePath);
        d->path = store.path();
    }
    d->db = openWorkspaceConnection(d->path);
}

Registry::~Registry() = default;

const std::string& Registry::workspacePath() const { return d->path; }

std::string Registry::modelDir(const std::string& name) const {
    checkModelName(name);
    return (fs::path(Store::filesDirFor(d->path)) / "models" / name).string();
}

int64_t Registry::nextVersion(const std::string& name) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db,
           "SELECT COALESCE(MAX(v.version), 0) + 1 FROM model_versions v JOIN models m ON m.id = v.model_id "
           "WHERE m.name = ?");
    s.bind(1, name);
    return s.step() ? s.i64(0) : 1;
}

ModelVersion Registry::addVersion(ModelVersion v) {
    checkModelName(v.name);
    std::lock_guard<std::mutex> lk(d->mutex);
    const double now = nowSeconds();
    json metrics = json::object();
    for (const auto& [k, val] : v.metrics)
        if (std::isfinite(val)) metrics[k] = val;
    return d->write([&] {
        Stmt m(d->db, "INSERT OR IGNORE INTO models(name, created_at) VALUES(?, ?)");
        m.bind(1, v.name).bind(2, now).run();
        const int64_t id = d->modelId(v.name);
        Stmt n(d->db, "SELECT COALESCE(MAX(version), 0) + 1 FROM model_versions WHERE model_id = ?");
        n.bind(1, id);
        n.step();
        v.version = n.i64(0);
        if (v.parentModel == v.name) v.parentModel.clear();
        if (!v.parentModel.empty() && v.parentVersion <= 0)
            throw ConfigError("a parent model (" + v.parentModel + ") needs a parent version");
        if (v.parentVersion > 0) {
            const std::string parent = v.parentModel.empty() ? v.name : v.parentModel;
            Stmt p(d->db,
                   "SELECT 1 FROM model_versions v JOIN models m ON m.id = v.model_id WHERE m.name = ? AND "
                   "v.version = ?");
            p.bind(1, parent).bind(2, v.parentVersion);
            if (!p.step())
                throw NotFoundError("model " + parent + " has no version " + std::to_string(v.parentVersion) +
                                    " to be the parent");
        }
        Stmt s(d->db,
               "INSERT INTO model_versions(model_id, version, path, sha256, size_bytes, signature, metrics, "
               "run_id, data, parent_version, source, created_at, parent_model, derivation, report) "
               "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
        s.bind(1, id).bind(2, v.version).bind(3, v.path).bind(4, v.sha256).bind(5, v.sizeBytes);
        s.bind(6, signatureToJson(v.signature)).bind(7, metrics.dump());
        if (v.runId > 0)
            s.bind(8, v.runId);
        else
            s.bindNull(8);
        s.bind(9, v.data);
        if (v.parentVersion > 0)
            s.bind(10, v.parentVersion);
        else
            s.bindNull(10);
        s.bind(11, v.source)
            .bind(12, now)
            .bind(13, v.parentModel)
            .bind(14, v.derivation)
            .bind(15, v.report)
            .run();
        v.createdAt = now;
        return v;
    });
}

void Registry::setReport(const std::string& name, int64_t version, const std::string& reportJson) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db,
               "UPDATE model_versions SET report = ? WHERE version = ? AND model_id = (SELECT id FROM models "
               "WHERE "
               "name = ?)");
        s.bind(1, reportJson).bind(2, version).bind(3, name).run();
        if (sqlite3_changes(d->db) == 0)
            throw NotFoundError("model " + name + " has no version " + std::to_string(version));
    });
}

std::vector<ModelSummary> Registry::listModels() const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<ModelSummary> out;
    Stmt s(d->db,
           "SELECT m.id, m.name, m.created_at, COUNT(v.version), COALESCE(MAX(v.version), 0) FROM models m "
           "LEFT JOIN model_versions v ON v.model_id = m.id GROUP BY m.id ORDER BY m.name");
    while (s.step()) {
        ModelSummary m;
        m.name = s.text(1);
        m.createdAt = s.f64(2);
        m.versions = s.i64(3);
        m.latestVersion = s.i64(4);
        Stmt a(d->db, "SELECT alias, version FROM model_aliases WHERE model_id = ?");
        a.bind(1, s.i64(0));
        while (a.step()) m.aliases[a.text(0)] = a.i64(1);
        out.push_back(std::move(m));
    }
    return out;
}

std::vector<ModelVersion> Registry::versions(const std::string& name) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<ModelVersion> out;
    const int64_t id = d->modelId(name);
    if (id == 0) return out;
    Stmt s(d->db, (std::string("SELECT ") + Impl::kVersionColumns +
                   " FROM model_versions WHERE model_id = ? ORDER BY version")
                      .c_str());
    s.bind(1, id);
    while (s.step()) {
        out.push_back(d->readVersion(s, name));
        out.back().aliases = d->aliasesOf(id, out.back().version);
    }
    return out;
}

ModelVersion Registry::resolve(const ModelRef& ref) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    const int64_t id = d->modelId(ref.name);
    if (id == 0)
        throw NotFoundError("no model named '" + ref.name + "' in the registry (see `lathectl models list`)");
    int64_t version = ref.version;
    if (!ref.alias.empty()) {
        Stmt a(d->db, "SELECT version FROM model_aliases WHERE model_id = ? AND alias = ?");
        a.bind(1, id).bind(2, ref.alias);
        if (!a.step()) throw NotFoundError("model " + ref.name + " has no alias '" + ref.alias + "'");
        version = a.i64(0);
    }
    std::string sql = std::string("SELECT ") + Impl::kVersionColumns +
                      " FROM model_versions WHERE model_id = ? " +
                      (version > 0 ? "AND version = ?" : "ORDER BY version DESC LIMIT 1");
    Stmt s(d->db, sql.c_str());
    s.bind(1, id);
    if (version > 0) s.bind(2, version);
    if (!s.step())
        throw NotFoundError(version > 0 ? "model " + ref.name + " has no version " + std::to_string(version)
                                        : "model " + ref.name + " has no versions");
    auto v = d->readVersion(s, ref.name);
    v.aliases = d->aliasesOf(id, v.version);
    return v;
}

void Registry::setAlias(const std::string& name, const std::string& alias, int64_t version) {
    checkModelName(alias, "alias");
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        const int64_t id = d->modelId(name);
        if (id == 0) throw NotFoundError("no model named '" + name + "' in the registry");
        Stmt p(d->db, "SELECT 1 FROM model_versions WHERE model_id = ? AND version = ?");
        p.bind(1, id).bind(2, version);
        if (!p.step()) throw NotFoundError("model " + name + " has no version " + std::to_string(version));
        Stmt s(d->db,
               "INSERT OR REPLACE INTO model_aliases(model_id, alias, version, updated_at) VALUES(?,?,?,?)");
        s.bind(1, id).bind(2, alias).bind(3, version).bind(4, nowSeconds()).run();
    });
}

void Registry::removeAlias(const std::string& name, const std::string& alias) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db,
               "DELETE FROM model_aliases WHERE alias = ? AND model_id = (SELECT id FROM models WHERE name = "
               "?)");
        s.bind(1, alias).bind(2, name).run();
        if (sqlite3_changes(d->db) == 0)
            throw NotFoundError("model " + name + " has no alias '" + alias + "'");
    });
}

// ---- deployments -------------------------------------------------------------------------

int64_t Registry::recordDeployment(Deployment dep) {
    std::lock_guard<std::mutex> lk(d->mutex);
    const double now = dep.startedAt > 0 ? dep.startedAt : nowSeconds();
    return d->write([&] {
        Stmt e(d->db,
               "UPDATE deployments SET ended_at = ?, end_reason = ? WHERE model = ? AND ended_at IS NULL");
        e.bind(1, now).bind(2, "replaced by v" + std::to_string(dep.version)).bind(3, dep.model).run();
        Stmt s(d->db,
               "INSERT INTO deployments(model, version, target, url, pid, log_path, actor, action, reason, "
               "started_at, "
               "instance) VALUES(?,?,?,?,?,?,?,?,?,?,?)");
        s.bind(1, dep.model).bind(2, dep.version).bind(3, dep.target).bind(4, dep.url);
        if (dep.pid > 0)
            s.bind(5, dep.pid);
        else
            s.bindNull(5);
        s.bind(6, dep.logPath).bind(7, dep.actor).bind(8, dep.action).bind(9, dep.reason).bind(10, now);
        s.bind(11, dep.instance).run();
        return static_cast<int64_t>(sqlite3_last_insert_rowid(d->db));
    });
}

void Registry::endDeployment(int64_t id, const std::string& reason) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db,
               "UPDATE deployments SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL");
        s.bind(1, nowSeconds()).bind(2, reason).bind(3, id).run();
        // Its server is gone (or never trusted): its token opens nothing any more. Kept while
        // another live record names the same server, which no caller does today.
        Stmt t(
            d->db,
            "DELETE FROM deployment_tokens WHERE instance IN (SELECT instance FROM deployments WHERE id = ? "
            "AND instance != '') AND instance NOT IN (SELECT instance FROM deployments WHERE ended_at IS "
            "NULL)");
        t.bind(1, id).run();
    });
}

std::string Registry::deploymentToken(const std::string& instance) const {
    if (instance.empty()) return {};
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db, "SELECT token FROM deployment_tokens WHERE instance = ?");
    s.bind(1, instance);
    return s.step() ? s.text(0) : std::string();
}

void Registry::storeDeploymentToken(const std::string& instance, const std::string& token) {
    if (instance.empty() || token.empty())
        throw ConfigError("a deployment token needs an instance id and a token");
    // A token opens its server's control API: the file that keeps it (and SQLite's -wal and -shm
    // beside it, where the row lands first) is for its owner only. A workspace created by Lathe is
    // 0600 already; an older one that others could read is closed here, before the secret is in it.
    for (const char* suffix : {"", "-wal", "-shm"}) {
        const std::string file = d->path + suffix;
        struct stat st {};
        if (::stat(file.c_str(), &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 077) != 0)
            ::chmod(file.c_str(), st.st_mode & 0700);
    }
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db, "INSERT OR REPLACE INTO deployment_tokens(instance, token, created_at) VALUES(?,?,?)");
        s.bind(1, instance).bind(2, token).bind(3, nowSeconds()).run();
    });
}

void Registry::forgetDeploymentToken(const std::string& instance) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db, "DELETE FROM deployment_tokens WHERE instance = ?");
        s.bind(1, instance).run();
    });
}

std::vector<Deployment> Registry::deployments(const std::string& model) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<Deployment> out;
    Stmt s(d->db, (std::string("SELECT ") + kDeploymentColumns +
                   " FROM deployments WHERE model = ? ORDER BY id DESC")
                      .c_str());
    s.bind(1, model);
    while (s.step()) out.push_back(readDeployment(s));
    return out;
}

std::vector<Deployment> Registry::allDeployments() const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<Deployment> out;
    Stmt s(d->db,
           (std::string("SELECT ") + kDeploymentColumns + " FROM deployments ORDER BY id DESC").c_str());
    while (s.step()) out.push_back(readDeployment(s));
    return out;
}

std::optional<Deployment> Registry::liveDeployment(const std::string& model) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db, (std::string("SELECT ") + kDeploymentColumns +
                   " FROM deployments WHERE model = ? AND ended_at IS NULL ORDER BY id DESC LIMIT 1")
                      .c_str());
    s.bind(1, model);
    if (!s.step()) return std::nullopt;
    return readDeployment(s);
}

// ---- serving metrics and alerts ------------------------------------------------------------

void Registry::appendServingMetrics(const std::string& model, int64_t version, double t,
                                    const std::map<std::string, double>& values) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db, "INSERT INTO serving_metrics(model, key, t, value, version) VALUES(?,?,?,?,?)");
        for (const auto& [k, v] : values) {
            s.bind(1, model).bind(2, k).bind(3, t);
            if (std::isfinite(v))
                s.bind(4, v);
            else
                s.bindNull(4);
            s.bind(5, version).run();
        }
    });
}

std::vector<std::string> Registry::servingKeys(const std::string& model) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<std::string> out;
    Stmt s(d->db, "SELECT DISTINCT key FROM serving_metrics WHERE model = ? ORDER BY key");
    s.bind(1, model);
    while (s.step()) out.push_back(s.text(0));
    return out;
}

std::vector<ServingPoint> Registry::servingMetrics(const std::string& model, const std::string& key,
                                                   double since) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<ServingPoint> out;
    Stmt s(d->db,
           "SELECT t, value, version FROM serving_metrics WHERE model = ? AND key = ? AND t > ? AND value IS "
           "NOT NULL "
           "ORDER BY t");
    s.bind(1, model).bind(2, key).bind(3, since);
    while (s.step()) out.push_back({s.f64(0), s.f64(1), s.i64(2)});
    return out;
}

int64_t Registry::fireAlert(const std::string& model, const std::string& rule, const std::string& message,
                            double value, double t) {
    std::lock_guard<std::mutex> lk(d->mutex);
    return d->write([&] {
        Stmt s(d->db, "INSERT INTO alerts(model, rule, message, value, fired_at) VALUES(?,?,?,?,?)");
        s.bind(1, model).bind(2, rule).bind(3, message);
        if (std::isfinite(value))
            s.bind(4, value);
        else
            s.bindNull(4);
        s.bind(5, t).run();
        return static_cast<int64_t>(sqlite3_last_insert_rowid(d->db));
    });
}

void Registry::resolveAlert(int64_t id, double t) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db, "UPDATE alerts SET resolved_at = ? WHERE id = ? AND resolved_at IS NULL");
        s.bind(1, t).bind(2, id).run();
    });
}

std::vector<AlertRecord> Registry::alerts(const std::string& model, double since) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<AlertRecord> out;
    Stmt s(d->db,
           "SELECT id, model, rule, message, value, fired_at, resolved_at FROM alerts "
           "WHERE (? = '' OR model = ?) AND (resolved_at IS NULL OR resolved_at > ? OR fired_at > ?) "
           "ORDER BY fired_at DESC, id DESC");
    s.bind(1, model).bind(2, model).bind(3, since).bind(4, since);
    while (s.step()) {
        AlertRecord a;
        a.id = s.i64(0);
        a.model = s.text(1);
        a.rule = s.text(2);
        a.message = s.text(3);
        a.value = s.isNull(4) ? 0 : s.f64(4);
        a.firedAt = s.f64(5);
        a.resolvedAt = s.isNull(6) ? 0 : s.f64(6);
        out.push_back(std::move(a));
    }
    return out;
}

// ---- rollouts -------------------------------------------------------------------------------

namespace {

constexpr const char* kRolloutColumns =
    "id, model, baseline, candidate, plan, state, step, weight_bp, bad_in_row, actor, started_at, "
    "updated_at, "
    "ended_at, end_reason";

std::string rolloutPlanJson(const Rollout& r) {
    json j{{"steps_bp", r.stepsBp},
           {"interval_s", r.intervalS},
           {"max_error_rate", r.maxErrorRate},
           {"max_p99_ms", r.maxP99Ms},
           {"min_requests", r.minRequests},
           {"threshold", r.threshold},
           {"user_parameter", r.userParameter}};
    if (!r.candidatePath.empty()) {
        j["candidate_path"] = r.candidatePath;
        j["candidate_sha256"] = r.candidateSha256;
    }
    return j.dump();
}

Rollout readRollout(const Stmt& s) {
    Rollout r;
    r.id = s.i64(0);
    r.model = s.text(1);
    r.baseline = s.i64(2);
    r.candidate = s.i64(3);
    try {
        const auto j = json::parse(s.text(4));
        r.stepsBp = j.at("steps_bp").get<std::vector<int32_t>>();
        r.intervalS = j.at("interval_s").get<double>();
        r.maxErrorRate = j.at("max_error_rate").get<double>();
        r.maxP99Ms = j.at("max_p99_ms").get<double>();
        r.minRequests = j.at("min_requests").get<int64_t>();
        r.threshold = j.at("threshold").get<int>();
        r.userParameter = j.value("user_parameter", std::string());
        r.candidatePath = j.value("candidate_path", std::string());
        r.candidateSha256 = j.value("candidate_sha256", std::string());
    } catch (const std::exception& ex) {
        throw StoreError("rollout " + std::to_string(r.id) + " of " + r.model +
                         " has a damaged plan: " + ex.what());
    }
    r.state = s.text(5);
    r.step = static_cast<int>(s.i64(6));
    r.weightBp = static_cast<int32_t>(s.i64(7));
    r.badInRow = static_cast<int>(s.i64(8));
    r.actor = s.text(9);
    r.startedAt = s.f64(10);
    r.updatedAt = s.f64(11);
    r.endedAt = s.isNull(12) ? 0 : s.f64(12);
    r.endReason = s.text(13);
    return r;
}

}  // namespace

int64_t Registry::createRollout(const Rollout& r) {
    checkModelName(r.model);
    std::lock_guard<std::mutex> lk(d->mutex);
    const double now = nowSeconds();
    return d->write([&] {
        Stmt a(d->db, "SELECT candidate, state FROM rollouts WHERE model = ? AND ended_at IS NULL");
        a.bind(1, r.model);
        if (a.step())
            throw ConfigError("a rollout of " + r.model + " (v" + std::to_string(a.i64(0)) + ", " +
                              a.text(1) + ") is under way; abort it first (lathectl rollout abort " +
                              r.model + ")");
        Stmt s(d->db,
               "INSERT INTO rollouts(model, baseline, candidate, plan, state, step, weight_bp, bad_in_row, "
               "actor, "
               "started_at, updated_at) VALUES(?,?,?,?,?,?,?,?,?,?,?)");
        s.bind(1, r.model).bind(2, r.baseline).bind(3, r.candidate).bind(4, rolloutPlanJson(r));
        s.bind(5, r.state).bind(6, int64_t{r.step}).bind(7, int64_t{r.weightBp}).bind(8, int64_t{r.badInRow});
        s.bind(9, r.actor).bind(10, now).bind(11, now).run();
        return static_cast<int64_t>(sqlite3_last_insert_rowid(d->db));
    });
}

void Registry::deleteRollout(int64_t id) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db, "DELETE FROM rollouts WHERE id = ?");
        s.bind(1, id).run();
    });
}

void Registry::updateRollout(const Rollout& r) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db,
               "UPDATE rollouts SET state = ?, step = ?, weight_bp = ?, bad_in_row = ?, updated_at = ?, "
               "ended_at = ?, end_reason = ? WHERE id = ?");
        s.bind(1, r.state).bind(2, int64_t{r.step}).bind(3, int64_t{r.weightBp}).bind(4, int64_t{r.badInRow});
        s.bind(5, nowSeconds());
        if (r.endedAt > 0)
            s.bind(6, r.endedAt);
        else
            s.bindNull(6);
        s.bind(7, r.endReason).bind(8, r.id).run();
    });
}

std::optional<Rollout> Registry::activeRollout(const std::string& model) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db, (std::string("SELECT ") + kRolloutColumns +
                   " FROM rollouts WHERE model = ? AND ended_at IS NULL ORDER BY id DESC LIMIT 1")
                      .c_str());
    s.bind(1, model);
    if (!s.step()) return std::nullopt;
    return readRollout(s);
}

std::optional<Rollout> Registry::rollout(int64_t id) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db, (std::string("SELECT ") + kRolloutColumns + " FROM rollouts WHERE id = ?").c_str());
    s.bind(1, id);
    if (!s.step()) return std::nullopt;
    return readRollout(s);
}

std::vector<Rollout> Registry::rollouts(const std::string& model) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<Rollout> out;
    Stmt s(d->db,
           (std::string("SELECT ") + kRolloutColumns + " FROM rollouts WHERE model = ? ORDER BY id DESC")
               .c_str());
    s.bind(1, model);
    while (s.step()) out.push_back(readRollout(s));
    return out;
}

void Registry::addRolloutDecision(const RolloutDecision& dec) {
    std::lock_guard<std::mutex> lk(d->mutex);
    const double t = dec.t > 0 ? dec.t : nowSeconds();
    d->write([&] {
        if (dec.kind == "hold") {
            Stmt last(
                d->db,
                "SELECT id, kind, step, weight_bp FROM rollout_decisions WHERE rollout_id = ? ORDER BY id "
                "DESC LIMIT 1");
            last.bind(1, dec.rolloutId);
            if (last.step() && last.text(1) == "hold" && last.i64(2) == dec.step &&
                last.i64(3) == dec.weightBp) {
                const int64_t id = last.i64(0);
                Stmt u(d->db,
                       "UPDATE rollout_decisions SET t = ?, reason = ?, numbers = ?, repeats = repeats + 1 "
                       "WHERE "
                       "id = ?");
                u.bind(1, t).bind(2, dec.reason).bind(3, dec.numbers).bind(4, id).run();
                return;
            }
        }
        Stmt s(
            d->db,
            "INSERT INTO rollout_decisions(rollout_id, t, first_t, kind, step, weight_bp, reason, numbers, "
            "repeats, actor) VALUES(?,?,?,?,?,?,?,?,1,?)");
        s.bind(1, dec.rolloutId).bind(2, t).bind(3, t).bind(4, dec.kind).bind(5, int64_t{dec.step});
        s.bind(6, int64_t{dec.weightBp}).bind(7, dec.reason).bind(8, dec.numbers).bind(9, dec.actor).run();
    });
}

std::vector<RolloutDecision> Registry::rolloutDecisions(int64_t rolloutId) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<RolloutDecision> out;
    Stmt s(d->db,
           "SELECT id, rollout_id, t, first_t, kind, step, weight_bp, reason, numbers, repeats, actor FROM "
           "rollout_decisions WHERE rollout_id = ? ORDER BY id");
    s.bind(1, rolloutId);
    while (s.step()) {
        RolloutDecision r;
        r.id = s.i64(0);
        r.rolloutId = s.i64(1);
        r.t = s.f64(2);
        r.firstT = s.f64(3);
        r.kind = s.text(4);
        r.step = static_cast<int>(s.i64(5));
        r.weightBp = static_cast<int32_t>(s.i64(6));
        r.reason = s.text(7);
        r.numbers = s.text(8);
        r.repeats = static_cast<int>(s.i64(9));
        r.actor = s.text(10);
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace lathe::core
