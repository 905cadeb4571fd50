// The version of the lathectl beside the workbench (host_probe.h); the SSH work of the Hosts
// page is remote's (remote/src/inventory.cpp).
#include "lathe/widgets/host_probe.h"

#include <sys/wait.h>

#include <cstdio>

#include "lathe/core/error.h"
#include "lathe/core/executable.h"
#include "lathe/remote/sftp.h"

namespace lathe::widgets {

std::string lathectlVersion(const std::string& program) {
    const std::string path = program.empty() ? core::siblingProgram("lathectl") : program;
    const std::string command = remote::shellQuote(path) + " --version 2>/dev/null";
    std::FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) throw core::Error("cannot run " + path + " --version");
    std::string out;
    char buf[256];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0 && out.size() < 4096) out.append(buf, n);
    const int status = ::pclose(pipe);
    const std::string line = out.substr(0, out.find('\n'));
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || line.empty())
        throw core::Error(path + " --version did not answer (is it this build's lathectl?)");
    return line;
}

}  // namespace lathe::widgets
