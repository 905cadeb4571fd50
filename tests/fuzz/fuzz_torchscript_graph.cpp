// Mutation fuzzing of the TorchScript model-graph reader (core/src/graph/torchscript_graph.cpp):
// a real TorchScript archive, damaged at random (truncated, bits flipped, bytes overwritten,
// chunks dropped or repeated, the zip's headers hit on purpose), is read in a forked child each
// time. The reader's promise: a graph or a ConfigError, never a crash, a hang or another
// exception. LibTorch's zip and pickle readers are compiled by Debian without coverage
// instrumentation, so this is a bounded random search (libFuzzer would have no coverage to
// steer by), seeded like the libFuzzer targets: random and printed, or LATHE_FUZZ_SEED.
// LibTorch 1.13's own loader crashes on some damaged archives (a segfault in
// ScriptTypeParser::parseClassConstant on corrupted code, depending on memory layout); each input
// is given to torch::jit::load alone in a child first, and a child of the reader that crashes
// with LibTorch's importer on its stack (found with backtrace/dladdr in its signal handler) is
// counted and reported as upstream too, not held against the reader. What programs do with such a
// file is then checked: readModelGraph reads TorchScript in a lathectl child, so it must come back
// as a ConfigError (the input is kept, as ARTIFACT_PREFIXupstream-N.pt, for replay).
//   fuzz_torchscript_graph SEED_MODEL.pt MAX_RUNS MAX_SECONDS ARTIFACT_PREFIX
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <torch/script.h>

#include "lathe/core/error.h"
#include "lathe/core/model_graph.h"
#include "lathe/core/torch_runtime.h"

using namespace lathe::core;

