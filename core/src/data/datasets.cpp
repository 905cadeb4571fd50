#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "data/raw.h"
#include "lathe/core/error.h"
#include "lathe/core/executable.h"

namespace fs = std::filesystem;

namespace lathe::core::data {

std::string readFileMaybeGz(const std::string& path, size_t maxBytes) {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw DataError("data file " + path + " does not exist");
    if (fs::is_directory(path, ec)) throw DataError("data file " + path + " is a directory");
    // gzread passes plain files through unchanged, so one reader serves both.
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) throw DataError("cannot open data file " + path + ": " + std::strerror(errno));
    gzbuffer(f, 1 << 17);
    std::string out;
    char buf[1 << 16];
    for (;;) {
        const int n = gzread(f, buf, sizeof buf);
        if (n < 0) {
            int errnum = 0;
            std::string msg = gzerror(f, &errnum);
            gzclose(f);
            throw DataError("data file " + path + " is corrupt: " + msg);
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
        if (out.size() > maxBytes) {
            gzclose(f);
            throw DataError("data file " + path + " is larger than " + std::to_string(maxBytes >> 20) +
                            " MiB");
        }
    }
    // A truncated .gz stream reads as a short file; zlib reports it only here.
    int errnum = 0;
    const char* msg = gzerror(f, &errnum);
    if (errnum != Z_OK && errnum != Z_STREAM_END) {
        std::string m = msg ? msg : "read error";
        gzclose(f);
        throw DataError("data file " + path + " is corrupt: " + m);
    }
    gzclose(f);
    return out;
}

RawSet makeSpirals(int64_t perClass, int64_t classes, uint64_t seed) {
    RawSet s;
    s.shape = {2};
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0.0, 0.2);
    for (int64_t c = 0; c < classes; ++c) {
        s.classNames.push_back("arm " + std::to_string(c));
        for (int64_t i = 0; i < perClass; ++i) {
            const double r = static_cast<double>(i) / static_cast<double>(perClass);
            const double t = c * 2.0 * M_PI / static_cast<double>(classes) + 4.0 * r + noise(rng) * 0.5;
            s.x.push_back(static_cast<float>(r * std::sin(t) * 2.0));
            s.x.push_back(static_cast<float>(r * std::cos(t) * 2.0));
            s.y.push_back(c);
        }
    }
    return s;
}

std::string findResource(const std::string& relative) {
    std::vector<fs::path> roots;
    if (const char* env = std::getenv("LATHE_RESOURCES"); env && *env) roots.emplace_back(env);
    try {
        roots.push_back(fs::path(executablePath()).parent_path().parent_path() / "share" / "lathe");
    } catch (const Error&) {
        // no /proc: the other roots still apply
    }
#ifdef LATHE_SOURCE_RESOURCES
    roots.emplace_back(LATHE_SOURCE_RESOURCES);
#endif
    std::string tried;
    for (const auto& r : roots) {
        const auto p = r / relative;
        std::error_code ec;
        if (fs::exists(p, ec)) return p.string();
        tried += (tried.empty() ? "" : ", ") + p.string();
    }
    throw DataError("built-in resource " + relative + " not found (looked in " + tried +
                    "); set LATHE_RESOURCES to the resources folder");
}

}  // namespace lathe::core::data

// ---- splitting ------------------------------------------------------------------------------
#include <algorithm>
#include <numeric>

#include "data/pipeline.h"
#include "lathe/core/datasets.h"
#include "lathe/core/run_spec.h"

