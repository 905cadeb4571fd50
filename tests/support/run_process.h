#pragma once
// Runs a program through /bin/sh and captures its exit code, stdout and stderr.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace lathe::test {

struct ProcessResult {
    int exitCode = -1;
    std::string out;
    std::string err;
};

inline ProcessResult runShell(const std::string& command) {
    TempDir tmp;
    const std::string errFile = tmp.file("stderr");
    ProcessResult r;
    std::FILE* p = popen((command + " 2>" + errFile).c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.err = readFile(errFile);
    return r;
}

/// What a failed command said, for a test's INFO: its exit code and the ends of its stderr and
/// stdout (a `--json` command reports its error on stdout, not stderr).
inline std::string said(const ProcessResult& r, size_t most = 3000) {
    auto tail = [most](const std::string& s) {
        return s.size() > most ? "..." + s.substr(s.size() - most) : s;
    };
    return "exit " + std::to_string(r.exitCode) + "\nstderr: " + tail(r.err) + "\nstdout: " + tail(r.out);
}

inline std::string binPath(const std::string& program) { return std::string(LATHE_BIN_DIR) + "/" + program; }

/// The process ids (sorted) of the processes whose command line matches `pattern` (pgrep -f).
/// Write one character of it in brackets ("[w]orker") so it does not match the shell running pgrep.
inline std::vector<int> pidsMatching(const std::string& pattern) {
    const auto r = runShell("pgrep -f -- '" + pattern + "' || true");
    std::vector<int> pids;
    std::istringstream in(r.out);
    int pid;
    while (in >> pid) pids.push_back(pid);
    std::sort(pids.begin(), pids.end());
    return pids;
}

/// Worker processes of a local multi-process run, found by the config path only they have on
/// their command line.
inline std::vector<int> workerPids(const std::string& configPath) {
    return pidsMatching("[w]orker " + configPath);
}

}  // namespace lathe::test