namespace {

std::string mutate(const std::string& seed, std::mt19937_64& rng, std::string& how) {
    std::string s = seed;
    auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
    // Offsets of the zip's local headers and central directory entries: damage there reaches
    // the archive reader's bookkeeping rather than a tensor's bytes.
    std::vector<size_t> headers;
    for (size_t p = s.find("PK"); p != std::string::npos; p = s.find("PK", p + 2)) headers.push_back(p);
    const int kinds = 1 + static_cast<int>(pick(3));
    std::ostringstream log;
    for (int k = 0; k < kinds; ++k) {
        switch (pick(6)) {
            case 0: {
                const size_t at = pick(s.size());
                log << "truncate@" << at << " ";
                s.resize(at);
                break;
            }
            case 1: {
                const int flips = 1 + static_cast<int>(pick(8));
                for (int i = 0; i < flips && !s.empty(); ++i)
                    s[pick(s.size())] ^= static_cast<char>(1 << pick(8));
                log << "flip" << flips << " ";
                break;
            }
            case 2: {
                if (headers.empty() || s.size() < 8) break;
                const size_t at = std::min(headers[pick(headers.size())] + pick(46), s.size() - 1);
                const size_t len = std::min<size_t>(1 + pick(8), s.size() - at);
                for (size_t i = 0; i < len; ++i) s[at + i] = static_cast<char>(rng());
                log << "header@" << at << "x" << len << " ";
                break;
            }
            case 3: {
                if (s.size() < 2) break;
                const size_t at = pick(s.size()), len = std::min(1 + pick(256), s.size() - at);
                s.erase(at, len);
                log << "erase@" << at << "x" << len << " ";
                break;
            }
            case 4: {
                if (s.empty()) break;
                const size_t at = pick(s.size()), len = std::min(1 + pick(512), s.size() - at);
                s.insert(at, s.substr(at, len));
                log << "repeat@" << at << "x" << len << " ";
                break;
            }
            default: {
                const size_t at = pick(s.size() + 1);
                const size_t len = 1 + pick(64);
                std::string junk(len, '\0');
                for (auto& c : junk) c = static_cast<char>(rng());
                s.replace(at, std::min(len, s.size() - at), junk);
                log << "overwrite@" << at << "x" << len << " ";
            }
        }
    }
    how = log.str();
    return s;
}

// In a child that crashed: was LibTorch's importer (torch::jit::import_ir_module, under
// torch::jit::load) on the stack? Then the crash is upstream's; exit 20 to say so.
void onCrash(int sig) {
    void* frames[128];
    const int n = backtrace(frames, 128);
    for (int i = 0; i < n; ++i) {
        Dl_info info;
        if (dladdr(frames[i], &info) && info.dli_sname && std::strstr(info.dli_sname, "import_ir_module"))
            _exit(20);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

}  // namespace

// A file that crashes LibTorch's loader: what programs do with it. readModelGraph reads
// TorchScript in a child (`lathectl graph --in-process`, beside this harness), so the crash must
// come back as a ConfigError, not end the caller. The input is kept for replay (it is rare: about
// one in several thousand inputs).
static bool isolatedRefuses(const std::string& path, const std::string& input, const std::string& keep) {
    std::ofstream(keep, std::ios::binary) << input;
    try {
        (void)readModelGraph(path);
        std::printf("fuzz: LibTorch crashed on %s alone, but it read as a graph in lathectl\n", keep.c_str());
    } catch (const ConfigError& ex) {
        std::printf("fuzz: LibTorch crashed on %s; readModelGraph: %s\n", keep.c_str(), ex.what());
    } catch (const std::exception& ex) {
        std::fprintf(stderr,
                     "fuzz: FAILED: readModelGraph on %s threw something other than ConfigError: %s\n",
                     keep.c_str(), ex.what());
        return false;
    }
    return true;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s SEED_MODEL.pt MAX_RUNS MAX_SECONDS ARTIFACT_PREFIX\n", argv[0]);
        return 2;
    }
    std::ifstream in(argv[1], std::ios::binary);
    const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (seed.empty()) {
        std::fprintf(stderr, "fuzz: cannot read the seed model %s\n", argv[1]);
        return 2;
    }
    const long maxRuns = std::atol(argv[2]);
    const double maxSeconds = std::atof(argv[3]);
    const std::string prefix = argv[4];
    uint64_t rngSeed = 0;
    const char* env = std::getenv("LATHE_FUZZ_SEED");
    const bool given = env && *env;
    if (given)
        rngSeed = std::strtoull(env, nullptr, 10);
    else
        rngSeed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
    std::printf(
        "fuzz: fuzz_torchscript_graph with seed %llu (%s; replay with LATHE_FUZZ_SEED=%llu), at most %ld "
        "inputs or %.0f s\n",
        static_cast<unsigned long long>(rngSeed), given ? "from LATHE_FUZZ_SEED" : "random",
        static_cast<unsigned long long>(rngSeed), maxRuns, maxSeconds);
    std::fflush(stdout);
    loadTorchRuntime();  // once, before forking: each child starts with LibTorch loaded
    // The undamaged model must read, or the harness tests nothing.
    try {
        (void)readTorchScriptGraph(argv[1]);
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "fuzz: the seed model does not read: %s\n", ex.what());
        return 2;
    }
    char dirTemplate[] = "/tmp/lathe-fuzz-ts-XXXXXX";
    const char* dir = mkdtemp(dirTemplate);
    if (!dir) return 2;
    const std::string path = std::string(dir) + "/input.pt";
    std::mt19937_64 rng(rngSeed);
    const auto start = std::chrono::steady_clock::now();
    long runs = 0, refused = 0, read = 0, upstream = 0;
    int status = 0;
    for (; runs < maxRuns; ++runs) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > maxSeconds)
            break;
        std::string how;
        const std::string input = mutate(seed, rng, how);
        {
            std::ofstream out(path, std::ios::binary | std::ios::trunc);
            out << input;
        }
        // LibTorch's loader alone first: a crash there is upstream's.
        const pid_t loader = fork();
        if (loader == 0) {
            try {
                (void)torch::jit::load(path);
            } catch (...) {
            }
            _exit(0);
        }
        int loaded = 0;
        waitpid(loader, &loaded, 0);
        if (!WIFEXITED(loaded)) {
            ++upstream;
            if (!isolatedRefuses(path, input, prefix + "upstream-" + std::to_string(runs) + ".pt")) return 1;
            continue;
        }
        const pid_t pid = fork();
        if (pid == 0) {
            signal(SIGSEGV, onCrash);
            signal(SIGBUS, onCrash);
            signal(SIGFPE, onCrash);
            try {
                (void)readTorchScriptGraph(path);
                _exit(0);
            } catch (const ConfigError&) {
                _exit(10);
            } catch (const std::exception& ex) {
                std::fprintf(stderr, "fuzz: not a ConfigError: %s\n", ex.what());
                _exit(11);
            } catch (...) {
                _exit(12);
            }
        }
        // A child that takes over 30 s on a 100 KB file hangs.
        const auto t0 = std::chrono::steady_clock::now();
        pid_t done = 0;
        while ((done = waitpid(pid, &status, WNOHANG)) == 0) {
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > 30) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                status = -1;
                break;
            }
            usleep(200);
        }
        if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 20) {
            ++upstream;  // crashed inside LibTorch's importer
            if (!isolatedRefuses(path, input, prefix + "upstream-" + std::to_string(runs) + ".pt")) return 1;
            continue;
        }
        const bool ok =
            status != -1 && WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 10);
        if (!ok) {
            const std::string keep = prefix + std::to_string(runs) + ".pt";
            std::ofstream(keep, std::ios::binary) << input;
            std::fprintf(
                stderr,
                "fuzz: FAILED on input %ld (%s): %s; kept as %s; replay the run with LATHE_FUZZ_SEED=%llu\n",
                runs, how.c_str(),
                status == -1                ? "hung"
                : WIFSIGNALED(status)       ? strsignal(WTERMSIG(status))
                : WEXITSTATUS(status) == 11 ? "threw something other than ConfigError"
                                            : "exited oddly",
                keep.c_str(), static_cast<unsigned long long>(rngSeed));
            std::remove(path.c_str());
            rmdir(dir);
            return 1;
        }
        (WEXITSTATUS(status) == 10 ? refused : read)++;
    }
    std::remove(path.c_str());
    rmdir(dir);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "fuzz: Done %ld runs in %.0f second(s): %ld refused with a ConfigError, %ld read as graphs, %ld that "
        "crashed LibTorch's own torch::jit::load (upstream; not counted against the reader)\n",
        runs, secs, refused, read, upstream);
    return runs > 0 ? 0 : 1;
}