namespace lathe::core::data {
namespace {

int64_t sampleSize(const RawSet& s) {
    return std::accumulate(s.shape.begin(), s.shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

RawSet take(const RawSet& s, const std::vector<int64_t>& idx) {
    RawSet out;
    out.shape = s.shape;
    out.classNames = s.classNames;
    const int64_t d = sampleSize(s);
    out.x.reserve(idx.size() * static_cast<size_t>(d));
    for (const auto i : idx) {
        const auto j = static_cast<size_t>(i);
        out.x.insert(out.x.end(), s.x.begin() + j * d, s.x.begin() + (j + 1) * d);
        out.y.push_back(s.y[j]);
    }
    return out;
}

void standardise(SplitSet& sp) {
    const int64_t d = sampleSize(sp.train);
    const int64_t n = sp.train.size();
    std::vector<double> mean(d, 0.0), var(d, 0.0);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < d; ++k) mean[k] += sp.train.x[i * d + k];
    for (auto& m : mean) m /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < d; ++k) {
            const double t = sp.train.x[i * d + k] - mean[k];
            var[k] += t * t;
        }
    sp.mean.assign(static_cast<size_t>(d), 0.0f);
    sp.stddev.assign(static_cast<size_t>(d), 1.0f);
    for (int64_t k = 0; k < d; ++k) {
        const double sd = std::sqrt(var[k] / static_cast<double>(n));
        sp.mean[k] = static_cast<float>(mean[k]);
        sp.stddev[k] = static_cast<float>(sd > 1e-12 ? sd : 1.0);
    }
    for (auto* set : {&sp.train, &sp.val}) {
        for (int64_t i = 0; i < set->size(); ++i)
            for (int64_t k = 0; k < d; ++k) {
                const double sd = std::sqrt(var[k] / static_cast<double>(n));
                auto& v = set->x[i * d + k];
                v = static_cast<float>((v - mean[k]) / (sd > 1e-12 ? sd : 1.0));
            }
    }
}

// Files parsed ahead by preloadData, kept for the life of the process: a study's fork server
// parses its data set once and every trial forked from it finds it here. Each is known by what
// was parsed (the file and how) and by the file's identity when it was, so a file changed since
// is parsed again. Written only before the process forks its trials (single-threaded).
struct Preloaded {
    std::string how;  // "digits", or "csv:" + the label column
    std::string path;
    std::string identity;
    RawSet set;
};
std::vector<Preloaded>& preloaded() {
    static std::vector<Preloaded> sets;
    return sets;
}

// Device, inode, size and modification time (ns): empty when the file cannot be looked at.
std::string fileIdentity(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return {};
    return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) +
           ":" + std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

const RawSet* findPreloaded(const std::string& how, const std::string& path) {
    for (const auto& p : preloaded())
        if (p.how == how && p.path == path) return p.identity == fileIdentity(path) ? &p.set : nullptr;
    return nullptr;
}

// What the spec's data set is parsed from, and how; false for those that are generated,
// streamed or resolved against a workspace.
bool parsedFile(const RunSpec& spec, std::string* how, std::string* path) {
    if (spec.data == "digits") {
        *how = "digits";
        *path = findResource("data/digits.csv.gz");
        return true;
    }
    if (spec.data.rfind("csv:", 0) == 0) {
        *how = "csv:" + spec.labelColumn;
        *path = spec.data.substr(4);
        return true;
    }
    return false;
}

RawSet parseFile(const std::string& how, const std::string& path, const RunSpec& spec) {
    if (how == "digits") return parseDigits(readFileMaybeGz(path, 64u << 20), path);
    return parseCsv(readFileMaybeGz(path), spec.labelColumn, path);
}

}  // namespace

bool preloadData(const RunSpec& spec) {
    std::string how, path;
    if (!parsedFile(spec, &how, &path) || findPreloaded(how, path)) return false;
    const auto identity = fileIdentity(path);
    if (identity.empty()) return false;  // missing: the run says so itself
    RawSet set = parseFile(how, path, spec);
    auto& sets = preloaded();
    sets.erase(std::remove_if(sets.begin(), sets.end(),
                              [&](const Preloaded& p) { return p.how == how && p.path == path; }),
               sets.end());
    sets.push_back({how, path, identity, std::move(set)});
    return true;
}

SplitSet loadSplit(const RunSpec& spec) {
    RawSet parsed;
    const RawSet* source = &parsed;
    const std::string& name = spec.data;
    std::string how, path;
    if (parsedFile(spec, &how, &path)) {
        if (const RawSet* kept = findPreloaded(how, path))
            source = kept;
        else
            parsed = parseFile(how, path, spec);
    } else if (name == "synthetic:spirals") {
        parsed = makeSpirals(500, 3, static_cast<uint64_t>(spec.seed));
    } else if (name.rfind("idx:", 0) == 0) {
        auto pair = readIdxDir(name.substr(4));
        if (pair.test.size() > 0) {
            SplitSet sp{std::move(pair.train), std::move(pair.test)};
            sp.val.classNames = sp.train.classNames;
            return sp;
        }
        parsed = std::move(pair.train);
    } else if (name.rfind("images:", 0) == 0) {
        // Read whole, as validation sees them (resize, centre crop, normalise): for evaluation
        // and export; training streams them through the loader instead (openSources).
        RunSpec plain = spec;
        plain.cacheMemoryMb = 0;
        plain.cacheDiskGb = 0;
        plain.cacheRedis.clear();
        const auto sources = openSources(plain, {});
        return SplitSet{readAll(*sources.train), readAll(*sources.val)};
    } else if (name.rfind("dataset:", 0) == 0) {
        // Resolved against a workspace first (bindDataSet): here it would be read from nowhere.
        throw ConfigError("data set " + name +
                          " is a versioned data set of a workspace: train it with --db WORKSPACE");
    } else {
        throw DataError(
            "unknown data set '" + name +
            "' (use digits, synthetic:spirals, csv:PATH, idx:DIR, images:DIR or dataset:NAME[:V])");
    }
    const auto n = static_cast<size_t>(source->size());
    if (n < 2)
        throw DataError("data set " + name + " has " + std::to_string(n) + " samples; at least 2 are needed");
    const auto split = splitIndices(source->size(), spec);
    SplitSet sp{take(*source, split.train), take(*source, split.val)};
    if (name.rfind("csv:", 0) == 0) standardise(sp);
    return sp;
}

}  // namespace lathe::core::data

namespace lathe::core {

DatasetSummary describeDataset(const RunSpec& spec) {
    const auto sp = data::loadSplit(spec);
    DatasetSummary s;
    s.name = spec.data;
    s.trainSize = sp.train.size();
    s.valSize = sp.val.size();
    s.sampleShape = sp.train.shape;
    s.classNames = sp.train.classNames;
    return s;
}

}  // namespace lathe::core
