// `lathectl data …`: versioned data sets (add, list, show, diff, checkout, rollback, verify), and
// `lathectl lineage`: data set version -> run -> model version -> deployments, and back.
#include <unistd.h>

#include <cstdio>

#include "cli_common.h"
#include "lathe/core/data_versions.h"

namespace lathe::cli {
namespace {

using nlohmann::json;

struct DataState {
    CommonOptions common;
    std::string name, path, kind, message, ref, other, dir;
    int threads = 0;
    bool full = false;
    int perClass = 50, side = 64;  // data example
};

std::unique_ptr<core::DataSets> openDataSets(const CommonOptions& opts) {
    const auto store = openStore(opts);  // --db / $LATHE_DB / the default, StoreError as UsageError
    const std::string path = store->path();
    try {
        return std::make_unique<core::DataSets>(path);
    } catch (const core::StoreError& ex) {
        throw UsageError(ex.what());
    }
}

std::string filesText(int64_t n) { return std::to_string(n) + (n == 1 ? " file" : " files"); }

std::string megabytes(int64_t bytes) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
    return buf;
}

json versionJson(const core::DataVersion& v) {
    return json{{"name", v.name},      {"version", v.version},      {"root_hash", v.rootHash},
                {"kind", v.kind},      {"source", v.source},        {"files", v.files},
                {"bytes", v.bytes},    {"created_at", v.createdAt}, {"message", v.message},
                {"current", v.current}};
}

void printVersionLine(const core::DataVersion& v) {
    std::printf("  %s v%-3lld %s  %-6s %6lld files %10s  %s%s%s\n", v.current ? "*" : " ",
                static_cast<long long>(v.version), v.rootHash.substr(0, 12).c_str(), v.kind.c_str(),
                static_cast<long long>(v.files), megabytes(v.bytes).c_str(), formatTime(v.createdAt).c_str(),
                v.message.empty() ? "" : "  ", v.message.c_str());
}

void runAdd(const DataState& st) {
    auto sets = openDataSets(st.common);
    core::DataAddOptions o;
    o.kind = st.kind;
    o.message = st.message;
    o.threads = st.threads;
    const bool tty = !st.common.json && ::isatty(2);
    if (tty)
        o.progress = [](int64_t done, int64_t total) {
            std::fprintf(stderr, "\r  %s / %s", megabytes(done).c_str(), megabytes(total).c_str());
        };
    const auto r = sets->add(st.name, st.path, o);
    if (tty) std::fprintf(stderr, "\n");
    const double mbps = r.hashSeconds > 0 ? static_cast<double>(r.version.bytes) / 1e6 / r.hashSeconds : 0;
    if (st.common.json) {
        auto j = versionJson(r.version);
        j["created"] = r.created;
        j["stored_files"] = r.storedFiles;
        j["stored_bytes"] = r.storedBytes;
        j["hash_seconds"] = r.hashSeconds;
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    if (!r.created) {
        std::printf("%s: the files are those of v%lld already (%s); no new version\n", st.name.c_str(),
                    static_cast<long long>(r.version.version), r.version.rootHash.substr(0, 12).c_str());
        return;
    }
    std::printf("%s v%lld: %s, %s, %s, root %s\n", st.name.c_str(), static_cast<long long>(r.version.version),
                filesText(r.version.files).c_str(), megabytes(r.version.bytes).c_str(),
                r.version.kind.c_str(), r.version.rootHash.c_str());
    const long long kept = static_cast<long long>(r.version.files - r.storedFiles);
    std::printf(
        "  hashed in %s (%.0f MB/s); %lld file%s (%s) stored%s\n", formatDuration(r.hashSeconds).c_str(),
        mbps, static_cast<long long>(r.storedFiles), r.storedFiles == 1 ? "" : "s",
        megabytes(r.storedBytes).c_str(),
        kept > 0 ? (", " + std::to_string(kept) + " had the content of files stored before").c_str() : "");
    if (r.version.kind == "images")
        std::printf(
            "  versioned; training on image folders comes with the images: loader (not in this build)\n");
    else
        std::printf("  train on it with data = \"dataset:%s\" (this version: dataset:%s)\n", st.name.c_str(),
                    r.version.ref().c_str());
}

void runList(const DataState& st) {
    auto sets = openDataSets(st.common);
    const auto all = sets->list();
    if (st.common.json) {
        json a = json::array();
        for (const auto& v : all) a.push_back(versionJson(v));
        std::printf("%s\n", a.dump(2).c_str());
        return;
    }
    if (all.empty()) {
        std::printf("no data sets yet: lathectl data add NAME PATH\n");
        return;
    }
    std::printf("%-20s %-8s %-6s %8s %10s  %s\n", "NAME", "CURRENT", "KIND", "FILES", "SIZE", "SOURCE");
    for (const auto& v : all)
        std::printf("%-20s v%-7lld %-6s %8lld %10s  %s\n", v.name.c_str(), static_cast<long long>(v.version),
                    v.kind.c_str(), static_cast<long long>(v.files), megabytes(v.bytes).c_str(),
                    v.source.c_str());
}

void runShow(const DataState& st) {
    auto sets = openDataSets(st.common);
    const auto ref = core::parseDataRef(st.ref);
    if (ref.version == 0) {
        const auto all = sets->versions(ref.name);
        if (st.common.json) {
            json a = json::array();
            for (const auto& v : all) a.push_back(versionJson(v));
            std::printf("%s\n", a.dump(2).c_str());
            return;
        }
        std::printf("%s: %zu versions (* current), from %s\n", ref.name.c_str(), all.size(),
                    all.back().source.c_str());
        for (const auto& v : all) printVersionLine(v);
        return;
    }
    const auto v = sets->resolve(ref);
    const auto files = sets->files(v);
    const auto runs = sets->runsOn(v);
    if (st.common.json) {
        auto j = versionJson(v);
        json f = json::array();
        for (const auto& x : files) f.push_back({{"path", x.path}, {"sha256", x.sha256}, {"size", x.size}});
        j["manifest"] = f;
        json r = json::array();
        for (const auto& x : runs) r.push_back(x.runId);
        j["runs"] = r;
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    std::printf("%s%s: %s data set, %lld files, %s\n", v.ref().c_str(), v.current ? " (current)" : "",
                v.kind.c_str(), static_cast<long long>(v.files), megabytes(v.bytes).c_str());
    std::printf("  root hash  %s\n  taken from %s on %s\n", v.rootHash.c_str(), v.source.c_str(),
                formatTime(v.createdAt).c_str());
    if (!v.message.empty()) std::printf("  message    %s\n", v.message.c_str());
    std::printf("  runs on it %s\n", runs.empty() ? "none" : "");
    for (const auto& r : runs)
        std::printf("    run %lld  %s  %s\n", static_cast<long long>(r.runId), r.name.c_str(),
                    r.status.c_str());
    const size_t shown = std::min<size_t>(files.size(), 20);
    std::printf("  files (%zu%s):\n", files.size(), shown < files.size() ? ", the first 20" : "");
    for (size_t i = 0; i < shown; ++i)
        std::printf("    %s  %10lld  %s\n", files[i].sha256.substr(0, 12).c_str(),
                    static_cast<long long>(files[i].size), files[i].path.c_str());
}

void runDiff(const DataState& st) {
    auto sets = openDataSets(st.common);
    const auto a = sets->resolve(core::parseDataRef(st.ref));
    const auto b = sets->resolve(core::parseDataRef(st.other));
    const auto d = sets->diff(a, b);
    if (st.common.json) {
        std::printf("%s\n", json{{"from", a.ref()},
                                 {"to", b.ref()},
                                 {"added", d.added},
                                 {"removed", d.removed},
                                 {"changed", d.changed}}
                                .dump(2)
                                .c_str());
        return;
    }
    if (d.empty()) {
        std::printf("%s and %s hold the same files (root %s)\n", a.ref().c_str(), b.ref().c_str(),
                    a.rootHash.substr(0, 12).c_str());
        return;
    }
    for (const auto& p : d.added) std::printf("A  %s\n", p.c_str());
    for (const auto& p : d.removed) std::printf("D  %s\n", p.c_str());
    for (const auto& p : d.changed) std::printf("M  %s\n", p.c_str());
    std::printf("%s -> %s: %zu added, %zu removed, %zu changed\n", a.ref().c_str(), b.ref().c_str(),
                d.added.size(), d.removed.size(), d.changed.size());
}

void runCheckout(const DataState& st) {
    auto sets = openDataSets(st.common);
    const auto v = sets->resolve(core::parseDataRef(st.ref));
    sets->checkout(v, st.dir);
    std::printf("%s (%lld files, %s, root %s) checked out into %s\n", v.ref().c_str(),
                static_cast<long long>(v.files), megabytes(v.bytes).c_str(), v.rootHash.substr(0, 12).c_str(),
                st.dir.c_str());
}

void runRollback(const DataState& st) {
    auto sets = openDataSets(st.common);
    const auto before = sets->resolve({st.name, 0});
    const auto v = sets->rollback(st.name);
    if (st.common.json) {
        std::printf("%s\n", versionJson(v).dump(2).c_str());
        return;
    }
    std::printf("%s: v%lld is current again (was v%lld); dataset:%s now trains on it\n", st.name.c_str(),
                static_cast<long long>(v.version), static_cast<long long>(before.version), st.name.c_str());
}

int runVerify(const DataState& st) {
    auto sets = openDataSets(st.common);
    const auto v = sets->resolve(core::parseDataRef(st.ref));
    const auto r = sets->verify(v);
    std::optional<core::DataSourceCheck> source;
    source = sets->checkSource(v, st.full);
    if (st.common.json) {
        json j{
            {"ref", v.ref()}, {"files", r.files},   {"missing", r.missing},           {"corrupt", r.corrupt},
            {"ok", r.ok()},   {"source", v.source}, {"source_exists", source->exists}};
        if (source->exists)
            j["source_changes"] = {{"added", source->diff.added},
                                   {"removed", source->diff.removed},
                                   {"changed", source->diff.changed}};
        std::printf("%s\n", j.dump(2).c_str());
        return r.ok() ? kOk : kRunFailed;
    }
    if (r.ok())
        std::printf("%s: all %lld stored files check out (SHA-256)\n", v.ref().c_str(),
                    static_cast<long long>(r.files));
    for (const auto& p : r.missing) std::printf("missing  %s\n", p.c_str());
    for (const auto& p : r.corrupt) std::printf("corrupt  %s\n", p.c_str());
    if (!r.ok())
        std::printf(
            "%s: %zu of %lld stored files missing, %zu corrupt; `lathectl data add %s %s` stores them again "
            "from the folder if it still holds them\n",
            v.ref().c_str(), r.missing.size(), static_cast<long long>(r.files), r.corrupt.size(),
            v.name.c_str(), v.source.c_str());
    if (!source->exists)
        std::printf("its folder %s is gone (training reads the stored copy)\n", v.source.c_str());
    else if (source->clean())
        std::printf("its folder %s is unchanged (%s)\n", v.source.c_str(),
                    st.full ? "every file's hash" : "sizes and mtimes; --full compares hashes");
    else
        std::printf("its folder %s changed since: %zu added, %zu removed, %zu changed\n", v.source.c_str(),
                    source->diff.added.size(), source->diff.removed.size(), source->diff.changed.size());
    return r.ok() ? kOk : kRunFailed;
}

// `lineage MODEL[:V]` or `lineage --data NAME[:V]`.
void runLineage(const DataState& st, bool data) {
    auto sets = openDataSets(st.common);
    json out = json::object();
    if (data) {
        const auto v = sets->resolve(core::parseDataRef(st.ref));
        const auto runs = sets->runsOn(v);
        const auto models = sets->modelsOf(runs);
        if (st.common.json) {
            json r = json::array(), m = json::array();
            for (const auto& x : runs)
                r.push_back({{"run", x.runId}, {"name", x.name}, {"status", x.status}});
            for (const auto& x : models)
                m.push_back({{"model", x.name},
                             {"version", x.version},
                             {"run", x.runId},
                             {"aliases", x.aliases},
                             {"deployments", x.deployments}});
            std::printf("%s\n", json{{"data", versionJson(v)}, {"runs", r}, {"models", m}}.dump(2).c_str());
            return;
        }
        std::printf("dataset:%s  (%s, root %s, %s)\n", v.ref().c_str(), v.kind.c_str(),
                    v.rootHash.substr(0, 12).c_str(), filesText(v.files).c_str());
        if (runs.empty()) std::printf("  no run trained on it yet\n");
        for (const auto& r : runs) {
            std::printf("  -> run %lld  %s  %s\n", static_cast<long long>(r.runId), r.name.c_str(),
                        r.status.c_str());
            for (const auto& m : models) {
                if (m.runId != r.runId) continue;
                std::string aliases;
                for (const auto& a : m.aliases) aliases += " @" + a;
                std::printf("     -> model %s:%lld%s\n", m.name.c_str(), static_cast<long long>(m.version),
                            aliases.c_str());
                for (const auto& dep : m.deployments) std::printf("        -> %s\n", dep.c_str());
            }
        }
        return;
    }
    auto registry = openRegistry(st.common);
    auto mv = registry->resolve(core::parseModelRef(st.ref));
    // A compressed or distilled version has no run of its own: its lineage goes through its parent.
    std::vector<core::ModelVersion> chain{mv};
    while (chain.back().runId == 0 && chain.back().parentVersion > 0 && chain.size() < 32) {
        const auto& c = chain.back();
        chain.push_back(
            registry->resolve({c.parentModel.empty() ? c.name : c.parentModel, c.parentVersion, {}}));
    }
    const auto& root = chain.back();
    std::optional<core::DataVersion> dv;
    if (root.runId > 0) dv = sets->versionOfRun(root.runId);
    std::vector<std::string> deployments;
    for (const auto& d : registry->deployments(mv.name))
        if (d.version == mv.version)
            deployments.push_back(d.action + " at " + d.url +
                                  (d.target == "local" ? "" : " (" + d.target + ")") + " on " +
                                  formatTime(d.startedAt) + (d.live() ? ", live" : ", ended"));
    if (st.common.json) {
        json c = json::array();
        for (const auto& v : chain)
            c.push_back({{"model", v.name}, {"version", v.version}, {"run", v.runId}});
        json j{{"model", mv.name},  {"version", mv.version}, {"chain", c},
               {"run", root.runId}, {"data", root.data},     {"deployments", deployments}};
        j["data_version"] = dv ? versionJson(*dv) : json(nullptr);
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    if (dv)
        std::printf("dataset:%s  (%s, root %s, %s, from %s)\n", dv->ref().c_str(), dv->kind.c_str(),
                    dv->rootHash.substr(0, 12).c_str(), filesText(dv->files).c_str(), dv->source.c_str());
    else
        std::printf("data %s  (not a versioned data set)\n",
                    root.data.empty() ? "unknown" : root.data.c_str());
    if (root.runId > 0)
        std::printf("  -> run %lld\n", static_cast<long long>(root.runId));
    else
        std::printf("  -> no run (registered from %s)\n", root.source.c_str());
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        std::string from;
        if (it->parentVersion > 0)
            from = "  (from " + (it->parentModel.empty() ? it->name : it->parentModel) + ":" +
                   std::to_string(it->parentVersion) + ")";
        std::printf("     -> model %s:%lld%s\n", it->name.c_str(), static_cast<long long>(it->version),
                    from.c_str());
    }
    if (deployments.empty()) std::printf("        (never deployed)\n");
    for (const auto& d : deployments) std::printf("        -> %s\n", d.c_str());
}

void runExample(const DataState& st) {
    const auto n = core::writeExampleImages(st.dir, st.perClass, st.side);
    std::printf(
        "%lld images of %dx%d (10 classes, JPEG and PNG) written to %s\n"
        "train on them:  lathectl train --data images:%s --model cnn --resize %d --crop %d --random-crop "
        "true\n",
        static_cast<long long>(n), st.side, st.side, st.dir.c_str(), st.dir.c_str(), st.side,
        st.side * 7 / 8);
}

}  // namespace

void registerData(CLI::App& app, int& exitCode) {
    auto* data = app.add_subcommand(
        "data",
        "versioned data sets: add (snapshot by SHA-256), list, show, diff, checkout, rollback, verify");
    data->require_subcommand(1);

    auto add = std::make_shared<DataState>();
    auto* a =
        data->add_subcommand("add", "take a new version of data set NAME from PATH (a folder or a CSV file)");
    a->add_option("NAME", add->name, "data set name")->required();
    a->add_option("PATH", add->path, "an image folder, an IDX folder or a CSV file")->required();
    a->add_option("--kind", add->kind, "images, csv or idx (default: detected)");
    a->add_option("--message,-m", add->message, "what changed, kept with the version");
    a->add_option("--threads", add->threads, "hashing threads (default: one per core)")
        ->check(CLI::Range(0, 256));
    addCommonOptions(a, add->common);
    a->callback([add] { runAdd(*add); });

    auto list = std::make_shared<DataState>();
    auto* l = data->add_subcommand("list", "data sets and their current versions");
    addCommonOptions(l, list->common);
    l->callback([list] { runList(*list); });

    auto show = std::make_shared<DataState>();
    auto* s =
        data->add_subcommand("show", "a data set's versions (NAME), or one version's manifest (NAME:V)");
    s->add_option("REF", show->ref, "NAME or NAME:V")->required();
    addCommonOptions(s, show->common);
    s->callback([show] { runShow(*show); });

    auto diff = std::make_shared<DataState>();
    auto* d = data->add_subcommand("diff", "files added, removed and changed from version A to version B");
    d->add_option("A", diff->ref, "NAME:V")->required();
    d->add_option("B", diff->other, "NAME:V")->required();
    addCommonOptions(d, diff->common);
    d->callback([diff] { runDiff(*diff); });

    auto ex = std::make_shared<DataState>();
    auto* e = data->add_subcommand(
        "example",
        "write an example image folder (the built-in digits as JPEG and PNG files, a folder per class)");
    e->add_option("DIR", ex->dir, "a folder that does not exist or is empty")->required();
    e->add_option("--per-class", ex->perClass, "images of each digit, 1..170")->capture_default_str();
    e->add_option("--side", ex->side, "width and height in pixels, 8..4096")->capture_default_str();
    e->callback([ex] { runExample(*ex); });

    auto co = std::make_shared<DataState>();
    auto* c =
        data->add_subcommand("checkout", "write version V's files into DIR (new or empty), byte for byte");
    c->add_option("REF", co->ref, "NAME or NAME:V")->required();
    c->add_option("DIR", co->dir, "a folder that does not exist or is empty")->required();
    addCommonOptions(c, co->common, false);
    c->callback([co] { runCheckout(*co); });

    auto rb = std::make_shared<DataState>();
    auto* r = data->add_subcommand("rollback", "make the previous current version current again");
    r->add_option("NAME", rb->name, "data set name")->required();
    addCommonOptions(r, rb->common);
    r->callback([rb] { runRollback(*rb); });

    auto ver = std::make_shared<DataState>();
    auto* v = data->add_subcommand(
        "verify",
        "re-hash a version's stored files, and compare its folder (exit 1 when a stored file is bad)");
    v->add_option("REF", ver->ref, "NAME or NAME:V")->required();
    v->add_flag("--full", ver->full, "compare the folder by content, not sizes and mtimes");
    addCommonOptions(v, ver->common);
    v->callback([ver, &exitCode] { exitCode = runVerify(*ver); });

    auto lin = std::make_shared<DataState>();
    auto* g = app.add_subcommand(
        "lineage",
        "data set version -> run -> model version -> deployments of MODEL[:V], or what --data fed");
    g->add_option("REF", lin->ref, "MODEL, MODEL:V or MODEL@ALIAS; with --data: a data set NAME[:V]")
        ->required();
    auto* dataFlag =
        g->add_flag("--data", "REF is a data set version: the runs, models and deployments made from it");
    addCommonOptions(g, lin->common);
    g->callback([lin, dataFlag] { runLineage(*lin, dataFlag->count() > 0); });
}

}  // namespace lathe::cli
