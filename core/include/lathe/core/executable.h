#pragma once
// Where this program is, the programs installed beside it, and running one of them to its end
// with its output captured (executable.cpp).
#include <cstddef>
#include <string>
#include <vector>

namespace lathe::core {

/// The absolute path of the running program (/proc/self/exe). Throws Error when it cannot be read.
std::string executablePath();

/// `name` (e.g. "lathectl") when this program is it, else the file of that name beside this
/// program. Throws Error naming both when there is none.
std::string siblingProgram(const std::string& name);

/// How a child run by runProgram ended, and what it wrote.
struct ProgramResult {
    int exitCode = -1;      // its exit status; -1 when a signal ended it or it was stopped
    int signal = 0;         // the signal that ended it (SIGSEGV, SIGABRT, …), else 0
    bool timedOut = false;  // it ran past the time limit and was killed (SIGKILL)
    std::string out, err;   // its stdout and stderr (each cut at the limit given, the rest read and dropped)
};

/// Runs `program` with `args` (argv[1…]; the environment is this process's, stdin /dev/null) and
/// waits for it, at most `timeoutS` seconds before killing it. Safe to call from any thread of
/// a multi-threaded program (posix_spawn, no fork). Throws Error when it cannot be started.
ProgramResult runProgram(const std::string& program, const std::vector<std::string>& args, double timeoutS,
                         size_t maxOutputBytes = size_t(1) << 30);

/// "SIGSEGV (segmentation fault)", "signal 42".
std::string signalName(int signal);

}  // namespace lathe::core
